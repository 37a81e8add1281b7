package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fkShardConstraints counts, over the nodes, the foreign keys of shard
// tables, and those whose referenced table is neither in the referencing
// table's own shard schema nor the reference table plans.
func fkShardConstraints(t *testing.T, ctx context.Context, nodes []*pgx.Conn) (total, astray int) {
	t.Helper()
	for _, n := range nodes {
		var a, b int
		if err := n.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE pc.relnamespace <> c.relnamespace AND (pn.nspname, pc.relname) <> ('public', 'plans'))
FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace ns ON ns.oid = c.relnamespace
JOIN pg_class pc ON pc.oid = con.confrelid JOIN pg_namespace pn ON pn.oid = pc.relnamespace
WHERE con.contype = 'f' AND ns.nspname LIKE 'lattice\_s%'`).Scan(&a, &b); err != nil {
			t.Fatal(err)
		}
		total, astray = total+a, astray+b
	}
	return total, astray
}

// fkEnforced checks, through the proxy, that the group's foreign keys hold
// on every shard: orphans and deletes of referenced rows fail with 23503,
// a declared cascade deletes, and the rows are all there.
func fkEnforced(t *testing.T, ctx context.Context, c *pgx.Conn, nodes []*pgx.Conn, shards int, round int) {
	t.Helper()
	refused := []struct{ name, sql string }{
		{"an item of no order", fmt.Sprintf(`INSERT INTO order_items VALUES (%d, 999999, 1, 1)`, 5+round)},
		{"an order of no customer", `INSERT INTO orders VALUES (100000, 1, 1)`},
		{"a customer of no plan", `INSERT INTO customers VALUES (100000, 99)`},
		{"an order that has items", fmt.Sprintf(`DELETE FROM orders WHERE customer_id = %d`, 11+round)},
		{"a plan that has customers", `DELETE FROM plans WHERE plan_id = 2`},
	}
	for _, r := range refused {
		if _, err := c.Exec(ctx, r.sql); sqlStateOf(err) != "23503" {
			t.Errorf("round %d, %s: %v, want 23503", round, r.name, err)
		}
	}
	// A customer with an order of no items goes with it (ON DELETE CASCADE).
	id := 5000 + round
	mustExec(t, c, fmt.Sprintf(`INSERT INTO customers VALUES (%d, 1)`, id))
	mustExec(t, c, fmt.Sprintf(`INSERT INTO orders VALUES (%d, 1, 5)`, id))
	mustExec(t, c, fmt.Sprintf(`DELETE FROM customers WHERE customer_id = %d`, id))
	var left int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM orders WHERE customer_id = $1`, id).Scan(&left); err != nil || left != 0 {
		t.Errorf("round %d: %d orders of a deleted customer, %v; want the cascade", round, left, err)
	}
	for table, want := range map[string]int{"customers": 200, "orders": 400, "order_items": 400} {
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != want {
			t.Errorf("round %d: %d rows in %s, %v; want %d", round, n, table, err, want)
		}
	}
	if total, astray := fkShardConstraints(t, ctx, nodes); total != 3*shards || astray != 0 {
		t.Errorf("round %d: %d foreign keys on the shard tables (%d astray), want %d", round, total, astray, 3*shards)
	}
}

// fkCluster starts a proxy over two nodes with plans, a reference table of
// three plans, for the foreign-key tests: a context bounded by timeout, a
// connection and a pool through the proxy, and a connection to each node.
func fkCluster(t *testing.T, timeout time.Duration) (context.Context, *pgx.Conn, *pgxpool.Pool, []*pgx.Conn) {
	t.Helper()
	resetNodes(t)
	p := startProxy(t, 2, "--reshard-tick", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	c := connect(t, p.DSN("lattice"))
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, q := range []string{
		`CREATE TABLE plans (plan_id int PRIMARY KEY, name text)`,
		`INSERT INTO plans VALUES (1, 'free'), (2, 'pro'), (3, 'team')`,
		`SELECT lattice_create_reference_table('plans')`,
	} {
		mustExec(t, c, q)
	}
	return ctx, c, pool, []*pgx.Conn{connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1))}
}

