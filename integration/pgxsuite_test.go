package integration

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/lattice-db/lattice/pgshard"
)

// TestPgxSuite runs pgx's own tests (its root package, pgconn, pgtype and
// pgxpool) on plain PostgreSQL and through the proxy over ordinary tables,
// and fails on a test that fails only through the proxy, unless
// testdata/pgx-pooling.txt lists it as one no transaction-pooling proxy can
// pass, with the reason. Both runs use the tenant's role, as the proxy runs
// every client session as that role: a test that needs more (a superuser,
// pg_terminate_backend) fails on both, and objects one run leaves behind
// belong to the role the other run drops them as. Opt-in, as it takes many
// minutes:
//
//	LATTICE_PGX_SUITE=1 go test -count=1 -timeout 60m -run TestPgxSuite ./integration
//
// LATTICE_PGX_SUITE_RUN narrows it with a -run pattern.
func TestPgxSuite(t *testing.T) {
	if os.Getenv("LATTICE_PGX_SUITE") != "1" {
		t.Skip("set LATTICE_PGX_SUITE=1 to run pgx's test suite through the proxy")
	}
	resetNodes(t)
	ctx := context.Background()
	direct := connect(t, testNodeDSN(t, 0))
	for _, q := range []string{
		`CREATE EXTENSION IF NOT EXISTS hstore`,
		`CREATE EXTENSION IF NOT EXISTS ltree`,
		`DO $$ BEGIN CREATE DOMAIN uint64 AS numeric(20,0); EXCEPTION WHEN duplicate_object THEN NULL; END $$`,
		`DO $$ BEGIN CREATE USER " tricky, ' } "" \\ test user " SUPERUSER; EXCEPTION WHEN duplicate_object THEN NULL; END $$`,
	} {
		if _, err := direct.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	p := startProxy(t, 1, "--pool-size", "40")
	// The first session of the tenant makes its role.
	connect(t, p.DSN("lattice"))
	role := pgshard.TenantRole("lattice")
	pgx := driverSuite{
		module: "github.com/jackc/pgx/v5", short: "pgx",
		pkgs:  []string{".", "./pgconn", "./pgtype", "./pgxpool"},
		env:   func(dsn string) []string { return []string{"PGX_TEST_DATABASE=" + dsn} },
		known: "pgx-pooling.txt", run: os.Getenv("LATTICE_PGX_SUITE_RUN"), timeout: 25 * time.Minute,
	}
	pgx.compare(t, asUser(t, testNodeDSN(t, 0), role), asUser(t, p.DSN("lattice"), role))
}
