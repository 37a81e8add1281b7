package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestBackendCaps: a user granted every tenant cannot take the node's
// connections (issue 17, item 7). Mallory's sessions use at most
// --max-user-backends backends at once, and past it get 53300 with a hint
// while bob goes on; the proxy never has more than --max-node-backends
// open on the node, across tenants, closing idle ones of other tenants to
// make room, and refuses with 53300 and a hint when every one is in use.
func TestBackendCaps(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// One more tenant than the node has room for.
	dbs := []string{"lattice_caps_a", "lattice_caps_b", "lattice_caps_c", "lattice_caps_d"}
	admin := connect(t, testNodeDSN(t, 0))
	drop := func() {
		for _, db := range dbs {
			admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
		}
	}
	drop()
	t.Cleanup(drop)
	for _, db := range dbs {
		mustExec(t, admin, "CREATE DATABASE "+db)
	}
	users := filepath.Join(t.TempDir(), "users")
	lines := runLattice(t, "passwd mallory *", "mallory-pw") + runLattice(t, "passwd bob "+dbs[1], "bob-pw") +
		runLattice(t, "passwd carol "+dbs[2], "carol-pw")
	if err := os.WriteFile(users, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	const userCap, nodeCap = 2, 3
	p := startProxy(t, 1, "--users-file", users, "--max-user-backends", fmt.Sprint(userCap),
		"--max-node-backends", fmt.Sprint(nodeCap), "--pool-acquire-timeout", "300ms")
	dsn := func(user, db string) string {
		return fmt.Sprintf("postgres://%s:%s-pw@%s/%s?sslmode=disable", user, user, p.Addr, db)
	}
	// open is what the proxy holds open on the node now, idle or in use.
	open := func() int {
		n := 0.0
		fams := scrape(t, p)
		for _, name := range []string{"lattice_pool_backends_in_use", "lattice_pool_backends_idle"} {
			for _, m := range fams[name].GetMetric() {
				n += m.GetGauge().GetValue()
			}
		}
		return int(n)
	}
	refused := func(err error, flag string) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == "53300" && strings.Contains(pe.Message, flag) && pe.Hint != ""
	}

	// Bob is granted one tenant: another is refused at startup, and leaves
	// no pool behind.
	if _, err := pgx.Connect(ctx, dsn("bob", dbs[0])); pgCode(err) != "28000" {
		t.Fatalf("bob to a tenant not granted: %v, want 28000", err)
	}
	for _, m := range scrape(t, p)["lattice_pool_backends_idle"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "tenant" && l.GetValue() == dbs[0] {
				t.Fatalf("a pool of %s for bob, who is not granted it", dbs[0])
			}
		}
	}

	// Mallory visits every tenant: each leaves an idle backend, and the
	// node never holds more than the cap of them.
	for _, db := range dbs {
		c := connect(t, dsn("mallory", db))
		mustExec(t, c, "SELECT 1")
		c.Close(ctx)
		if n := open(); n > nodeCap {
			t.Fatalf("after mallory's visit to %s: %d backends open on the node, cap %d", db, n, nodeCap)
		}
	}

	// Mallory at her cap: two transactions hold a backend each; her third
	// session's statement is refused, bob's are not.
	var held []*pgx.Conn
	for i := 0; i < userCap+1; i++ {
		held = append(held, connect(t, dsn("mallory", dbs[0])))
	}
	for _, c := range held[:userCap] {
		mustExec(t, c, "BEGIN")
		mustExec(t, c, "SELECT 1")
	}
	if _, err := held[userCap].Exec(ctx, "SELECT 1"); !refused(err, "--max-user-backends") {
		t.Fatalf("mallory's statement past her cap: %v, want 53300 naming --max-user-backends, with a hint", err)
	}
	bob := connect(t, dsn("bob", dbs[1]))
	mustExec(t, bob, "SELECT 1")

	// Bob takes the rest of the node; then nobody gets a new backend there,
	// with a clear error, until one is given back.
	mustExec(t, bob, "BEGIN")
	mustExec(t, bob, "SELECT 1")
	if n := open(); n != nodeCap {
		t.Fatalf("%d backends open on the node, want all %d in use", n, nodeCap)
	}
	if _, err := pgx.Connect(ctx, dsn("carol", dbs[2])); !refused(err, "--max-node-backends") {
		t.Fatalf("a new tenant's backend on a node whose backends are all in use: %v, want 53300 naming --max-node-backends, with a hint", err)
	}
	// A backend given back makes room, though it is another tenant's.
	mustExec(t, bob, "COMMIT")
	carol := connect(t, dsn("carol", dbs[2]))
	mustExec(t, carol, "SELECT 1")
	if n := open(); n > nodeCap {
		t.Fatalf("%d backends open on the node, cap %d", n, nodeCap)
	}
}
