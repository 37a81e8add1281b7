package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/shardmap"
)

// groupLoad is a ledger workload on a colocation group of three trees keyed
// by customer: customers (a version per customer), orders and order_lines,
// whose amounts sum to their order's total. Each writer owns the customers
// with id % writers == its number; a transaction rewrites one order of one
// of them (the customer's version, the order's total, its lines) and reads
// it back joined with its lines before it commits, which holds only if
// every member routes the key to the shard the others write it on. Readers
// join the three trees for one customer and check every total against its
// lines and the version against the ledger (no stale read).
type groupLoad struct {
	pools     []*pgxpool.Pool
	customers int
	writers   int

	mu    sync.Mutex
	ver   map[int64]int64    // acknowledged version per customer
	lines map[[2]int64][]int // acknowledged amounts per order (customer, order)

	version       atomic.Int64
	writes, reads atomic.Int64
	// plans, when set (addPlans), is the row count of the reference table
	// plans that every read also joins its customer to.
	plans     int
	planReads atomic.Int64
	// stopping ends the writers between transactions, so that every
	// transaction a writer began is acknowledged or failed, never cut off
	// with its outcome unknown.
	stopping atomic.Bool
}

const groupDDL = `CREATE TABLE customers (customer_id bigint PRIMARY KEY, ver bigint NOT NULL);
CREATE TABLE orders (customer_id int, order_id int, total int NOT NULL, PRIMARY KEY (customer_id, order_id));
CREATE TABLE order_lines (customer_id bigint, order_id int, line int, amount int NOT NULL, PRIMARY KEY (customer_id, order_id, line))`