// TestForeignKeys adds foreign keys between the trees of a colocation
// group and to a reference table through the proxy, checks that every
// shard enforces them, reshards the group 4 -> 8 -> 4 with rows (the
// member referenced sorts after the one referencing it, so new shards
// must be built in reference order) and checks again, with the keys on
// the shards the reshard made. Forms that cannot be enforced are refused
// with a hint.
func TestForeignKeys(t *testing.T) {
	ctx, c, pool, nodes := fkCluster(t, 5*time.Minute)
	for _, q := range []string{
		`CREATE TABLE customers (customer_id bigint PRIMARY KEY, plan_id int NOT NULL)`,
		`CREATE TABLE orders (customer_id bigint, order_id int, total int, PRIMARY KEY (customer_id, order_id))`,
		`CREATE TABLE order_items (customer_id bigint, order_id int, item int, amount int, PRIMARY KEY (customer_id, order_id, item))`,
		`INSERT INTO customers SELECT i, 1 + i % 3 FROM generate_series(0, 199) i`,
		`INSERT INTO orders SELECT i % 200, i, 10 FROM generate_series(0, 399) i`,
		`INSERT INTO order_items SELECT i % 200, i, 1, 10 FROM generate_series(0, 399) i`,
		`SELECT lattice_create_tree('customers', 'customer_id', shard_count => 4)`,
		`SELECT lattice_create_tree('orders', 'customer_id', colocate_with => 'customers')`,
		`SELECT lattice_create_tree('order_items', 'customer_id', colocate_with => 'customers')`,
		`ALTER TABLE customers ADD CONSTRAINT customers_plan FOREIGN KEY (plan_id) REFERENCES plans (plan_id)`,
		`ALTER TABLE orders ADD FOREIGN KEY (customer_id) REFERENCES customers (customer_id) ON DELETE CASCADE`,
		`ALTER TABLE order_items ADD CONSTRAINT items_order FOREIGN KEY (customer_id, order_id) REFERENCES orders (customer_id, order_id)`,
	} {
		mustExec(t, c, q)
	}
	fkEnforced(t, ctx, c, nodes, 4, 0)

	refusals := []struct{ name, sql, has string }{
		{"keys not paired", `ALTER TABLE order_items ADD FOREIGN KEY (order_id) REFERENCES customers (customer_id)`, "FOREIGN KEY (customer_id, ...)"},
		{"referenced columns unnamed", `ALTER TABLE order_items ADD FOREIGN KEY (customer_id) REFERENCES customers`, "Name the referenced columns"},
		{"an ordinary table", `ALTER TABLE orders ADD FOREIGN KEY (total) REFERENCES loose (id)`, "lattice_create_reference_table"},
		{"a tree of another group", `ALTER TABLE orders ADD FOREIGN KEY (customer_id) REFERENCES lone (customer_id)`, "colocate_with"},
		{"SET NULL", `ALTER TABLE orders ADD FOREIGN KEY (customer_id) REFERENCES customers (customer_id) ON DELETE SET NULL`, "NO ACTION or RESTRICT"},
		{"cascade from a reference table", `ALTER TABLE customers ADD FOREIGN KEY (plan_id) REFERENCES plans (plan_id) ON DELETE CASCADE`, "NO ACTION or RESTRICT"},
		{"a reference table to a tree", `ALTER TABLE plans ADD FOREIGN KEY (plan_id) REFERENCES customers (customer_id)`, ""},
		// CREATE TABLE may reference a tree on its key, for lattice_create_tree
		// to colocate the table (TestCreateTreeForeignKeys); ALTER of an
		// ordinary table may not.
		{"an ordinary table to a tree", `ALTER TABLE loose ADD FOREIGN KEY (id) REFERENCES customers (customer_id)`, ""},
		{"a cycle", `ALTER TABLE customers ADD FOREIGN KEY (customer_id, plan_id) REFERENCES orders (customer_id, order_id)`, "one direction"},
	}
	mustExec(t, c, `CREATE TABLE loose (id int PRIMARY KEY)`)
	mustExec(t, c, `CREATE TABLE lone (customer_id bigint PRIMARY KEY)`)
	mustExec(t, c, `SELECT lattice_create_tree('lone', 'customer_id', shard_count => 2)`)
	for _, r := range refusals {
		_, err := c.Exec(ctx, r.sql)
		if sqlStateOf(err) != "0A000" || !strings.Contains(hintOf(err), r.has) || hintOf(err) == "" {
			t.Errorf("%s: %v (hint %q), want 0A000 with a hint naming %q", r.name, err, hintOf(err), r.has)
		}
	}

	for round, shards := range []int{8, 4} {
		mustExec(t, c, fmt.Sprintf(`SELECT lattice_reshard('orders', %d)`, shards))
		waitReshardComplete(t, ctx, pool, "customers", 4*time.Minute)
		fkEnforced(t, ctx, c, nodes, shards, round+1)
	}
}

