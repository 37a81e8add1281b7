package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// newLoad creates tree catalogue (keys rows, shards shards) through
// pools[0] for the reshard load test's ledger workload over pools.
func newLoad(t *testing.T, ctx context.Context, pools []*pgxpool.Pool, keys, shards int) *reshardLoad {
	t.Helper()
	load := &reshardLoad{keys: keys, pools: pools, ledger: &loadLedger{acked: map[string]loadEntry{}, deletes: map[string]int64{}}}
	for _, q := range []string{
		"CREATE TABLE catalogue (k text PRIMARY KEY, v bigint NOT NULL, pad text)",
		"INSERT INTO catalogue SELECT 'c-' || g, 0, md5(g::text) FROM generate_series(0, " + strconv.Itoa(keys-1) + ") g",
		"SELECT lattice_create_tree('catalogue', 'k', shard_count => " + strconv.Itoa(shards) + ")",
	} {
		if _, err := pools[0].Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for n := 0; n < keys; n++ {
		load.ledger.acked["c-"+strconv.Itoa(n)] = loadEntry{}
	}
	return load
}

// run starts the load's 4 writers and 2 readers. finish stops them and
// returns the first client error or stale read; failed reports one without
// stopping them.
func (r *reshardLoad) run(ctx context.Context) (failed func() error, finish func() error) {
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := range 4 {
		wg.Go(func() { errs <- r.writer(runCtx, i) })
	}
	for i := range 2 {
		wg.Go(func() { errs <- r.reader(runCtx, i) })
	}
	var first error
	var mu sync.Mutex
	failed = func() error {
		mu.Lock()
		defer mu.Unlock()
		for first == nil {
			select {
			case err := <-errs:
				first = err
				if err == nil {
					continue
				}
			default:
				return nil
			}
		}
		return first
	}
	finish = func() error {
		stop()
		wg.Wait()
		close(errs)
		mu.Lock()
		defer mu.Unlock()
		for err := range errs {
			if first == nil {
				first = err
			}
		}
		return first
	}
	return failed, finish
}

// waitFor polls the boolean query q until it is true, failing on the
// load's first error.
func waitFor(t *testing.T, ctx context.Context, pool *pgxpool.Pool, q string, failed func() error, finish func() error) {
	t.Helper()
	for {
		var done bool
		if err := pool.QueryRow(ctx, q).Scan(&done); err != nil {
			finish()
			t.Fatalf("%s: %v", q, err)
		}
		if done {
			return
		}
		if failed != nil {
			if err := failed(); err != nil {
				finish()
				t.Fatal(err)
			}
		}
		select {
		case <-ctx.Done():
			finish()
			t.Fatalf("%s did not become true", q)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// shardNodes reads lattice_shards: each shard's node and state.
func shardNodes(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tree string) map[int]string {
	t.Helper()
	rows, err := pool.Query(ctx, "SELECT shard, node, state FROM lattice_shards($1)", tree)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	var idx int32
	var node, state string
	if _, err := pgx.ForEachRow(rows, []any{&idx, &node, &state}, func() error {
		out[int(idx)] = node + "/" + state
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// latticeLeftovers lists, in harness node i's lattice database, the shard
// schemas and their tables, publications and replication slots.
func latticeLeftovers(t *testing.T, ctx context.Context, i int) []string {
	t.Helper()
	c, err := pgx.Connect(ctx, testNodeDSN(t, i))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rows, err := c.Query(ctx, `SELECT 'schema ' || nspname FROM pg_namespace WHERE nspname LIKE 'lattice\_s%'
		UNION ALL SELECT 'table ' || n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname LIKE 'lattice\_s%' AND c.relkind = 'r' AND c.relname NOT IN ('lattice_owner', 'lattice_progress')
		UNION ALL SELECT 'publication ' || pubname FROM pg_publication
		UNION ALL SELECT 'slot ' || slot_name FROM pg_replication_slots ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMoveShard moves a shard to another node under the ledger load, and
// checks what the move leaves: the shard on its new node with its index,
// nothing of it on the old one, its events, and every acknowledged write
// once. Bad input is refused with its own error and changes nothing; a
// rebalance and a reshard of one tree exclude each other.
func TestMoveShard(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := startProxy(t, 3, "--reshard-tick", "200ms")
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	load := newLoad(t, ctx, []*pgxpool.Pool{pool}, 20_000, 8)
	for _, q := range []string{
		"CREATE TABLE plain (k text PRIMARY KEY)",
		"CREATE TABLE folded (k text PRIMARY KEY)",
		"INSERT INTO folded SELECT 'f' || g FROM generate_series(1, 1000) g",
		"SELECT lattice_create_tree('folded', 'k', shard_count => 4)",
		"SELECT lattice_reshard('folded', 2)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	waitFor(t, ctx, pool, "SELECT lattice_reshard_complete('folded')", nil, func() error { return nil })
	retired := -1
	for idx, ns := range shardNodes(t, ctx, pool, "folded") {
		if strings.HasSuffix(ns, "/retired") {
			retired = idx
		}
	}
	if retired < 0 {
		t.Fatal("the fold of tree folded left no retired shard")
	}

	listener, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	mustExec(t, listener, "LISTEN lattice_events")

	failed, finish := load.run(ctx)
	before := shardNodes(t, ctx, pool, "catalogue")
	if before[0] != "n1/active" {
		t.Fatalf("shard 0 is %s, want n1/active", before[0])
	}
	var epoch int64
	if err := pool.QueryRow(ctx, "SELECT epoch FROM lattice_trees() WHERE tree = 'catalogue'").Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, sql, code, msg string
	}{
		{"to the node it is on", "SELECT lattice_move_shard('catalogue', 0, 'n1')", "22023", "already on node n1"},
		{"a retired shard", fmt.Sprintf("SELECT lattice_move_shard('folded', %d, 'n3')", retired), "55000", "is retired: only active shards move"},
		{"an unknown node", "SELECT lattice_move_shard('catalogue', 0, 'n9')", "42704", `node "n9" does not exist`},
		{"a non-tree", "SELECT lattice_move_shard('plain', 0, 'n2')", "42P01", `tree "plain" does not exist`},
		{"no such shard", "SELECT lattice_move_shard('catalogue', 999, 'n2')", "22023", "has no shard 999"},
		{"a null node", "SELECT lattice_move_shard('catalogue', 0, NULL)", "22004", "must not be null"},
		{"rebalance by something else", "SELECT lattice_rebalance('catalogue', by => 'rows')", "22023", "must be 'bytes' or 'slots'"},
		{"drain an unknown node", "SELECT lattice_drain_node('n9')", "42704", `node "n9" does not exist`},
	} {
		_, err := pool.Exec(ctx, tc.sql)
		if sqlStateOf(err) != tc.code || err == nil || !strings.Contains(err.Error(), tc.msg) {
			finish()
			t.Fatalf("%s: %s: got %v, want %s with %q", tc.name, tc.sql, err, tc.code, tc.msg)
		}
	}
	var after int64
	var idle bool
	if err := pool.QueryRow(ctx, "SELECT epoch, lattice_rebalance_complete('catalogue') FROM lattice_trees() WHERE tree = 'catalogue'").Scan(&after, &idle); err != nil {
		t.Fatal(err)
	}
	if after != epoch || !idle || fmt.Sprint(shardNodes(t, ctx, pool, "catalogue")) != fmt.Sprint(before) {
		finish()
		t.Fatalf("bad input changed something: epoch %d -> %d, rebalance complete %v", epoch, after, idle)
	}

	var msg string
	if err := pool.QueryRow(ctx, "SELECT lattice_move_shard('catalogue', 0, 'n2')").Scan(&msg); err != nil {
		finish()
		t.Fatal(err)
	}
	t.Logf("lattice_move_shard: %s", msg)
	var phase, node string
	var done, left int32
	if err := pool.QueryRow(ctx, "SELECT phase, node, moves_done, moves_left FROM lattice_rebalance_status('catalogue')").Scan(&phase, &node, &done, &left); err != nil {
		finish()
		t.Fatal(err)
	}
	if phase != "move" || node != "n2" || done+left != 1 {
		t.Errorf("lattice_rebalance_status during the move: %s, %s, %d done, %d left", phase, node, done, left)
	}
	// While the move runs, a reshard of the tree is refused.
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('catalogue', 12)"); sqlStateOf(err) != "55000" {
		finish()
		t.Fatalf("lattice_reshard during a move: %v, want 55000", err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_rebalance_complete('catalogue')", failed, finish)
	moved := shardNodes(t, ctx, pool, "catalogue")
	if moved[0] != "n2/active" {
		finish()
		t.Fatalf("after the move shard 0 is %s, want n2/active", moved[0])
	}
	for idx, ns := range before {
		if idx != 0 && moved[idx] != ns {
			t.Errorf("shard %d went from %s to %s", idx, ns, moved[idx])
		}
	}
	for _, l := range latticeLeftovers(t, ctx, 0) {
		// Tree folded has a shard 0 on n1 too, in the same schema.
		if l == "table lattice_s0000.catalogue" || strings.HasPrefix(l, "publication") || strings.HasPrefix(l, "slot") {
			t.Errorf("node n1 keeps %s after shard 0 moved away", l)
		}
	}

	// A rebalance by slots (n2 now holds 4 of the 8 shards) excludes a
	// reshard and another move until it completes.
	if err := pool.QueryRow(ctx, "SELECT lattice_rebalance('catalogue', by => 'slots')").Scan(&msg); err != nil || !strings.Contains(msg, "moves planned") {
		finish()
		t.Fatalf("lattice_rebalance: %q, %v", msg, err)
	}
	t.Logf("lattice_rebalance: %s", msg)
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('catalogue', 12)"); sqlStateOf(err) != "55000" || !strings.Contains(err.Error(), "rebalance") {
		finish()
		t.Fatalf("lattice_reshard during a rebalance: %v, want 55000", err)
	}
	if _, err := pool.Exec(ctx, "SELECT lattice_move_shard('catalogue', 1, 'n3')"); sqlStateOf(err) != "55000" {
		finish()
		t.Fatalf("lattice_move_shard during a rebalance: %v, want 55000", err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_rebalance_complete('catalogue')", failed, finish)
	if err := pool.QueryRow(ctx, "SELECT phase FROM lattice_rebalance_status('catalogue')").Scan(&phase); err != nil || phase != "idle" {
		t.Errorf("lattice_rebalance_status after the rebalance: %q, %v", phase, err)
	}
	perNode := map[string]int{}
	for _, ns := range shardNodes(t, ctx, pool, "catalogue") {
		perNode[ns]++
	}
	if perNode["n1/active"] < 2 || perNode["n2/active"] > 3 || perNode["n3/active"] < 2 {
		t.Errorf("after the rebalance by slots: %v", perNode)
	}
	if err := pool.QueryRow(ctx, "SELECT lattice_rebalance('catalogue', by => 'slots')").Scan(&msg); err != nil || !strings.Contains(msg, "nothing to move") {
		t.Errorf("a second rebalance: %q, %v; want nothing to move", msg, err)
	}

	// While a reshard runs, a rebalance is refused.
	mustPool(t, ctx, pool, "SELECT lattice_reshard('catalogue', 10)")
	if _, err := pool.Exec(ctx, "SELECT lattice_rebalance('catalogue')"); sqlStateOf(err) != "55000" || !strings.Contains(err.Error(), "reshard") {
		finish()
		t.Fatalf("lattice_rebalance during a reshard: %v, want 55000", err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_reshard_complete('catalogue')", failed, finish)
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	verifyReshardedTree(t, ctx, pool, load.ledger, 10)

	rejected := map[string]float64{}
	for _, m := range scrape(t, p)["lattice_shard_root_reshard_rejected_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" {
				rejected[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	if rejected["rebalance_in_flight"] < 2 || rejected["reshard_in_flight"] < 1 || rejected["already_in_progress"] < 1 {
		t.Errorf("rejected counter by reason: %v", rejected)
	}

	// The events of the move, in order.
	var got []string
	for {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		n, err := listener.WaitForNotification(wctx)
		wcancel()
		if err != nil {
			break
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(n.Payload), &ev); err != nil {
			t.Fatal(err)
		}
		if ev["tree"] != "catalogue" {
			continue
		}
		got = append(got, fmt.Sprintf("%v %v %v>%v", ev["event"], ev["kind"], ev["source_node"], ev["target_node"]))
		if ev["event"] == "rebalance_completed" {
			break
		}
	}
	want := []string{"rebalance_started move <nil>><nil>", "migration_committed move n1>n2", "migration_retired move n1>n2", "rebalance_completed move <nil>><nil>"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("events of the move:\n got %q\nwant %q", got, want)
	}
}

// mustPool runs sql on pool or fails.
func mustPool(t *testing.T, ctx context.Context, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestMoveCrash kills the proxy that runs a move (SIGKILL, from the
// test-only hook) once in each phase: prepare (target table made), copy,
// drain, freeze, flip and release. A new proxy takes the lease over, the
// move completes, and the ledger check passes, while clients on another
// proxy see no error.
func TestMoveCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("long: one move per crash point")
	}
	for _, point := range []string{"prepare", "copy", "drain", "freeze", "flip", "release"} {
		t.Run(point, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			pool, load := crashRun(t, ctx, point, "SELECT lattice_move_shard('catalogue', 0, 'n3')", "SELECT lattice_rebalance_complete('catalogue')")
			if got := shardNodes(t, ctx, pool, "catalogue")[0]; got != "n3/active" {
				t.Fatalf("after the move shard 0 is %s, want n3/active", got)
			}
			for _, l := range latticeLeftovers(t, ctx, 0) {
				if strings.Contains(l, "lattice_s0000") || strings.HasPrefix(l, "publication") || strings.HasPrefix(l, "slot") {
					t.Errorf("node n1 keeps %s after shard 0 moved away", l)
				}
			}
			verifyReshardedTree(t, ctx, pool, load.ledger, 8)
			t.Logf("crash at %s: %d writes, %d reads", point, load.writes.Load(), load.reads.Load())
		})
	}
}

// TestMoveCrashChunks kills the proxy that runs a move of a shard large
// enough to be copied in several page ranges over several connections, at
// the copy's crash point: the extra connections have committed their
// ranges, the last range and the progress row have not. The target then
// holds part of the shard and no progress row; the new run empties it and
// copies the shard again, and the target ends with every row exactly once.
func TestMoveCrashChunks(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fast := []string{"--reshard-lease", "3s", "--reshard-tick", "200ms", "--copy-workers", "4"}
	b := startProxy(t, 3, append([]string{"--coordinator=false"}, fast...)...)
	a := startProxyEnv(t, 3, []string{"LATTICE_TEST_CRASH_AT=copy"}, fast...)
	pool, err := pgxpool.New(ctx, b.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// 60,000 rows of about 100 bytes in 2 shards: some 400 pages a shard,
	// several of the copy's page ranges.
	for _, q := range []string{
		"CREATE TABLE big (k bigint PRIMARY KEY, n int8 NOT NULL, pad text NOT NULL)",
		"INSERT INTO big SELECT g, g, repeat(md5(g::text), 2) FROM generate_series(1, 60000) g",
		"SELECT lattice_create_tree('big', 'k', shard_count => 2)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	from := strings.TrimSuffix(shardNodes(t, ctx, pool, "big")[0], "/active")
	to := map[string]string{"n1": "n3", "n2": "n3", "n3": "n1"}[from]
	node := func(name string) *pgx.Conn {
		i, err := strconv.Atoi(strings.TrimPrefix(name, "n"))
		if err != nil {
			t.Fatalf("node %q: %v", name, err)
		}
		c, err := pgx.Connect(ctx, testNodeDSN(t, i-1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	const shard = "SELECT count(*), count(DISTINCT k), coalesce(sum(n), 0), coalesce(sum(hashtext(pad)), 0) FROM lattice_s0000.big"
	var want [4]int64
	if err := node(from).QueryRow(ctx, shard).Scan(&want[0], &want[1], &want[2], &want[3]); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "SELECT lattice_move_shard('big', 0, $1)", to); err != nil {
		t.Fatal(err)
	}
	if !a.WaitExit(2 * time.Minute) {
		t.Fatal("the coordinator's proxy did not reach crash point copy")
	}
	if err := a.crashedAt("copy"); err != nil {
		t.Fatal(err)
	}
	target := node(to)
	var partial, progress int64
	if err := target.QueryRow(ctx, "SELECT (SELECT count(*) FROM lattice_s0000.big), (SELECT count(*) FROM lattice_s0000.lattice_progress)").
		Scan(&partial, &progress); err != nil {
		t.Fatal(err)
	}
	if partial == 0 || progress != 0 {
		t.Fatalf("at the crash the target holds %d rows of %d and %d progress rows, want some rows committed by the extra connections and no progress row",
			partial, want[0], progress)
	}
	c := startProxy(t, 3, fast...) // takes the lease over once it expires
	waitFor(t, ctx, pool, "SELECT lattice_rebalance_complete('big')", nil, func() error { return nil })
	if got := shardNodes(t, ctx, pool, "big")[0]; got != to+"/active" {
		t.Fatalf("after the move shard 0 is %s, want %s/active", got, to)
	}
	var got [4]int64
	if err := target.QueryRow(ctx, shard).Scan(&got[0], &got[1], &got[2], &got[3]); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("the moved shard holds (rows, keys, sum n, sum hash) %v, the source held %v", got, want)
	}
	var rows, sum int64
	if err := pool.QueryRow(ctx, "SELECT count(*), sum(n) FROM big").Scan(&rows, &sum); err != nil {
		t.Fatal(err)
	}
	if rows != 60000 || sum != 60000*60001/2 {
		t.Fatalf("tree big holds %d rows summing to %d after the move, want 60000 and %d", rows, sum, 60000*60001/2)
	}
	if want := `msg="shadow copy done"`; !strings.Contains(c.Log(), want) {
		t.Fatalf("the restarted proxy did not copy the shard again (no %q in its log)", want)
	}
	t.Logf("at the crash the target held %d of the shard's %d rows", partial, want[0])
}
