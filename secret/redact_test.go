package secret

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	tests := []struct{ in, want string }{
		{"redis://:s3cret@127.0.0.1:6379/0", "redis://:xxxxx@127.0.0.1:6379/0"},
		{"redis://user:s3cret@host:6379/0", "redis://user:xxxxx@host:6379/0"},
		{"redis://host:6379/0", "redis://host:6379/0"},
		{"postgres://lattice@127.0.0.1:5432/lattice?sslmode=disable", "postgres://lattice@127.0.0.1:5432/lattice?sslmode=disable"},
		{"postgres://u:p%40ss@h:5432/db", "postgres://u:xxxxx@h:5432/db"},
		{"postgres://u@h/db?password=s3cret&sslmode=disable", "postgres://u@h/db?password=xxxxx&sslmode=disable"},
		{"redis-sentinel://:s3cret@h1:26379,h2:26379/mymaster", "redis-sentinel://:xxxxx@h1:26379,h2:26379/mymaster"},
		{`parse "redis://:s3cret@host:6379/0%zz": invalid URL escape "%zz"`, `parse "redis://:xxxxx@host:6379/0%zz": invalid URL escape "%zz"`},
		{"host=h user=u password=s3cret dbname=d", "host=h user=u password=xxxxx dbname=d"},
		{"host=h password='s3 cr\\'et' dbname=d", "host=h password=xxxxx dbname=d"},
		{"sslpassword=s3cret", "sslpassword=xxxxx"},
		{"no secrets here", "no secrets here"},
	}
	for _, tc := range tests {
		if got := Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(Redact(tc.in), "s3") {
			t.Errorf("Redact(%q) leaves the password", tc.in)
		}
	}
}

func TestError(t *testing.T) {
	_, err := url.Parse("redis://:s3cret@host:6379/0%zz")
	e := Error(err)
	if strings.Contains(e.Error(), "s3cret") {
		t.Errorf("Error(%v) = %q", err, e)
	}
	var ue *url.Error
	if !errors.As(e, &ue) {
		t.Error("the url.Error is no longer behind the redacted one")
	}
	if Error(nil) != nil {
		t.Error("Error(nil) != nil")
	}
}