// fkGroupInline makes customers, orders and order_items, created with
// their foreign keys (inline, and as a table constraint) to plans and to
// each other, a colocation group of 4 shards with the rows TestForeignKeys
// has. Orders and items are written through the proxy once they are trees:
// until then each references the empty template.
func fkGroupInline(t *testing.T, c *pgx.Conn) {
	t.Helper()
	for _, q := range []string{
		// Rows before the tree: each shard checks its copy against its node's plans.
		`CREATE TABLE customers (customer_id bigint PRIMARY KEY, plan_id int NOT NULL REFERENCES plans (plan_id))`,
		`INSERT INTO customers SELECT i, 1 + i % 3 FROM generate_series(0, 199) i`,
		`SELECT lattice_create_tree('customers', 'customer_id', shard_count => 4)`,
		`CREATE TABLE orders (customer_id bigint REFERENCES customers (customer_id) ON DELETE CASCADE, order_id int, total int,
			PRIMARY KEY (customer_id, order_id))`,
		`SELECT lattice_create_tree('orders', 'customer_id', colocate_with => 'customers')`,
		`CREATE TABLE order_items (customer_id bigint, order_id int, item int, amount int, PRIMARY KEY (customer_id, order_id, item),
			CONSTRAINT items_order FOREIGN KEY (customer_id, order_id) REFERENCES orders (customer_id, order_id))`,
		`SELECT lattice_create_tree('order_items', 'customer_id', colocate_with => 'customers')`,
	} {
		mustExec(t, c, q)
	}
	var orders, items []string
	for i := range 400 {
		orders = append(orders, fmt.Sprintf("(%d, %d, 10)", i%200, i))
		items = append(items, fmt.Sprintf("(%d, %d, 1, 10)", i%200, i))
	}
	mustExec(t, c, `INSERT INTO orders VALUES `+strings.Join(orders, ", "))
	mustExec(t, c, `INSERT INTO order_items VALUES `+strings.Join(items, ", "))
}

