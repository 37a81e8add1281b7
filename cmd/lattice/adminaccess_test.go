package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lattice-db/lattice/admin"
)

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAdminAccess(t *testing.T) {
	tokenFile := writeFile(t, "token", "  0123456789abcdef0123456789abcdef\n")
	short := writeFile(t, "short", "abc\n")
	tests := []struct {
		name, admin, tokenFile, env, cert, key string
		wantToken                              string
		err                                    string
	}{
		{name: "loopback without token", admin: "127.0.0.1:9090"},
		{name: "localhost without token", admin: "localhost:9090"},
		{name: "non-loopback without token", admin: "0.0.0.0:9090", err: "is not a loopback address and no admin token"},
		{name: "non-loopback with a token file", admin: "0.0.0.0:9090", tokenFile: tokenFile, wantToken: "0123456789abcdef0123456789abcdef"},
		{name: "non-loopback with the token in the environment", admin: "10.0.0.5:9090", env: "env-token-env-token-env-token", wantToken: "env-token-env-token-env-token"},
		{name: "the file wins over the environment", admin: "127.0.0.1:9090", tokenFile: tokenFile, env: "env-token-env-token-env-token", wantToken: "0123456789abcdef0123456789abcdef"},
		{name: "short token", admin: "127.0.0.1:9090", tokenFile: short, err: "shorter than 16"},
		{name: "missing token file", admin: "127.0.0.1:9090", tokenFile: "/nonexistent/token", err: "no such file"},
		{name: "TLS cert without key", admin: "127.0.0.1:9090", cert: "c.pem", err: "give both --admin-tls-cert and --admin-tls-key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv(adminTokenEnv, tc.env)
			}
			a, _, err := adminAccess(serveConfig{Admin: tc.admin, AdminTokenFile: tc.tokenFile, AdminTLSCert: tc.cert, AdminTLSKey: tc.key})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if a.Token != tc.wantToken {
				t.Errorf("token %q, want %q", a.Token, tc.wantToken)
			}
			if _, still := os.LookupEnv(adminTokenEnv); still {
				t.Errorf("%s is still in the environment", adminTokenEnv)
			}
		})
	}
}

func TestLoadRedisURL(t *testing.T) {
	file := writeFile(t, "redis", "redis://:pw@127.0.0.1:6379/0\n")
	if u, err := loadRedisURL("", file); err != nil || u != "redis://:pw@127.0.0.1:6379/0" {
		t.Errorf("from a file: %q %v", u, err)
	}
	t.Setenv(redisURLEnv, "redis://:pw@h:1/0")
	if u, err := loadRedisURL("", ""); err != nil || u != "redis://:pw@h:1/0" {
		t.Errorf("from the environment: %q %v", u, err)
	}
	if _, err := loadRedisURL("redis://a:1/0", file); err == nil {
		t.Error("--redis and --redis-url-file together were accepted")
	}
}

func TestNodesFile(t *testing.T) {
	file := writeFile(t, "nodes", "# the cluster\nn1=postgres://u:pw@h1/db\n\nn2 = host=h2 user=u password=pw dbname=db\n")
	var nodes nodeFlags
	if err := nodesFile(file, &nodes); err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || nodes[0].Name != "n1" || nodes[1].DSN != "host=h2 user=u password=pw dbname=db" {
		t.Errorf("nodes %+v", nodes)
	}
	bad := writeFile(t, "bad", "n1 postgres://u:s3cret@h1/db\n")
	if err := nodesFile(bad, &nodes); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("a bad line: %v", err)
	}
}

// TestCLISendsToken: the commands send $LATTICE_ADMIN_TOKEN as a bearer
// token, and say what to do when the proxy wants one.
func TestCLISendsToken(t *testing.T) {
	const token = "cli-token-cli-token-cli-token"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		w.Write([]byte(`{"proxy":{"id":"p1"}}`))
	}))
	defer srv.Close()
	var st admin.Status
	api, err := newAPIClient(srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := api.do(t.Context(), "GET", "/api/status", nil, nil, &st); err == nil || !strings.Contains(err.Error(), "--admin-token-file") {
		t.Errorf("without a token: %v, want a hint that names --admin-token-file", err)
	}
	t.Setenv(adminTokenEnv, token)
	if api, err = newAPIClient(srv.URL, ""); err != nil {
		t.Fatal(err)
	}
	if err := api.do(t.Context(), "GET", "/api/status", nil, nil, &st); err != nil || st.Proxy.ID != "p1" {
		t.Errorf("with the token: %+v %v", st, err)
	}
}
