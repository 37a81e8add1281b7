package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestTenantIsolation: with a users file granting each user one tenant, a
// user can neither connect to another tenant's database nor see or touch
// its trees, its shard schemas or its catalog, even where both tenants
// have a tree of the same name.
func TestTenantIsolation(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const nodes = 3
	tenants := []string{"lattice_tenant_a", "lattice_tenant_b"}
	for i := 0; i < nodes; i++ {
		admin := connect(t, testNodeDSN(t, i))
		for _, db := range tenants {
			mustExec(t, admin, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
			mustExec(t, admin, "CREATE DATABASE "+db)
		}
	}
	t.Cleanup(func() {
		for i := 0; i < nodes; i++ {
			c, err := pgx.Connect(context.Background(), testNodeDSN(t, i))
			if err != nil {
				continue
			}
			for _, db := range tenants {
				c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
			}
			c.Close(context.Background())
		}
	})
	users := filepath.Join(t.TempDir(), "users")
	lines := runLattice(t, "passwd alice lattice_tenant_a", "alice-pw") + runLattice(t, "passwd bob lattice_tenant_b", "bob-pw")
	if err := os.WriteFile(users, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, nodes, "--users-file", users)
	dsn := func(user, password, db string) string {
		return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", user, password, p.Addr, db)
	}
	alice := connect(t, dsn("alice", "alice-pw", "lattice_tenant_a"))
	bob := connect(t, dsn("bob", "bob-pw", "lattice_tenant_b"))

	// Both tenants have a tree "orders" (same name, same shard schema
	// names); only b has "secrets".
	for _, s := range []struct {
		c    *pgx.Conn
		rows int
	}{{alice, 10}, {bob, 25}} {
		mustExec(t, s.c, `CREATE TABLE orders (id bigint PRIMARY KEY, note text)`)
		mustExec(t, s.c, fmt.Sprintf(`INSERT INTO orders SELECT i, 'n' || i FROM generate_series(1, %d) i`, s.rows))
		mustExec(t, s.c, `SELECT lattice_create_tree('orders', 'id', shard_count => 4)`)
	}
	mustExec(t, bob, `CREATE TABLE secrets (id bigint PRIMARY KEY, v text)`)
	mustExec(t, bob, `INSERT INTO secrets VALUES (1, 'b only')`)
	mustExec(t, bob, `SELECT lattice_create_tree('secrets', 'id', shard_count => 4)`)
	schemas, err := column(ctx, bob, `SELECT * FROM lattice_shards('secrets')`, 2)
	if err != nil || len(schemas) == 0 || !strings.HasPrefix(schemas[0], "lattice_s") {
		t.Fatalf("lattice_shards as bob: %v, %v", schemas, err)
	}
	secretSchema := schemas[0]

	t.Run("connect", func(t *testing.T) {
		tests := []struct {
			user, password, db string
			code               string // "" for success
		}{
			{"alice", "alice-pw", "lattice_tenant_a", ""},
			{"alice", "alice-pw", "lattice_tenant_b", "28000"},
			{"alice", "alice-pw", "lattice", "28000"},
			{"bob", "bob-pw", "lattice_tenant_a", "28000"},
			{"bob", "alice-pw", "lattice_tenant_b", "28P01"},
		}
		for _, tt := range tests {
			c, err := pgx.Connect(ctx, dsn(tt.user, tt.password, tt.db))
			if err == nil {
				c.Close(ctx)
			}
			if got := pgCode(err); got != tt.code {
				t.Errorf("%s to %s: %v (SQLSTATE %q), want %q", tt.user, tt.db, err, got, tt.code)
			}
		}
	})

	// What alice runs in her own tenant: b's objects are neither visible
	// nor reachable by name.
	tests := []struct {
		name string
		sql  string
		want string // the result as text, or "ERROR <SQLSTATE>"
	}{
		{"lattice_trees lists only her trees", `SELECT * FROM lattice_trees()`, "orders"},
		{"her orders, not b's", `SELECT count(*) FROM orders`, "10"},
		{"b's tree by name", `SELECT count(*) FROM secrets`, "ERROR 42P01"},
		{"b's tree in a write", `INSERT INTO secrets VALUES (2, 'x')`, "ERROR 42P01"},
		{"b's shard schema by name", `SELECT count(*) FROM ` + secretSchema + `.secrets`, "ERROR"},
		{"b's tree in lattice_shards", `SELECT * FROM lattice_shards('secrets')`, "ERROR"},
		{"b's tree in lattice_reshard", `SELECT lattice_reshard('secrets', 2)`, "ERROR"},
		{"catalog: pg_class", `SELECT count(*) FROM pg_class WHERE relname = 'secrets'`, "0"},
		{"catalog: information_schema", `SELECT count(*) FROM information_schema.tables WHERE table_name = 'secrets'`, "0"},
		{"catalog: databases she may not use are another tenant's", `SELECT current_database()`, "lattice_tenant_a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got string
			vals, err := column(ctx, alice, tt.sql, 0)
			switch {
			case err != nil && pgCode(err) != "":
				got = "ERROR " + pgCode(err)
			case err != nil:
				t.Fatal(err)
			default:
				got = strings.Join(vals, ",")
			}
			if got != tt.want && !(tt.want == "ERROR" && strings.HasPrefix(got, "ERROR ")) {
				t.Errorf("%s: %s, want %s", tt.sql, got, tt.want)
			}
		})
	}

	// b's data is intact and b sees its own.
	var n int
	if err := bob.QueryRow(ctx, `SELECT count(*) FROM secrets`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("bob's secrets: %d, %v", n, err)
	}
	if err := bob.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 25 {
		t.Fatalf("bob's orders: %d, %v", n, err)
	}
}