// TestCreateTreeForeignKeys makes trees of tables created with their
// foreign keys, inline and as table constraints, to a reference table and
// to the trees they are colocated with: every shard carries them, to its
// own schema's tables, before and after a reshard. The forms shards could
// not enforce are refused by lattice_create_tree (or by CREATE TABLE, when
// no choice of key could make them right) with 0A000 and a hint.
func TestCreateTreeForeignKeys(t *testing.T) {
	ctx, c, pool, nodes := fkCluster(t, 5*time.Minute)
	fkGroupInline(t, c)
	fkEnforced(t, ctx, c, nodes, 4, 0)

	refusals := []struct{ name, create, tree, has string }{
		{"not colocated", `CREATE TABLE lone (customer_id bigint REFERENCES customers (customer_id), n int, PRIMARY KEY (customer_id, n))`,
			`SELECT lattice_create_tree('lone', 'customer_id', shard_count => 4)`, "colocate_with"},
		{"keys not paired", `CREATE TABLE misref (customer_id bigint, other bigint REFERENCES customers (customer_id), PRIMARY KEY (customer_id, other))`,
			`SELECT lattice_create_tree('misref', 'customer_id', colocate_with => 'customers')`, "FOREIGN KEY (customer_id, ...)"},
		{"an ordinary table", `CREATE TABLE tagged (customer_id bigint PRIMARY KEY, loose_id int REFERENCES loose (id))`,
			`SELECT lattice_create_tree('tagged', 'customer_id', colocate_with => 'customers')`, "lattice_create_reference_table"},
		{"cascade from a reference table", `CREATE TABLE cplans (customer_id bigint PRIMARY KEY, plan_id int REFERENCES plans (plan_id) ON DELETE CASCADE)`,
			`SELECT lattice_create_tree('cplans', 'customer_id', colocate_with => 'customers')`, "NO ACTION or RESTRICT"},
		{"not the tree's key", `CREATE TABLE byplan (customer_id bigint PRIMARY KEY, plan_id int REFERENCES customers (plan_id))`,
			"", "REFERENCES \"customers\" (customer_id, ...)"},
		{"SET NULL", `CREATE TABLE nulls (customer_id bigint REFERENCES customers (customer_id) ON DELETE SET NULL, n int)`,
			"", "NO ACTION or RESTRICT"},
	}
	mustExec(t, c, `CREATE TABLE loose (id int PRIMARY KEY)`)
	for _, r := range refusals {
		q := r.tree
		if q == "" {
			q = r.create
		} else {
			mustExec(t, c, r.create)
		}
		_, err := c.Exec(ctx, q)
		if sqlStateOf(err) != "0A000" || !strings.Contains(hintOf(err), r.has) {
			t.Errorf("%s: %v (hint %q), want 0A000 with a hint naming %q", r.name, err, hintOf(err), r.has)
		}
	}
	// A table left ordinary references the tree's empty template: it can
	// hold no row that refers to a customer.
	if _, err := c.Exec(ctx, `INSERT INTO lone VALUES (1, 1)`); sqlStateOf(err) != "23503" {
		t.Errorf("a row of an ordinary table referencing a tree: %v, want 23503", err)
	}
	var trees int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM lattice_trees()`).Scan(&trees); err != nil || trees != 3 {
		t.Errorf("%d trees, %v; want the three of the group, none of the refused", trees, err)
	}

	mustExec(t, c, `SELECT lattice_reshard('orders', 8)`)
	waitReshardComplete(t, ctx, pool, "customers", 4*time.Minute)
	fkEnforced(t, ctx, c, nodes, 8, 1)

	// The shards check customers against their node's copy of plans: it
	// stays a reference table until the foreign key is gone.
	if _, err := c.Exec(ctx, `SELECT lattice_undistribute_table('plans')`); sqlStateOf(err) != "0A000" || !strings.Contains(hintOf(err), "DROP CONSTRAINT") {
		t.Errorf("undistributing plans that customers references: %v (hint %q), want 0A000 naming DROP CONSTRAINT", err, hintOf(err))
	}
	mustExec(t, c, `UPDATE plans SET name = 'gratis' WHERE plan_id = 1`)
	for i, n := range nodes {
		var name string
		if err := n.QueryRow(ctx, `SELECT name FROM public.plans WHERE plan_id = 1`).Scan(&name); err != nil || name != "gratis" {
			t.Errorf("node %d: plan 1 is %q, %v; want the write on every copy", i, name, err)
		}
	}
}

// TestRecoverMapForeignKeys: Redis loses everything while a migration of a
// group with foreign keys had made its target tables (a split killed in
// its copy, rolled back: every member's target table dropped) or fenced its
// source (a move killed in its freeze, finished: every member's source
// table dropped). Dropping a referenced member's table before the table
// referencing it fails (2BP01), so recover-map drops the group's tables of
// a shard in the order the foreign keys allow. Afterwards the rows are
// served, every shard enforces the foreign keys, and a reshard builds new
// shards with them (the recovered DDL logs keep them). The reference
// table's registry entry, lost too, is rebuilt from the catalog.
func TestRecoverMapForeignKeys(t *testing.T) {
	for _, tc := range []struct{ point, op string }{
		{"copy", `SELECT lattice_reshard('orders', 5)`},
		{"freeze", `SELECT lattice_move_shard('order_items', 0, 'n2')`},
	} {
		t.Run(tc.point, func(t *testing.T) {
			fc := startFaultCluster(t, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			// No coordinator: the migration runs in a, which dies at the point.
			p := fc.proxy(t, nil, "--coordinator=false")
			a := fc.proxy(t, []string{"LATTICE_TEST_CRASH_AT=" + tc.point}, "--reshard-tick", "200ms")
			c := connect(t, p.DSN("lattice"))
			nodes := []*pgx.Conn{connect(t, fc.nodeDSN(0)), connect(t, fc.nodeDSN(1))}
			for _, q := range []string{
				`CREATE TABLE plans (plan_id int PRIMARY KEY, name text)`,
				`INSERT INTO plans VALUES (1, 'free'), (2, 'pro'), (3, 'team')`,
				`SELECT lattice_create_reference_table('plans')`,
			} {
				mustExec(t, c, q)
			}
			fkGroupInline(t, c)

			mustExec(t, connect(t, a.DSN("lattice")), tc.op)
			if !a.WaitExit(60 * time.Second) {
				t.Fatalf("the coordinator's proxy did not reach crash point %s", tc.point)
			}
			if err := a.crashedAt(tc.point); err != nil {
				t.Fatal(err)
			}
			fc.flushRedis(t, ctx)
			out := fc.recoverMap(t, ctx)
			// Redis lost the reference table's entry too: without it plans
			// would take no write (the fence: LT001) and join no tree.
			if !strings.Contains(out, "lattice/plans: reference table rebuilt with copies on n1, n2") {
				t.Errorf("recover-map did not report plans rebuilt:\n%s", out)
			}
			for _, name := range []string{"customers", "orders", "order_items"} {
				if !strings.Contains(out, "lattice/"+name+": rebuilt at epoch") {
					t.Errorf("recover-map did not report %s rebuilt:\n%s", name, out)
				}
			}
			b := fc.proxy(t, nil, "--reshard-tick", "200ms")
			bc := connect(t, b.DSN("lattice"))
			pool := proxyPool(t, ctx, b)
			pollUntil(t, 30*time.Second, "the proxy to serve the recovered group", func() (bool, error) {
				var n int
				err := pool.QueryRow(ctx, "SELECT count(*) FROM order_items").Scan(&n)
				if sqlState(err) == "LT002" {
					return false, nil
				}
				return err == nil && n == 400, err
			})
			fkEnforced(t, ctx, bc, nodes, 4, 0)
			mustExec(t, bc, `SELECT lattice_reshard('orders', 8)`)
			waitReshardComplete(t, ctx, pool, "customers", 3*time.Minute)
			fkEnforced(t, ctx, bc, nodes, 8, 1)
		})
	}
}

// shardForeignKeys lists, over the nodes, the foreign keys of the shard
// tables of tree as "referenced table's schema (own or other).table",
// with their count.
func shardForeignKeys(t *testing.T, ctx context.Context, nodes []*pgx.Conn, tree string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, n := range nodes {
		rows, err := n.Query(ctx, `SELECT CASE WHEN pc.relnamespace = c.relnamespace THEN 'own.' ELSE pn.nspname || '.' END || pc.relname
FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace ns ON ns.oid = c.relnamespace
JOIN pg_class pc ON pc.oid = con.confrelid JOIN pg_namespace pn ON pn.oid = pc.relnamespace
WHERE con.contype = 'f' AND ns.nspname LIKE 'lattice\_s%' AND c.relname = $1`, tree)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			out[name]++
		}
	}
	return out
}

// TestSnapshotForeignKeys: a snapshot is a tree of its own, so its copy
// keeps the foreign keys it can enforce alone: to a reference table
// (every node holding its shards has a copy) and to the tree itself (the
// copy has every row it references), not to another member of the group,
// whose rows are not copied. Every shard of the copy carries them, and so
// does its template.
func TestSnapshotForeignKeys(t *testing.T) {
	ctx, c, _, nodes := fkCluster(t, 4*time.Minute)
	for _, q := range []string{
		`CREATE TABLE customers (customer_id bigint PRIMARY KEY, plan_id int NOT NULL REFERENCES plans (plan_id))`,
		`INSERT INTO customers SELECT i, 1 + i % 3 FROM generate_series(0, 199) i`,
		`SELECT lattice_create_tree('customers', 'customer_id', shard_count => 4)`,
		// An order may follow up another of the same customer.
		`CREATE TABLE orders (customer_id bigint REFERENCES customers (customer_id) ON DELETE CASCADE, order_id int, parent_id int,
			PRIMARY KEY (customer_id, order_id), FOREIGN KEY (customer_id, parent_id) REFERENCES orders (customer_id, order_id))`,
		`SELECT lattice_create_tree('orders', 'customer_id', colocate_with => 'customers')`,
	} {
		mustExec(t, c, q)
	}
	var orders []string
	for i := range 400 {
		parent := "NULL"
		if i >= 200 {
			parent = fmt.Sprint(i - 200)
		}
		orders = append(orders, fmt.Sprintf("(%d, %d, %s)", i%200, i, parent))
	}
	mustExec(t, c, `INSERT INTO orders VALUES `+strings.Join(orders, ", "))

	for _, s := range []string{"customers", "orders"} {
		mustExec(t, c, fmt.Sprintf("SELECT lattice_snapshot('%s', '%s_snap')", s, s))
		pollUntil(t, 2*time.Minute, "the snapshot of "+s, func() (bool, error) {
			var done bool
			err := c.QueryRow(ctx, fmt.Sprintf("SELECT lattice_snapshot_complete('%s_snap')", s)).Scan(&done)
			return done, err
		})
	}
	for tree, want := range map[string]string{
		"customers_snap": "map[public.plans:4]",
		"orders_snap":    "map[own.orders_snap:4]",
	} {
		if got := fmt.Sprint(shardForeignKeys(t, ctx, nodes, tree)); got != want {
			t.Errorf("foreign keys of the shards of %s: %s, want %s", tree, got, want)
		}
	}
	var template string
	if err := c.QueryRow(ctx, `SELECT coalesce(string_agg(confrelid::regclass::text, ',' ORDER BY conrelid::regclass::text), '')
FROM pg_constraint WHERE contype = 'f' AND conrelid IN ('customers_snap'::regclass, 'orders_snap'::regclass)`).Scan(&template); err != nil {
		t.Fatal(err)
	}
	if template != "plans,orders_snap" {
		t.Errorf("foreign keys of the templates of the copies reference %s, want plans,orders_snap", template)
	}

	for _, r := range []struct{ name, sql, state string }{
		{"a copied customer of no plan", `INSERT INTO customers_snap VALUES (100000, 99)`, "23503"},
		{"a plan that copied customers have", `DELETE FROM plans WHERE plan_id = 3`, "23503"},
		{"a copied order following up no order", `INSERT INTO orders_snap VALUES (5, 100000, 99999)`, "23503"},
		{"a copied order that another follows up", `DELETE FROM orders_snap WHERE customer_id = 7 AND order_id = 7`, "23503"},
		// The copy of orders stands alone: no customer is copied with it.
		{"a copied order of no customer", `INSERT INTO orders_snap VALUES (100000, 1, NULL)`, ""},
		{"a customer whose orders were copied", `DELETE FROM customers WHERE customer_id = 9`, ""},
	} {
		if _, err := c.Exec(ctx, r.sql); sqlStateOf(err) != r.state {
			t.Errorf("%s: %v, want SQLSTATE %q", r.name, err, r.state)
		}
	}
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM orders_snap WHERE customer_id = 9`).Scan(&n); err != nil || n != 2 {
		t.Errorf("orders of the deleted customer 9 in the copy: %d, %v; want the 2 copied", n, err)
	}
}