// newGroupLoad creates the group (shards shards) with one order of one
// line per customer, through pools[0].
func newGroupLoad(t *testing.T, ctx context.Context, pools []*pgxpool.Pool, customers, shards int) *groupLoad {
	t.Helper()
	g := &groupLoad{pools: pools, customers: customers, writers: 3, ver: map[int64]int64{}, lines: map[[2]int64][]int{}}
	for _, q := range append(strings.Split(groupDDL, ";\n"),
		fmt.Sprintf("INSERT INTO customers SELECT g, 0 FROM generate_series(0, %d) g", customers-1),
		fmt.Sprintf("INSERT INTO orders SELECT g, 0, 0 FROM generate_series(0, %d) g", customers-1),
		fmt.Sprintf("INSERT INTO order_lines SELECT g, 0, 1, 0 FROM generate_series(0, %d) g", customers-1),
		fmt.Sprintf("SELECT lattice_create_tree('customers', 'customer_id', shard_count => %d)", shards),
		"SELECT lattice_create_tree('orders', 'customer_id', colocate_with => 'customers')",
		"SELECT lattice_create_tree('order_lines', 'customer_id', colocate_with => 'orders')",
	) {
		if _, err := pools[0].Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for c := range int64(customers) {
		g.ver[c], g.lines[[2]int64{c, 0}] = 0, []int{0}
	}
	return g
}

// addPlans makes plans, a reference table of n rows, which customer c
// joins on plan_id = c % n.
func (g *groupLoad) addPlans(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	for _, q := range []string{
		"CREATE TABLE plans (plan_id int PRIMARY KEY, name text NOT NULL)",
		fmt.Sprintf("INSERT INTO plans SELECT g, 'plan-' || g FROM generate_series(0, %d) g", n-1),
		"SELECT lattice_create_reference_table('plans')",
	} {
		if _, err := g.pools[0].Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	g.plans = n
}

// readPlan joins customer c to its plan and checks the plan and that the
// version is no older than before.
func (g *groupLoad) readPlan(ctx context.Context, pool *pgxpool.Pool, c, before int64) error {
	var ver int64
	var name string
	err := pool.QueryRow(ctx, `SELECT c.ver, p.name FROM customers c JOIN plans p ON p.plan_id = c.customer_id % $2
		WHERE c.customer_id = $1`, c, g.plans).Scan(&ver, &name)
	if err != nil {
		return fmt.Errorf("customer %d joined to plans: %w", c, err)
	}
	if want := fmt.Sprintf("plan-%d", c%int64(g.plans)); name != want {
		return fmt.Errorf("customer %d joined to plan %q, want %q", c, name, want)
	}
	if ver < before {
		return fmt.Errorf("stale read of customer %d through plans: version %d, but %d was acknowledged before the read", c, ver, before)
	}
	g.planReads.Add(1)
	return nil
}

func (g *groupLoad) writer(ctx context.Context, w int) error {
	rng := rand.New(rand.NewPCG(uint64(w), 7))
	pool := g.pools[w%len(g.pools)]
	for !g.stopping.Load() && ctx.Err() == nil {
		c := int64(rng.IntN(g.customers/g.writers)*g.writers + w)
		o := int64(rng.IntN(3))
		amounts := make([]int, 1+rng.IntN(3))
		total := 0
		values := make([]string, len(amounts))
		for i := range amounts {
			amounts[i] = 1 + rng.IntN(100)
			total += amounts[i]
			values[i] = fmt.Sprintf("(%d, %d, %d, %d)", c, o, i+1, amounts[i])
		}
		ver := g.version.Add(1)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, q := range []struct {
				sql  string
				args []any
			}{
				{"INSERT INTO customers (customer_id, ver) VALUES ($1, $2) ON CONFLICT (customer_id) DO UPDATE SET ver = EXCLUDED.ver", []any{c, ver}},
				{"INSERT INTO orders (customer_id, order_id, total) VALUES ($1, $2, $3) ON CONFLICT (customer_id, order_id) DO UPDATE SET total = EXCLUDED.total", []any{c, o, total}},
				{"DELETE FROM order_lines WHERE customer_id = $1 AND order_id = $2", []any{c, o}},
				{"INSERT INTO order_lines (customer_id, order_id, line, amount) VALUES " + strings.Join(values, ", "), nil},
			} {
				if _, err := tx.Exec(ctx, q.sql, q.args...); err != nil {
					return fmt.Errorf("%s: %w", q.sql, err)
				}
			}
			var gotTotal, sum int64
			err := tx.QueryRow(ctx, `SELECT o.total, sum(l.amount) FROM orders o
				JOIN order_lines l ON l.customer_id = o.customer_id AND l.order_id = o.order_id
				WHERE o.customer_id = $1 AND o.order_id = $2 GROUP BY o.total`, c, o).Scan(&gotTotal, &sum)
			if err != nil {
				return fmt.Errorf("join in the transaction: %w", err)
			}
			if gotTotal != int64(total) || sum != int64(total) {
				return fmt.Errorf("join in the transaction of order %d/%d: total %d, lines %d; it wrote %d", c, o, gotTotal, sum, total)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("writer %d, customer %d: %w", w, c, err)
		}
		g.mu.Lock()
		g.ver[c], g.lines[[2]int64{c, o}] = ver, amounts
		g.mu.Unlock()
		g.writes.Add(1)
		// A freeze waits for the transactions open on its source table;
		// one whose next statement the freeze holds rolls it back. A
		// pause between transactions lets most freezes fit.
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

func (g *groupLoad) reader(ctx context.Context, i int) error {
	rng := rand.New(rand.NewPCG(uint64(i), 11))
	pool := g.pools[i%len(g.pools)]
	for ctx.Err() == nil {
		c := int64(rng.IntN(g.customers))
		g.mu.Lock()
		before := g.ver[c]
		g.mu.Unlock()
		rows, err := pool.Query(ctx, `SELECT c.ver, o.order_id, o.total, sum(l.amount), count(*) FROM customers c
			JOIN orders o ON o.customer_id = c.customer_id
			JOIN order_lines l ON l.customer_id = o.customer_id AND l.order_id = o.order_id
			WHERE c.customer_id = $1 GROUP BY c.ver, o.order_id, o.total`, c)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reader %d, customer %d: %w", i, c, err)
		}
		n := 0
		var ver, order, total, sum, count int64
		_, err = pgx.ForEachRow(rows, []any{&ver, &order, &total, &sum, &count}, func() error {
			n++
			if total != sum {
				return fmt.Errorf("customer %d, order %d: total %d, but its %d lines sum to %d", c, order, total, count, sum)
			}
			if ver < before {
				return fmt.Errorf("stale read of customer %d: version %d, but %d was acknowledged before the read", c, ver, before)
			}
			return nil
		})
		if err == nil && n == 0 {
			err = fmt.Errorf("customer %d: the join of its trees found no row", c)
		}
		if err == nil && g.plans > 0 {
			err = g.readPlan(ctx, pool, c, before)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reader %d: %w", i, err)
		}
		g.reads.Add(1)
	}
	return nil
}

// run starts the writers and 2 readers; finish stops them and returns the
// first error, failed reports it without stopping them.
func (g *groupLoad) run(ctx context.Context) (failed func() error, finish func() error) {
	runCtx, stop := context.WithCancel(ctx)
	var wg, writers sync.WaitGroup
	var mu sync.Mutex
	var first error
	note := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil && err != nil {
			first = err
		}
	}
	for w := range g.writers {
		writers.Go(func() { note(g.writer(ctx, w)) })
	}
	for i := range 2 {
		wg.Go(func() { note(g.reader(runCtx, i)) })
	}
	failed = func() error {
		mu.Lock()
		defer mu.Unlock()
		return first
	}
	finish = func() error {
		g.stopping.Store(true)
		writers.Wait()
		stop()
		wg.Wait()
		return failed()
	}
	return failed, finish
}

// groupQueries are compared, row for row, with plain PostgreSQL's answers.
var groupQueries = []string{
	`SELECT c.customer_id, c.ver, o.order_id, o.total, l.line, l.amount FROM customers c
		JOIN orders o ON o.customer_id = c.customer_id
		JOIN order_lines l ON l.customer_id = o.customer_id AND l.order_id = o.order_id ORDER BY 1, 3, 5`,
	`SELECT o.customer_id, o.order_id, o.total, l.line, l.amount FROM orders o
		LEFT JOIN order_lines l ON l.customer_id = o.customer_id AND l.order_id = o.order_id ORDER BY 1, 2, 4`,
	`SELECT o.total, sum(l.amount), count(*) FROM orders o
		JOIN order_lines l ON l.customer_id = o.customer_id AND l.order_id = o.order_id WHERE o.customer_id = 7 GROUP BY o.order_id, o.total ORDER BY o.order_id`,
	`SELECT c.customer_id, o.order_id FROM customers c LEFT JOIN orders o ON o.customer_id = c.customer_id
		WHERE c.customer_id < 50 ORDER BY 1, 2`,
	`SELECT c.customer_id, c.ver FROM customers c WHERE EXISTS (SELECT 1 FROM order_lines l WHERE l.customer_id = c.customer_id AND l.amount > 90) ORDER BY 1`,
}

// check compares the group with the ledger, every row present once and on
// the shard of its key's customer, and groupQueries with plain PostgreSQL
// (schema plain on node 1, filled from the ledger).
func (g *groupLoad) check(t *testing.T, ctx context.Context, pool *pgxpool.Pool, nodes int) {
	t.Helper()
	var conns []*pgx.Conn
	for i := range nodes {
		conns = append(conns, connect(t, testNodeDSN(t, i)))
	}
	cust := coPlacement(t, ctx, conns, "customers", "customer_id")
	if len(cust) != g.customers {
		t.Errorf("%d customers on the shards, want %d", len(cust), g.customers)
	}
	for _, table := range []string{"orders", "order_lines"} {
		for k, at := range coPlacement(t, ctx, conns, table, "customer_id") {
			if cust[k] != at {
				t.Errorf("%s of customer %d are on %s, the customer on %s", table, k, at, cust[k])
			}
		}
	}
	plain := conns[0]
	mustExec(t, plain, "DROP SCHEMA IF EXISTS plain CASCADE")
	mustExec(t, plain, "CREATE SCHEMA plain")
	mustExec(t, plain, "SET search_path = plain")
	for _, q := range strings.Split(groupDDL, ";\n") {
		mustExec(t, plain, q)
	}
	var custRows, orderRows, lineRows [][]any
	for c, v := range g.ver {
		custRows = append(custRows, []any{c, v})
	}
	for k, amounts := range g.lines {
		total := 0
		for i, a := range amounts {
			total += a
			lineRows = append(lineRows, []any{k[0], k[1], i + 1, a})
		}
		orderRows = append(orderRows, []any{k[0], k[1], total})
	}
	for _, cp := range []struct {
		table string
		cols  []string
		rows  [][]any
	}{
		{"customers", []string{"customer_id", "ver"}, custRows},
		{"orders", []string{"customer_id", "order_id", "total"}, orderRows},
		{"order_lines", []string{"customer_id", "order_id", "line", "amount"}, lineRows},
	} {
		if _, err := plain.CopyFrom(ctx, pgx.Identifier{"plain", cp.table}, cp.cols, pgx.CopyFromRows(cp.rows)); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range groupQueries {
		want := queryText(t, ctx, plain, q)
		got := queryText(t, ctx, pool, q)
		if !slices.Equal(got, want) {
			t.Errorf("%s\nthrough the proxy: %d rows, plain PostgreSQL: %d rows; first difference at %s", q, len(got), len(want), firstDiff(got, want))
		}
	}
}

type textQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// queryText runs q and renders each row as text.
func queryText(t *testing.T, ctx context.Context, c textQuerier, q string) []string {
	t.Helper()
	rows, err := c.Query(ctx, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		v, err := r.Values()
		return fmt.Sprint(v...), err
	})
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return out
}

// watchGroupRecords polls Redis while a group migrates: its members keep
// one map, so their migrations are recorded under the group's name and
// never under a member's. It returns how many polls saw a migration.
func watchGroupRecords(ctx context.Context, t *testing.T, group string, members []string) (stop func() int64) {
	store, err := shardmap.OpenRedis(ctx, testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	var seen atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	wg.Go(func() {
		for wctx.Err() == nil {
			migs, err := store.Migrations(wctx, "lattice", group)
			if err == nil && len(migs) > 0 {
				seen.Add(1)
			}
			for _, m := range members {
				if own, err := store.Migrations(wctx, "lattice", m); err == nil && len(own) > 0 && m != group {
					errs <- fmt.Errorf("member %s has migrations of its own: %v", m, own)
					return
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	return func() int64 {
		cancel()
		wg.Wait()
		store.Close()
		select {
		case err := <-errs:
			t.Error(err)
		default:
		}
		return seen.Load()
	}
}

// TestGroupReshardUnderLoad reshards a colocation group of three trees
// 4 -> 6 -> 4, moves one of its shards to another node and drains node
// n3, each asked of a different member, through two proxies, while the
// group's ledger
// workload writes all three trees in transactions and joins them. Every
// migration moves every member table: afterwards each row is present once
// and next to its customer's, the joins equal plain PostgreSQL's, and no
// client saw an error.
func TestGroupReshardUnderLoad(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a := startProxy(t, 3, "--reshard-tick", "200ms")
	b := startProxy(t, 3, "--reshard-tick", "200ms")
	var pools []*pgxpool.Pool
	for _, p := range []*proxyProc{a, b} {
		pool, err := pgxpool.New(ctx, p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pools = append(pools, pool)
	}
	g := newGroupLoad(t, ctx, pools, 600, 4)
	watch := watchGroupRecords(ctx, t, "customers", []string{"orders", "order_lines"})
	failed, finish := g.run(ctx)
	start := time.Now()
	for _, step := range []struct{ op, done string }{
		{"SELECT lattice_reshard('orders', 6)", "SELECT lattice_reshard_complete('customers')"},
		{"SELECT lattice_reshard('order_lines', 4)", "SELECT lattice_reshard_complete('orders')"},
	} {
		if _, err := pools[1].Exec(ctx, step.op); err != nil {
			finish()
			t.Fatalf("%s: %v", step.op, err)
		}
		waitFor(t, ctx, pools[0], step.done, failed, finish)
		t.Logf("%s: done after %s", step.op, time.Since(start))
	}
	shards := shardNodes(t, ctx, pools[0], "orders")
	idx, from := -1, ""
	for i, at := range shards {
		if strings.HasSuffix(at, "/active") && (idx < 0 || i < idx) {
			idx, from = i, strings.TrimSuffix(at, "/active")
		}
	}
	to := map[string]string{"n1": "n2", "n2": "n3", "n3": "n1"}[from]
	if _, err := pools[0].Exec(ctx, "SELECT lattice_move_shard('order_lines', $1, $2)", idx, to); err != nil {
		finish()
		t.Fatal(err)
	}
	waitFor(t, ctx, pools[0], "SELECT lattice_rebalance_complete('customers')", failed, finish)
	t.Logf("move of shard %d from %s to %s: done after %s", idx, from, to, time.Since(start))
	for _, tree := range []string{"customers", "orders", "order_lines"} {
		got := shardNodes(t, ctx, pools[1], tree)
		active := 0
		for _, at := range got {
			if strings.HasSuffix(at, "/active") {
				active++
			}
		}
		if active != 4 || got[idx] != to+"/active" {
			t.Errorf("%s after the reshards and the move: %v; want 4 active shards, shard %d on %s", tree, got, idx, to)
		}
	}
	// The drain moves each of the group's shards off n3 once.
	if _, err := pools[1].Exec(ctx, "SELECT lattice_drain_node('n3')"); err != nil {
		finish()
		t.Fatal(err)
	}
	waitFor(t, ctx, pools[0], "SELECT lattice_drain_complete('n3')", failed, finish)
	t.Logf("drain of n3: done after %s", time.Since(start))
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if polls := watch(); polls == 0 {
		t.Error("no poll saw the group's migrations under its name")
	}
	if g.writes.Load() == 0 || g.reads.Load() == 0 {
		t.Fatalf("the load did nothing: %d writes, %d reads", g.writes.Load(), g.reads.Load())
	}
	for _, tree := range []string{"customers", "orders", "order_lines"} {
		for i, at := range shardNodes(t, ctx, pools[1], tree) {
			if strings.HasPrefix(at, "n3/") && !strings.HasSuffix(at, "/retired") {
				t.Errorf("%s shard %d is %s after the drain of n3", tree, i, at)
			}
		}
	}
	for i := range 3 {
		for _, l := range latticeLeftovers(t, ctx, i) {
			if strings.HasPrefix(l, "publication") || strings.HasPrefix(l, "slot") || i == 2 ||
				fmt.Sprintf("n%d", i+1) == from && to != "n3" && strings.Contains(l, shardmap.SchemaName(idx)) {
				t.Errorf("node n%d keeps %s", i+1, l)
			}
		}
	}
	g.check(t, ctx, pools[1], 3)
	t.Logf("%d writes, %d reads in %s", g.writes.Load(), g.reads.Load(), time.Since(start))
}

// TestGroupReshardWide reshards a colocation group of three trees 16 -> 64
// -> 16 through two proxies, each step asked of a different member, while
// the group's ledger workload writes all three in transactions and its
// readers check every order's total against its lines and join customers
// to plans, a reference table. Afterwards every acknowledged write is
// present once, no read saw a broken total or a stale version, and no
// client saw an error.
func TestGroupReshardWide(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var pools []*pgxpool.Pool
	for range 2 {
		pool, err := pgxpool.New(ctx, startProxy(t, 3, "--reshard-tick", "200ms").DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pools = append(pools, pool)
	}
	g := newGroupLoad(t, ctx, pools, 600, 16)
	g.addPlans(t, ctx, 4)
	failed, finish := g.run(ctx)
	start := time.Now()
	for _, step := range []struct {
		op, done string
		shards   int
	}{
		{"SELECT lattice_reshard('orders', 64)", "SELECT lattice_reshard_complete('customers')", 64},
		{"SELECT lattice_reshard('order_lines', 16)", "SELECT lattice_reshard_complete('orders')", 16},
	} {
		if _, err := pools[1].Exec(ctx, step.op); err != nil {
			finish()
			t.Fatalf("%s: %v", step.op, err)
		}
		waitFor(t, ctx, pools[0], step.done, failed, finish)
		t.Logf("%s: done after %s, %d writes, %d reads so far", step.op, time.Since(start), g.writes.Load(), g.reads.Load())
		for _, tree := range []string{"customers", "orders", "order_lines"} {
			active := 0
			for _, at := range shardNodes(t, ctx, pools[0], tree) {
				if strings.HasSuffix(at, "/active") {
					active++
				}
			}
			if active != step.shards {
				t.Errorf("%s after %s: %d active shards, want %d", tree, step.op, active, step.shards)
			}
		}
	}
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if g.writes.Load() == 0 || g.planReads.Load() == 0 {
		t.Fatalf("the load did nothing: %d writes, %d reads joined to plans", g.writes.Load(), g.planReads.Load())
	}
	g.check(t, ctx, pools[1], 3)
	t.Logf("%d writes, %d reads (%d joined to plans) in %s", g.writes.Load(), g.reads.Load(), g.planReads.Load(), time.Since(start))
}

// TestGroupMoveCrash kills the coordinator's proxy (SIGKILL, the
// LATTICE_TEST_CRASH_AT hook) in a move of a colocation group's shard:
// with every member table fenced, before the flip (the freeze is undone
// for every member and tried again), and in the release, after the
// stream's objects went. A new proxy takes the lease over and the move
// completes: every member's table of the shard on the new node, none
// left on the old one, every row once, while clients on another proxy
// see no error.
func TestGroupMoveCrash(t *testing.T) {
	for _, point := range []string{"freeze", "release"} {
		t.Run(point, func(t *testing.T) {
			resetNodes(t)
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			fast := []string{"--reshard-lease", "3s", "--reshard-tick", "200ms"}
			b := startProxy(t, 3, append([]string{"--coordinator=false"}, fast...)...)
			a := startProxyEnv(t, 3, []string{"LATTICE_TEST_CRASH_AT=" + point}, fast...)
			pool, err := pgxpool.New(ctx, b.DSN("lattice"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			g := newGroupLoad(t, ctx, []*pgxpool.Pool{pool}, 300, 4)
			from := strings.TrimSuffix(shardNodes(t, ctx, pool, "orders")[0], "/active")
			to := map[string]string{"n1": "n2", "n2": "n3", "n3": "n1"}[from]
			failed, finish := g.run(ctx)
			if _, err := pool.Exec(ctx, "SELECT lattice_move_shard('orders', 0, $1)", to); err != nil {
				finish()
				t.Fatal(err)
			}
			if !a.WaitExit(2 * time.Minute) {
				finish()
				t.Fatalf("the coordinator's proxy did not reach crash point %q", point)
			}
			if err := a.crashedAt(point); err != nil {
				finish()
				t.Fatal(err)
			}
			c := startProxy(t, 3, fast...) // takes the lease over once it expires
			waitFor(t, ctx, pool, "SELECT lattice_rebalance_complete('order_lines')", failed, finish)
			if err := finish(); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(c.Log(), `msg="migration done"`) {
				t.Fatal("the move completed, but the restarted proxy finished no migration")
			}
			for _, tree := range []string{"customers", "orders", "order_lines"} {
				if got := shardNodes(t, ctx, pool, tree)[0]; got != to+"/active" {
					t.Errorf("%s shard 0 is %s after the move, want %s/active", tree, got, to)
				}
			}
			for i := range 3 {
				for _, l := range latticeLeftovers(t, ctx, i) {
					if strings.HasPrefix(l, "publication") || strings.HasPrefix(l, "slot") ||
						fmt.Sprintf("n%d", i+1) == from && strings.Contains(l, "lattice_s0000") {
						t.Errorf("node n%d keeps %s", i+1, l)
					}
				}
			}
			g.check(t, ctx, pool, 3)
			t.Logf("crash at %s: %d writes, %d reads", point, g.writes.Load(), g.reads.Load())
		})
	}
}

// TestMovingTableUpgrade: the shard schemas keep the lattice_moving table
// of an older version, keyed by the migration alone, which holds one
// table's row a migration. The next fence gives it the key (migration,
// tree), and a colocation group's split records both member tables: every
// row is there after the reshard.
func TestMovingTableUpgrade(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--reshard-tick", "200ms")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	for _, q := range []string{
		"CREATE TABLE up_a (k int PRIMARY KEY)",
		"CREATE TABLE up_b (k int, j int, PRIMARY KEY (k, j))",
		"INSERT INTO up_a SELECT g FROM generate_series(1, 200) g",
		"INSERT INTO up_b SELECT g % 200 + 1, g FROM generate_series(1, 400) g",
		"SELECT lattice_create_tree('up_a', 'k', shard_count => 2)",
		"SELECT lattice_create_tree('up_b', 'k', colocate_with => 'up_a')",
	} {
		mustExec(t, c, q)
	}
	var nodes []*pgx.Conn
	for i := range 2 {
		n := connect(t, testNodeDSN(t, i))
		nodes = append(nodes, n)
		schemas, err := queryStrings(t, n, `SELECT nspname FROM pg_namespace WHERE nspname LIKE 'lattice\_s%'`)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range schemas {
			mustExec(t, n, fmt.Sprintf(`CREATE TABLE %s.lattice_moving (migration text PRIMARY KEY, tree text NOT NULL, kind text NOT NULL,
				slots int4multirange NOT NULL, target int NOT NULL, target_node text NOT NULL)`, pgx.Identifier{s}.Sanitize()))
		}
	}
	mustExec(t, c, "SELECT lattice_reshard('up_b', 3)")
	pollUntil(t, time.Minute, "the group's reshard", func() (bool, error) {
		var done bool
		err := c.QueryRow(ctx, "SELECT lattice_reshard_complete('up_a')").Scan(&done)
		return done, err
	})
	for name, want := range map[string]int{"up_a": 200, "up_b": 400} {
		var n int
		if err := c.QueryRow(ctx, "SELECT count(*) FROM "+name).Scan(&n); err != nil || n != want {
			t.Errorf("%s after the reshard: %d rows, %v; want %d", name, n, err, want)
		}
	}
	upgraded := 0
	for i, n := range nodes {
		keys, err := queryStrings(t, n, `SELECT array_length(conkey, 1)::text FROM pg_constraint c
			JOIN pg_class r ON r.oid = c.conrelid WHERE r.relname = 'lattice_moving' AND c.contype = 'p'`)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if k == "2" {
				upgraded++
			}
		}
		t.Logf("node n%d: lattice_moving keys of %v columns", i+1, keys)
	}
	if upgraded == 0 {
		t.Error("no lattice_moving table was given the key (migration, tree)")
	}
}
