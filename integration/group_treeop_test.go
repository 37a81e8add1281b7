package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// groupSums is what the test compares of a tree: its rows, and sums that
// change if any row changes or moves to another tree's copy.
func groupSums(t *testing.T, ctx context.Context, c *pgx.Conn, tree string) [3]int64 {
	t.Helper()
	var s [3]int64
	if err := c.QueryRow(ctx, "SELECT count(*), coalesce(sum(customer_id), 0), coalesce(sum(total), 0) FROM "+tree).Scan(&s[0], &s[1], &s[2]); err != nil {
		t.Fatalf("sums of %s: %v", tree, err)
	}
	return s
}

// TestGroupSnapshotAndResize: the tree operations on a colocation group's
// member that is not the tree the group is named after. A snapshot of
// orders is a tree of its own with every row of orders. A resize of orders
// rewrites the whole group, every member's shards; while it runs,
// lattice_resize_status of another member reports it, a resize of another
// member with another layout and a reshard of the group are refused
// (55000), lattice_resize_complete of another member is false, and a tree
// that joins the group between the resize's migrations gets the layout too.
// Rows of equal keys stay together.
func TestGroupSnapshotAndResize(t *testing.T) {
	resetNodes(t)
	hold := filepath.Join(t.TempDir(), "rewrite")
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProxyEnv(t, 3, []string{"LATTICE_TEST_HOLD_AT=resize_rewrite:" + hold}, "--reshard-tick", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE customers (customer_id bigint PRIMARY KEY, name text, total int)`)
	mustExec(t, c, `CREATE TABLE orders (customer_id int, order_id int, total int, PRIMARY KEY (customer_id, order_id))`)
	mustExec(t, c, `CREATE TABLE items (customer_id int, item int, total int, PRIMARY KEY (customer_id, item))`)
	mustExec(t, c, `INSERT INTO customers SELECT i, 'c' || i, i % 7 FROM generate_series(0, 299) i`)
	mustExec(t, c, `INSERT INTO orders SELECT i % 300, i, i % 11 FROM generate_series(1, 600) i`)
	mustExec(t, c, `INSERT INTO items SELECT i % 300, i, 1 FROM generate_series(1, 300) i`)
	mustExec(t, c, `SELECT lattice_create_tree('customers', 'customer_id', shard_count => 3)`)
	mustExec(t, c, `SELECT lattice_create_tree('orders', 'customer_id', colocate_with => 'customers')`)

	// The snapshot of a member is a tree of its own.
	mustExec(t, c, "SELECT lattice_snapshot('orders', 'orders_snap')")
	pollUntil(t, 2*time.Minute, "the snapshot of orders", func() (bool, error) {
		var done bool
		err := c.QueryRow(ctx, "SELECT lattice_snapshot_complete('orders_snap')").Scan(&done)
		return done, err
	})
	if got, want := groupSums(t, ctx, c, "orders_snap"), groupSums(t, ctx, c, "orders"); got != want || got[0] != 600 {
		t.Fatalf("orders_snap has rows and sums %v, orders %v", got, want)
	}
	if g := coGroups(t, ctx, c); g["orders_snap"] != "" || g["orders"] != "customers" {
		t.Fatalf("groups after the snapshot: %v; want orders_snap alone, orders in customers", g)
	}

	// A resize of a member is its group's.
	var msg string
	if err := c.QueryRow(ctx, "SELECT lattice_resize('orders', fillfactor => 60)").Scan(&msg); err != nil {
		t.Fatal(err)
	}
	waitReached(t, hold)
	var tree, phase string
	var done, total, flying int
	var eta *float64
	if err := c.QueryRow(ctx, "SELECT tree, phase, shards_done, shards_total, migrations_in_flight, eta_seconds FROM lattice_resize_status('customers')").
		Scan(&tree, &phase, &done, &total, &flying, &eta); err != nil {
		t.Fatal(err)
	}
	if tree != "orders" || phase != "rewrite" || done != 0 || total != 3 || flying != 0 || eta != nil {
		t.Errorf("lattice_resize_status(customers): %s %s, %d of %d shards, %d in flight, ETA %v; want orders rewrite, 0 of 3, 0, NULL",
			tree, phase, done, total, flying, eta)
	}
	if _, err := c.Exec(ctx, "SELECT lattice_resize('customers', fillfactor => 70)"); sqlState(err) != "55000" {
		t.Errorf("a resize of another member with another layout: %v, want 55000", err)
	}
	if err := c.QueryRow(ctx, "SELECT lattice_resize('customers', fillfactor => 60)").Scan(&msg); err != nil || !strings.Contains(msg, "already running") {
		t.Errorf("the same layout on another member: %q, %v; want the running one", msg, err)
	}
	if _, err := c.Exec(ctx, "SELECT lattice_reshard('customers', 4)"); sqlState(err) != "55000" || !strings.Contains(err.Error(), "resize") {
		t.Errorf("a reshard of the group during the resize: %v, want 55000", err)
	}
	var complete bool
	if err := c.QueryRow(ctx, "SELECT lattice_resize_complete('customers')").Scan(&complete); err != nil || complete {
		t.Errorf("lattice_resize_complete(customers) while the group's resize runs: %v, %v", complete, err)
	}
	// No migration is in flight yet, so a tree may join the group now.
	mustExec(t, c, `SELECT lattice_create_tree('items', 'customer_id', colocate_with => 'orders')`)
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 2*time.Minute, "the resize of the group", func() (bool, error) {
		err := c.QueryRow(ctx, "SELECT lattice_resize_complete('orders')").Scan(&complete)
		return complete, err
	})

	for _, member := range []string{"customers", "orders", "items"} {
		checkLayout(t, ctx, member, []string{"fillfactor=60"}, []string{})
		noShardTablesBeyond(t, ctx, member)
	}
	if err := c.QueryRow(ctx, "SELECT phase, eta_seconds FROM lattice_resize_status('items')").Scan(&phase, &eta); err != nil || phase != "idle" || eta == nil || *eta != 0 {
		t.Errorf("lattice_resize_status(items) after the resize: %q, ETA %v, %v; want idle, 0", phase, eta, err)
	}
	want := map[string]int64{"customers": 300, "orders": 600, "items": 300}
	for member, n := range want {
		if s := groupSums(t, ctx, c, member); s[0] != n {
			t.Errorf("%s has %d rows after the resize, want %d", member, s[0], n)
		}
	}
	nodes := []*pgx.Conn{connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1)), connect(t, testNodeDSN(t, 2))}
	cust := coPlacement(t, ctx, nodes, "customers", "customer_id")
	for _, member := range []string{"orders", "items"} {
		for k, at := range coPlacement(t, ctx, nodes, member, "customer_id") {
			if cust[k] != at {
				t.Fatalf("key %d: %s is on %s, customers on %s", k, member, at, cust[k])
			}
		}
	}
	noShadowLeft(t, ctx)
}
