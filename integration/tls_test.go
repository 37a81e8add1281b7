package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/localnode"
)

// testCerts writes a fresh CA and a certificate for 127.0.0.1 and localhost
// into a temp dir.
func testCerts(t *testing.T) (cert, key, ca string) {
	t.Helper()
	authority, err := localnode.NewTestCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, key, ca, err = authority.WriteFiles(t.TempDir(), "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	return cert, key, ca
}

// tlsDSN is p's DSN for database lattice with another sslmode.
func tlsDSN(p *proxyProc, mode string) string {
	return strings.Replace(p.DSN("lattice"), "sslmode=disable", mode, 1)
}

// TestClientTLS connects psql and pgx to a proxy with a certificate, in
// the sslmodes an operator uses, and checks that each connection really is
// TLS (not only that a query answers: the proxy would answer either way).
func TestClientTLS(t *testing.T) {
	resetNodes(t)
	cert, key, ca := testCerts(t)
	p := startProxy(t, 2, "--tls-cert", cert, "--tls-key", key)
	req := startProxy(t, 2, "--tls-cert", cert, "--tls-key", key, "--tls-required")
	setup := connect(t, tlsDSN(p, "sslmode=require"))
	setupCatalogue(t, setup, 50)

	tests := []struct {
		name    string
		proxy   *proxyProc
		mode    string
		wantTLS bool
		code    string // SQLSTATE of a refused connection
	}{
		{"require", p, "sslmode=require", true, ""},
		{"verify-full against the test CA", p, "sslmode=verify-full&sslrootcert=" + ca, true, ""},
		{"disable", p, "sslmode=disable", false, ""},
		{"required: require", req, "sslmode=require", true, ""},
		{"required: verify-full", req, "sslmode=verify-full&sslrootcert=" + ca, true, ""},
		{"required: disable is refused", req, "sslmode=disable", false, "28000"},
	}
	for _, tt := range tests {
		t.Run("pgx "+tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c, err := pgx.Connect(ctx, tlsDSN(tt.proxy, tt.mode))
			if tt.code != "" {
				if pgCode(err) != tt.code || !strings.Contains(fmt.Sprint(err), "TLS required") {
					t.Fatalf("connect: %v, want SQLSTATE %s and \"TLS required\"", err, tt.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			if _, isTLS := c.PgConn().Conn().(*tls.Conn); isTLS != tt.wantTLS {
				t.Fatalf("connection is TLS: %v, want %v", isTLS, tt.wantTLS)
			}
			// A query that reads a tree through the encrypted session: a
			// fan-out and a single-shard read.
			var n int
			if err := c.QueryRow(ctx, `SELECT count(*) FROM catalogue`).Scan(&n); err != nil || n != 50 {
				t.Fatalf("count: %d, %v", n, err)
			}
			var name string
			if err := c.QueryRow(ctx, `SELECT name FROM catalogue WHERE sku = $1`, "sku7").Scan(&name); err != nil || name != "item 7" {
				t.Fatalf("point read: %q, %v", name, err)
			}
		})
		t.Run("psql "+tt.name, func(t *testing.T) {
			out, err := exec.Command("psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", tlsDSN(tt.proxy, tt.mode),
				"-c", `\conninfo`, "-c", "SELECT count(*) AS n FROM catalogue").CombinedOutput()
			if tt.code != "" {
				if err == nil || !strings.Contains(string(out), "TLS required") {
					t.Fatalf("psql connected or failed otherwise: %v\n%s", err, out)
				}
				return
			}
			if err != nil {
				t.Fatalf("psql: %v\n%s", err, out)
			}
			// psql's \conninfo reports libpq's own view of the connection.
			if got := strings.Contains(string(out), "SSL connection (protocol: TLSv1."); got != tt.wantTLS {
				t.Fatalf("psql reports SSL: %v, want %v\n%s", got, tt.wantTLS, out)
			}
			if !strings.Contains(string(out), " 50\n") {
				t.Fatalf("psql count: %s", out)
			}
		})
	}
}

// TestBackendTLS runs the proxy against a node whose DSN asks for TLS
// (sslmode=require) and checks on that node that every backend connection
// of the proxy is encrypted.
func TestBackendTLS(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	authority, err := localnode.NewTestCA()
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := authority.Issue("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	node, err := localnode.StartPostgres(ctx, filepath.Join(harness.dir, "tls-"+sanitize(t.Name())), "ntls",
		localnode.PostgresOptions{Fast: true, TLSCert: certPEM, TLSKey: keyPEM})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Stop() })
	nodeDSN := strings.Replace(node.DSN(localnode.DefaultDatabase), "sslmode=disable", "sslmode=require", 1)

	p := startProxy(t, 1, "--node", "n2="+nodeDSN)
	c := connect(t, p.DSN("lattice"))
	setupCatalogue(t, c, 200)
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM catalogue`).Scan(&n); err != nil || n != 200 {
		t.Fatalf("count: %d, %v", n, err)
	}
	// Keys on every shard: some land on the TLS node.
	for i := 1; i <= 40; i++ {
		mustExec(t, c, `UPDATE catalogue SET qty = qty + 1 WHERE sku = $1`, fmt.Sprintf("sku%d", i))
	}
	if err := c.QueryRow(ctx, `SELECT sum(qty) FROM catalogue`).Scan(&n); err != nil || n != 200*201/2+40 {
		t.Fatalf("sum: %d, %v", n, err)
	}

	// The check runs on the node itself, over a plain connection that it
	// leaves out.
	direct := connect(t, node.DSN(localnode.DefaultDatabase))
	var total, encrypted int
	if err := direct.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE s.ssl)
		FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()`).Scan(&total, &encrypted); err != nil {
		t.Fatal(err)
	}
	if total == 0 || encrypted != total {
		t.Fatalf("%d of the proxy's %d connections to the TLS node use TLS", encrypted, total)
	}
	var shards int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'lattice\_s%'`).Scan(&shards); err != nil || shards == 0 {
		t.Fatalf("no shard on the TLS node (%d, %v): the test reads nothing through TLS", shards, err)
	}
}