// column runs sql and returns column i of every row as text.
func column(ctx context.Context, c *pgx.Conn, sql string, i int) ([]string, error) {
	rows, err := c.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		if i >= len(vals) {
			return nil, fmt.Errorf("%s: %d columns", sql, len(vals))
		}
		out = append(out, fmt.Sprint(vals[i]))
	}
	return out, rows.Err()
}

// TestSplitToNodeWithoutTenantDatabase reshards a one-shard tree of a new
// tenant on two nodes: the tree's only shard is on n1, so the split's
// target goes to n2, where the tenant has no database yet. The split must
// create it (as lattice_create_tree does) and the reshard complete, with
// every row on its owner.
func TestSplitToNodeWithoutTenantDatabase(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const tenant = "lattice_split_tenant"
	drop := func() {
		for i := 0; i < 2; i++ {
			c, err := pgx.Connect(context.Background(), testNodeDSN(t, i))
			if err != nil {
				t.Fatal(err)
			}
			mustExec(t, c, "DROP DATABASE IF EXISTS "+tenant+" WITH (FORCE)")
			c.Close(context.Background())
		}
	}
	drop()
	t.Cleanup(drop) // after the proxy's cleanup, which is registered later
	mustExec(t, connect(t, testNodeDSN(t, 0)), "CREATE DATABASE "+tenant)

	p := startProxy(t, 2)
	c := connect(t, p.DSN(tenant))
	mustExec(t, c, `CREATE TABLE acc (id int PRIMARY KEY, v int NOT NULL)`)
	mustExec(t, c, `INSERT INTO acc SELECT i, i FROM generate_series(1, 300) i`)
	mustExec(t, c, `SELECT lattice_create_tree('acc', 'id', shard_count => 1)`)
	if nodes, err := column(ctx, c, `SELECT * FROM lattice_shards('acc')`, 1); err != nil || strings.Join(nodes, ",") != "n1" {
		t.Fatalf("shards before the split on nodes %v (%v), want n1 only", nodes, err)
	}
	mustExec(t, c, `SELECT lattice_reshard('acc', 2)`)
	pollUntil(t, 90*time.Second, "the split of acc onto n2 to complete", func() (bool, error) {
		var done bool
		err := c.QueryRow(ctx, "SELECT lattice_reshard_complete('acc')").Scan(&done)
		return done, err
	})
	nodes, err := column(ctx, c, `SELECT * FROM lattice_shards('acc')`, 1)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(nodes, ",") != "n1,n2" {
		t.Fatalf("shards after the split on nodes %v, want n1,n2", nodes)
	}
	var n, sum int64
	if err := c.QueryRow(ctx, `SELECT count(*), sum(v) FROM acc`).Scan(&n, &sum); err != nil || n != 300 || sum != 45150 {
		t.Fatalf("after the split: %d rows, sum %d (%v), want 300 rows, sum 45150", n, sum, err)
	}
	// The target's rows are on n2, in the tenant's database there.
	var onN2 int64
	if err := connect(t, testNode(t, 1).DSN(tenant)).QueryRow(ctx, `SELECT count(*) FROM lattice_s0001.acc`).Scan(&onN2); err != nil || onN2 == 0 || onN2 == 300 {
		t.Fatalf("the split's target on n2 holds %d rows (%v), want some but not all", onN2, err)
	}
}
