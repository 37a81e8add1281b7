package integration

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/lattice-db/lattice/pgshard"
)

// TestLibPqSuite runs lib/pq's own tests (its root package) on plain
// PostgreSQL and through the proxy over ordinary tables, as TestPgxSuite
// runs pgx's, and fails on a test that fails only through the proxy unless
// testdata/pq-pooling.txt says why no transaction-pooling proxy passes it.
// The suite takes seconds, so it runs with every make test. It found the
// startup-parameter, syntax-error-position and lost-listener differences
// this file's history fixed.
func TestLibPqSuite(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "20")
	connect(t, p.DSN("lattice")) // the first session of the tenant makes its role
	role := pgshard.TenantRole("lattice")
	// The second run sends every parameter in binary (binary_parameters=yes).
	for _, binary := range []bool{false, true} {
		t.Run(fmt.Sprintf("binary_parameters=%v", binary), func(t *testing.T) {
			pq := driverSuite{
				module: "github.com/lib/pq", short: "pq", pkgs: []string{"."},
				env: func(dsn string) []string {
					env := libpqEnv(t, dsn)
					if binary {
						env = append(env, "PQTEST_BINARY_PARAMETERS=1")
					}
					return env
				},
				known: "pq-pooling.txt", timeout: 10 * time.Minute,
			}
			pq.compare(t, asUser(t, testNodeDSN(t, 0), role), asUser(t, p.DSN("lattice"), role))
		})
	}
}

// libpqEnv is the PG* environment that points lib/pq's tests at dsn.
func libpqEnv(t *testing.T, dsn string) []string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return []string{"PGHOST=" + u.Hostname(), "PGPORT=" + u.Port(), "PGUSER=" + u.User.Username(),
		"PGDATABASE=" + u.Path[1:], "PGSSLMODE=disable"}
}
