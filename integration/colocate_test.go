package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/shardmap"
)

// coGroups maps each tree of lattice_trees() to its colocation group.
func coGroups(t *testing.T, ctx context.Context, c *pgx.Conn) map[string]string {
	t.Helper()
	rows, err := c.Query(ctx, `SELECT tree, coalesce(colocation_group, '') FROM lattice_trees()`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var tree, group string
		if err := rows.Scan(&tree, &group); err != nil {
			t.Fatal(err)
		}
		out[tree] = group
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// coPlacement maps each key of table on the nodes to "node/schema" of the
// shard table that holds it.
func coPlacement(t *testing.T, ctx context.Context, nodes []*pgx.Conn, table, key string) map[int64]string {
	t.Helper()
	out := map[int64]string{}
	for i, n := range nodes {
		schemas, err := queryStrings(t, n, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = $1 AND c.relkind = 'r' AND n.nspname LIKE 'lattice\_s%'`, table)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range schemas {
			rows, err := n.Query(ctx, fmt.Sprintf(`SELECT DISTINCT %s::int8 FROM %s`, key, pgx.Identifier{s, table}.Sanitize()))
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var k int64
				if err := rows.Scan(&k); err != nil {
					t.Fatal(err)
				}
				if prev, dup := out[k]; dup {
					t.Fatalf("%s key %d is on %s and n%d/%s", table, k, prev, i+1, s)
				}
				out[k] = fmt.Sprintf("n%d/%s", i+1, s)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}

// TestColocationGroups creates a group of three trees with keys of
// different integer widths, checks that rows of equal keys share node and
// schema, that the functions and the admin API show the group, the
// refusals, and that the group outlives the tree it is named after until
// its last member is dropped.
func TestColocationGroups(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2) // may build the binary first: the deadline starts after it
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	nodes := []*pgx.Conn{connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1))}

	mustExec(t, c, `CREATE TABLE customers (customer_id bigint PRIMARY KEY, name text)`)
	mustExec(t, c, `CREATE TABLE orders (customer_id int, order_id int, total int, PRIMARY KEY (customer_id, order_id))`)
	mustExec(t, c, `CREATE TABLE order_items (customer_id smallint, order_id int, item int, amount int, PRIMARY KEY (customer_id, order_id, item))`)
	// The rows are there before the tables become trees: creation places them.
	mustExec(t, c, `INSERT INTO customers SELECT i, 'c' || i FROM generate_series(0, 299) i`)
	mustExec(t, c, `INSERT INTO orders SELECT i % 300, i, 10 FROM generate_series(1, 600) i`)
	mustExec(t, c, `INSERT INTO order_items SELECT i % 300, i, 1, 10 FROM generate_series(1, 600) i`)
	mustExec(t, c, `SELECT lattice_create_tree('customers', 'customer_id', shard_count => 6)`)
	mustExec(t, c, `SELECT lattice_create_tree('orders', 'customer_id', colocate_with => 'customers')`)
	mustExec(t, c, `SELECT lattice_create_tree('order_items', 'customer_id', colocate_with => 'orders')`)

	if got, want := coGroups(t, ctx, c), map[string]string{"customers": "customers", "orders": "customers", "order_items": "customers"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("lattice_trees groups %v, want %v", got, want)
	}
	var shards, groupRows int
	if err := c.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE colocation_group = 'customers') FROM lattice_shards('order_items')`).Scan(&shards, &groupRows); err != nil || shards != 6 || groupRows != 6 {
		t.Fatalf("lattice_shards(order_items): %d shards, %d in the group, %v", shards, groupRows, err)
	}
	cust := coPlacement(t, ctx, nodes, "customers", "customer_id")
	for _, table := range []string{"orders", "order_items"} {
		got := coPlacement(t, ctx, nodes, table, "customer_id")
		if len(got) != 300 {
			t.Errorf("%s: %d keys on the shards, want 300", table, len(got))
		}
		for k, at := range got {
			if cust[k] != at {
				t.Fatalf("key %d: %s is on %s, customers on %s", k, table, at, cust[k])
			}
		}
	}
	// The group's trees join on the key: on one shard with the key fixed,
	// over every shard without it; on another column they are refused.
	var name string
	var orders int
	if err := c.QueryRow(ctx, `SELECT c.name, count(*) FROM customers c JOIN orders o USING (customer_id) WHERE c.customer_id = 7 GROUP BY c.name`).Scan(&name, &orders); err != nil || name != "c7" || orders != 2 {
		t.Fatalf("join with the key fixed: %q, %d orders, %v; want c7, 2", name, orders, err)
	}
	rows, err := c.Query(ctx, `SELECT o.order_id, c.name, i.amount FROM customers c JOIN orders o ON o.customer_id = c.customer_id
		JOIN order_items i ON i.customer_id = o.customer_id AND i.order_id = o.order_id ORDER BY o.order_id`)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for rows.Next() {
		var id, amount int
		if err := rows.Scan(&id, &name, &amount); err != nil {
			t.Fatal(err)
		}
		if seen++; id != seen || name != fmt.Sprintf("c%d", seen%300) || amount != 10 {
			t.Fatalf("join over every shard, row %d: order %d of %s, amount %d", seen, id, name, amount)
		}
	}
	if err := rows.Err(); err != nil || seen != 600 {
		t.Fatalf("join over every shard: %d rows, %v; want 600", seen, err)
	}
	if _, err := c.Exec(ctx, `SELECT * FROM customers c JOIN orders o ON o.total = c.customer_id`); sqlStateOf(err) != "0A000" {
		t.Fatalf("a join off the key: %v, want 0A000", err)
	}

	var apiTrees []struct {
		Name  string `json:"name"`
		Group string `json:"group"`
	}
	adminGet(t, ctx, p, "/api/trees", &apiTrees)
	for _, tr := range apiTrees {
		if tr.Group != "customers" {
			t.Errorf("admin API: tree %s in group %q, want customers", tr.Name, tr.Group)
		}
	}

	mustExec(t, c, `CREATE TABLE tagged (tag text PRIMARY KEY)`)
	mustExec(t, c, `CREATE TABLE ids (id uuid PRIMARY KEY)`)
	mustExec(t, c, `CREATE TABLE wide (customer_id int PRIMARY KEY)`)
	refusals := []struct {
		name, sql, code, has string
	}{
		{"text key with an int group", `SELECT lattice_create_tree('tagged', 'tag', colocate_with => 'customers')`, "42804", "does not hash like"},
		{"uuid key with an int group", `SELECT lattice_create_tree('ids', 'id', colocate_with => 'orders')`, "42804", "does not hash like"},
		{"another slot count", `SELECT lattice_create_tree('wide', 'customer_id', slot_count => 1024, colocate_with => 'customers')`, "42804", "slot count 1024"},
		{"another shard count", `SELECT lattice_create_tree('wide', 'customer_id', shard_count => 4, colocate_with => 'customers')`, "22023", "differs from the 6 shards"},
		{"no such tree", `SELECT lattice_create_tree('wide', 'customer_id', colocate_with => 'nosuch')`, "42P01", "colocate_with"},
	}
	for _, r := range refusals {
		_, err := c.Exec(ctx, r.sql)
		if pgCode(err) != r.code || err == nil || !strings.Contains(err.Error(), r.has) {
			t.Errorf("%s: %v, want %s with %q", r.name, err, r.code, r.has)
		}
	}
	if got := coGroups(t, ctx, c); len(got) != 3 {
		t.Fatalf("a refused tree was registered: %v", got)
	}

	// The group outlives the tree it is named after, keeps taking members,
	// and goes with its last member.
	mustExec(t, c, `DROP TABLE customers`)
	if _, err := c.Exec(ctx, `CREATE TABLE customers (customer_id bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `SELECT lattice_create_tree('customers', 'customer_id')`); pgCode(err) != "42P07" {
		t.Fatalf("a tree took the name of a live group: %v", err)
	}
	mustExec(t, c, `SELECT lattice_create_tree('wide', 'customer_id', colocate_with => 'orders')`)
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM order_items WHERE customer_id = 7`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("order_items of customer 7 after the first tree's drop: %d, %v", n, err)
	}
	mustExec(t, c, `DROP TABLE orders`)
	mustExec(t, c, `DROP TABLE order_items`)
	if got := coGroups(t, ctx, c); got["wide"] != "customers" {
		t.Fatalf("the last member left its group: %v", got)
	}
	mustExec(t, c, `DROP TABLE wide`)
	mustExec(t, c, `SELECT lattice_create_tree('customers', 'customer_id', shard_count => 2)`)
	if got := coGroups(t, ctx, c); fmt.Sprint(got) != "map[customers:]" {
		t.Fatalf("after the last member's drop: %v", got)
	}
}

// TestRecoverMapGroup rebuilds a colocation group whose first tree was
// dropped, after Redis lost everything while a move of the group's shard 0
// had fenced its member tables (the coordinator's proxy killed in the
// freeze): the members come back in one group under its name, with one
// map at an epoch above the lost one, the move finished for every member
// (shard 0 of each on the new node only), every row served.
func TestRecoverMapGroup(t *testing.T) {
	fc := startFaultCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// No coordinator: the move runs in a, which dies in its freeze.
	p := fc.proxy(t, nil, "--coordinator=false")
	a := fc.proxy(t, []string{"LATTICE_TEST_CRASH_AT=freeze"}, "--reshard-tick", "200ms")
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE customers (customer_id bigint PRIMARY KEY)`)
	mustExec(t, c, `CREATE TABLE orders (customer_id int, order_id int, PRIMARY KEY (customer_id, order_id))`)
	mustExec(t, c, `CREATE TABLE order_items (customer_id bigint, order_id int, item int, PRIMARY KEY (customer_id, order_id, item))`)
	mustExec(t, c, `INSERT INTO orders SELECT i % 200, i FROM generate_series(1, 400) i`)
	mustExec(t, c, `INSERT INTO order_items SELECT i % 200, i, 1 FROM generate_series(1, 400) i`)
	mustExec(t, c, `SELECT lattice_create_tree('customers', 'customer_id', shard_count => 5)`)
	mustExec(t, c, `SELECT lattice_create_tree('orders', 'customer_id', colocate_with => 'customers')`)
	mustExec(t, c, `SELECT lattice_create_tree('order_items', 'customer_id', colocate_with => 'customers')`)
	mustExec(t, c, `DROP TABLE customers`)
	tr, before, err := fc.shardMap(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	from := before.Shards[0].Node
	// A customer off the moving shard: statements for it are not held.
	still := -1
	for k := 0; still < 0 && k < 200; k++ {
		slot, err := shardmap.SlotForText(tr.KeyType, []byte(strconv.Itoa(k)), tr.SlotCount)
		if err != nil {
			t.Fatal(err)
		}
		if before.Owner(slot).Index != 0 {
			still = k
		}
	}
	to := map[string]string{"n1": "n2", "n2": "n1"}[from]
	ac := connect(t, a.DSN("lattice"))
	mustExec(t, ac, `SELECT lattice_move_shard('order_items', 0, $1)`, to)
	if !a.WaitExit(60 * time.Second) {
		t.Fatal("the coordinator's proxy did not reach crash point freeze")
	}
	if err := a.crashedAt("freeze"); err != nil {
		t.Fatal(err)
	}

	fc.flushRedis(t, ctx)
	pool := proxyPool(t, ctx, p)
	// Of a customer whose slot is not frozen (a statement over the frozen
	// slots would wait for a newer map).
	pollUntil(t, 30*time.Second, "the proxy to refuse orders with LT002", func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM orders WHERE customer_id = $1", still).Scan(&n)
		switch {
		case sqlState(err) == "LT002":
			return true, nil
		case err == nil && n == 2:
			return false, nil // served from the maps cached before the flush
		case err == nil:
			return false, fmt.Errorf("orders of customer %d = %d after the flush, want 2 or LT002", still, n)
		}
		return false, err
	})
	out := fc.recoverMap(t, ctx)
	for _, name := range []string{"orders", "order_items"} {
		if !strings.Contains(out, "lattice/"+name+": rebuilt at epoch") {
			t.Errorf("recover-map did not report %s rebuilt", name)
		}
	}
	if strings.Count(out, "finished migrations") != 2 {
		t.Errorf("recover-map did not finish the move for both members:\n%s", out)
	}
	pollUntil(t, 30*time.Second, "the proxy to serve the recovered group", func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM order_items").Scan(&n)
		if sqlState(err) == "LT002" {
			return false, nil
		}
		return err == nil && n == 400, err
	})
	if got := coGroups(t, ctx, c); fmt.Sprint(got) != "map[order_items:customers orders:customers]" {
		t.Fatalf("groups after recovery: %v", got)
	}
	for _, name := range []string{"orders", "order_items"} {
		tr, m, err := fc.shardMap(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Group != "customers" || m.Epoch <= before.Epoch || !slicesEqual(m.Slots, before.Slots) || m.Shards[0].Node != to {
			t.Errorf("%s after recovery: group %q, epoch %d (before %d), same slots %v, shard 0 on %s (moved to %s)",
				name, tr.Group, m.Epoch, before.Epoch, slicesEqual(m.Slots, before.Slots), m.Shards[0].Node, to)
		}
		for i := range fc.nodes {
			node := fmt.Sprintf("n%d", i+1)
			conn := connect(t, fc.nodeDSN(i))
			var has bool
			if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", "lattice_s0000."+name).Scan(&has); err != nil {
				t.Fatal(err)
			}
			if has != (node == to) {
				t.Errorf("node %s has shard 0 of %s: %v, want it only on %s", node, name, has, to)
			}
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE customer_id = 7`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("orders of customer 7 after recovery: %d, %v", n, err)
	}
}
