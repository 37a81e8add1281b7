package pgshard

import (
	"strings"
	"testing"
)

func TestSplitPassword(t *testing.T) {
	for _, tc := range []struct {
		dsn, clean, password string
		secret               bool
	}{
		{"postgres://lattice@h:5432/db?sslmode=disable", "postgres://lattice@h:5432/db?sslmode=disable", "", false},
		{"postgres://lattice:s3cret@h:5432/db", "postgres://lattice@h:5432/db", "s3cret", true},
		{"postgresql://lattice:@h/db", "postgresql://lattice@h/db", "", true},
		{"postgres://lattice@h/db?password=x&sslmode=disable", "postgres://lattice@h/db?sslmode=disable", "x", true},
		{"postgres://lattice@h/db?sslpassword=k", "postgres://lattice@h/db", "", true},
		{"host=h user=lattice dbname=db", "host=h user=lattice dbname=db", "", false},
		{`host=h password='a\'b c' user=u`, "host='h' user='u'", "a'b c", true},
		{"host=h password=plain", "host='h'", "plain", true},
	} {
		clean, pw, secret, err := SplitPassword(tc.dsn)
		if err != nil {
			t.Errorf("SplitPassword(%q): %v", tc.dsn, err)
			continue
		}
		if clean != tc.clean || pw != tc.password || secret != tc.secret {
			t.Errorf("SplitPassword(%q) = %q, %q, %v; want %q, %q, %v", tc.dsn, clean, pw, secret, tc.clean, tc.password, tc.secret)
		}
		if strings.Contains(clean, "s3cret") || strings.Contains(clean, "plain") {
			t.Errorf("SplitPassword(%q) left the password in %q", tc.dsn, clean)
		}
	}
}

func TestConnStringCredentials(t *testing.T) {
	c, err := NewCluster([]Node{
		{Name: "n1", DSN: "postgres://lattice@h1:5432/shop"},
		{Name: "n2", DSN: "postgres://lattice@h2:5432/shop", Password: "flagpw"},
		{Name: "n3", DSN: "host=h3 user=lattice dbname=shop"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetPassfile("/etc/lattice/pgpass")
	for _, tc := range []struct{ node, want string }{
		{"n1", "postgres://lattice@h1:5432/t1?passfile=%2Fetc%2Flattice%2Fpgpass"},
		{"n2", "postgres://lattice@h2:5432/t1?password=flagpw"},
		{"n3", "host=h3 user=lattice dbname=shop dbname='t1' passfile='/etc/lattice/pgpass'"},
	} {
		got, err := c.TenantDSN(tc.node, "t1")
		if err != nil || got != tc.want {
			t.Errorf("TenantDSN(%s) = %q, %v; want %q", tc.node, got, err, tc.want)
		}
	}
}

func TestSetNodes(t *testing.T) {
	c, err := NewCluster([]Node{{Name: "n1", DSN: "postgres://u@h1/db"}, {Name: "n2", DSN: "postgres://u@h2/db"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	changed := c.Changed()
	gone, err := c.SetNodes([]Node{{Name: "n1", DSN: "postgres://u@h1/db"}, {Name: "n3", DSN: "postgres://u@h3/db"}})
	if err != nil || strings.Join(gone, ",") != "n2" {
		t.Fatalf("SetNodes = %v, %v; want n2 gone", gone, err)
	}
	select {
	case <-changed:
	default:
		t.Fatal("Changed not closed by a change")
	}
	if got := strings.Join(c.NodeNames(), ","); got != "n1,n3" {
		t.Fatalf("NodeNames = %s", got)
	}
	if _, err := c.TenantDSN("n2", "db"); err == nil {
		t.Fatal("a removed node still resolves")
	}
	if _, err := c.SetNodes([]Node{{Name: "n3", DSN: "postgres://u@h3/db"}, {Name: "n1", DSN: "postgres://u@h1/db"}}); err == nil {
		t.Fatal("SetNodes moved the catalog role")
	}
	unchanged := c.Changed()
	if _, err := c.SetNodes(c.Nodes()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-unchanged:
		t.Fatal("Changed closed without a change")
	default:
	}
}
