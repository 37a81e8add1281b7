package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/shardmap"
)

// shardLayout is what a node says of one shard table's layout.
type shardLayout struct {
	idx   int
	node  string
	table []string // pg_class.reloptions of the table
	pkey  []string // of its primary key's index
	bytes int64    // pg_relation_size of the table (its heap)
}

// shardLayouts reads the layout of every shard of tree that owns slots, on
// the nodes directly.
func shardLayouts(t *testing.T, ctx context.Context, tree string) []shardLayout {
	t.Helper()
	_, m := storedTree(t, ctx, harnessStore(t), tree)
	var out []shardLayout
	for _, idx := range m.OwningShards() {
		sh := m.Shards[idx]
		c := connect(t, testNodeDSN(t, nodeIndex(sh.Node)))
		l := shardLayout{idx: idx, node: sh.Node}
		table := fmt.Sprintf("%s.%s", shardmap.SchemaName(idx), tree)
		if err := c.QueryRow(ctx, `SELECT coalesce(c.reloptions, '{}'), coalesce(ic.reloptions, '{}'), pg_relation_size(c.oid)
FROM pg_class c JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary JOIN pg_class ic ON ic.oid = i.indexrelid
WHERE c.oid = $1::regclass`, table).Scan(&l.table, &l.pkey, &l.bytes); err != nil {
			t.Fatalf("layout of %s on %s: %v", table, sh.Node, err)
		}
		c.Close(ctx)
		out = append(out, l)
	}
	return out
}

// checkLayout fails unless every shard of tree has the table and primary
// key storage parameters want and pkey.
func checkLayout(t *testing.T, ctx context.Context, tree string, table, pkey []string) []shardLayout {
	t.Helper()
	ls := shardLayouts(t, ctx, tree)
	for _, l := range ls {
		if !slices.Equal(l.table, table) || !slices.Equal(l.pkey, pkey) {
			t.Errorf("shard %d on %s: reloptions %v, primary key %v; want %v, %v", l.idx, l.node, l.table, l.pkey, table, pkey)
		}
	}
	return ls
}

// noShardTablesBeyond fails when a node holds a table of tree in a shard
// schema the map does not route to (a resize's target or source left over).
func noShardTablesBeyond(t *testing.T, ctx context.Context, tree string) {
	t.Helper()
	_, m := storedTree(t, ctx, harnessStore(t), tree)
	for i := range 3 {
		c := connect(t, testNodeDSN(t, i))
		rows, err := c.Query(ctx, `SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = $1 AND n.nspname LIKE 'lattice\_s%' AND c.relkind = 'r'`, tree)
		if err != nil {
			t.Fatal(err)
		}
		schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range schemas {
			found := false
			for _, idx := range m.OwningShards() {
				found = found || shardmap.SchemaName(idx) == s && m.Shards[idx].Node == fmt.Sprintf("n%d", i+1)
			}
			if !found {
				t.Errorf("node n%d holds %s.%s, which the map does not route to", i+1, s, tree)
			}
		}
		c.Close(ctx)
	}
}

// TestResize is the resize's proof under the ledger load: every shard of a
// tree is rewritten online into a fresh table with fillfactor 50, index
// fillfactor 60 and deduplication off. pg_class.reloptions shows the layout
// on every shard, the heap takes about twice the pages (the rows already
// there were rewritten, not only new pages), the ledger holds and no client
// saw an error; the events came; a shard a split makes afterwards has the
// layout too.
func TestResize(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3, "--reshard-tick", "200ms")
	// After the start: the first start of a test run builds the binary.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	listener := connect(t, p.DSN("lattice"))
	mustExec(t, listener, "LISTEN lattice_events")
	load := newLoad(t, ctx, []*pgxpool.Pool{pool}, 6000, 4)
	var before int64
	for _, l := range checkLayout(t, ctx, "catalogue", []string{}, []string{}) {
		before += l.bytes
	}

	failed, finish := load.run(ctx)
	var msg string
	if err := pool.QueryRow(ctx, "SELECT lattice_resize('catalogue', fillfactor => 50, index_fillfactor => 60, deduplicate => false)").Scan(&msg); err != nil {
		finish()
		t.Fatal(err)
	}
	waitFor(t, ctx, pool, "SELECT lattice_resize_complete('catalogue')", failed, finish)
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if load.writes.Load() == 0 || load.reads.Load() == 0 {
		t.Fatalf("the load did nothing: %d writes, %d reads", load.writes.Load(), load.reads.Load())
	}
	verifyReshardedTree(t, ctx, pool, load.ledger, 4)
	noShardTablesBeyond(t, ctx, "catalogue")
	table, pkey := []string{"fillfactor=50"}, []string{"fillfactor=60", "deduplicate_items=off"}
	var template []string
	if err := connect(t, testNodeDSN(t, 0)).QueryRow(ctx, "SELECT reloptions FROM pg_class WHERE oid = 'public.catalogue'::regclass").Scan(&template); err != nil || !slices.Equal(template, table) {
		t.Errorf("the template's reloptions %v (%v), want %v", template, err, table)
	}
	var after int64
	for _, l := range checkLayout(t, ctx, "catalogue", table, pkey) {
		after += l.bytes
	}
	t.Logf("%s: heap %d bytes before, %d after; %d writes, %d reads", msg, before, after, load.writes.Load(), load.reads.Load())
	if after < before*3/2 {
		t.Errorf("the shards' heaps take %d bytes after the resize to fillfactor 50, %d before: the rows were not rewritten", after, before)
	}
	var got []string
	for len(got) < 2 {
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := listener.WaitForNotification(wctx)
		wcancel()
		if err != nil {
			t.Fatalf("events %v, then: %v", got, err)
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(n.Payload), &ev); err != nil {
			t.Fatal(err)
		}
		if e := ev["event"].(string); strings.HasPrefix(e, "resize_") {
			got = append(got, fmt.Sprintf("%s %v", e, ev["layout"]))
		}
	}
	want := []string{"resize_started map[deduplicate:false fillfactor:50 index_fillfactor:60]", "resize_completed map[deduplicate:false fillfactor:50 index_fillfactor:60]"}
	if !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	// Counters and the duration histogram, tagged with the tree and tenant.
	tt, cat := []string{"tenant", "tree"}, map[string]string{"tree": "catalogue", "tenant": "lattice"}
	checkMetrics(t, p, []metricCase{
		{"lattice_resize_started_total", tt, cat, eq(1), "1 resize"},
		{"lattice_resize_completed_total", tt, cat, eq(1), "1 resize"},
		{"lattice_resize_seconds", tt, cat, eq(1), "1 resize"},
		{"lattice_resize_shards_total", []string{"outcome", "tenant", "tree"}, map[string]string{"tree": "catalogue", "outcome": "resized"}, eq(4), "its 4 shards"},
	})

	// A shard made later by a split is created with the tree's layout.
	mustExec(t, listener, "SELECT lattice_reshard('catalogue', 5)")
	waitReshardComplete(t, ctx, pool, "catalogue", 2*time.Minute)
	checkLayout(t, ctx, "catalogue", table, pkey)
}

// resizeHold starts a proxy whose resize migrations wait, drained and not
// frozen (only forwarding their shards), while the returned file exists,
// and whose migrations of every kind wait at their drain while drain
// exists (nil: no such hold).
func resizeHold(t *testing.T, holdDrain bool) (p *proxyProc, resize, drain string) {
	t.Helper()
	dir := t.TempDir()
	resize, drain = filepath.Join(dir, "resize"), filepath.Join(dir, "drain")
	env := "LATTICE_TEST_HOLD_AT=resize:" + resize
	files := []string{resize}
	if holdDrain {
		env += ",drain:" + drain
		files = append(files, drain)
	}
	for _, f := range files {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return startProxyEnv(t, 3, []string{env}, "--reshard-tick", "200ms", "--max-concurrent-migrations", "3"), resize, drain
}

func waitReached(t *testing.T, hold string) {
	t.Helper()
	pollUntil(t, 2*time.Minute, "a migration to reach "+filepath.Base(hold), func() (bool, error) {
		_, err := os.Stat(hold + ".reached")
		return err == nil, nil
	})
}

// TestResizeRefusesReshard: while a resize runs on a tree, lattice_reshard
// of it to a count that needs a migration is refused with 55000 and counted
// rejected with reason resize_in_flight; a count it already has is not
// refused; and an empty tree is re-pinned even while a resize runs on it,
// the empty-tree path being decided first. Both resizes then complete and
// leave nothing behind.
func TestResizeRefusesReshard(t *testing.T) {
	resetNodes(t)
	p, hold, _ := resizeHold(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	pool := proxyPool(t, ctx, p)
	createFaultTreeIn(t, ctx, pool, "catalogue", 2000, 4)
	createFaultTreeIn(t, ctx, pool, "hollow", 0, 4)
	mustExec(t, c, "SELECT lattice_resize('catalogue', fillfactor => 70)")
	mustExec(t, c, "SELECT lattice_resize('hollow', fillfactor => 70)")
	waitReached(t, hold)

	_, err := c.Exec(ctx, "SELECT lattice_reshard('catalogue', 6)")
	if sqlState(err) != "55000" || !strings.Contains(err.Error(), "resize") {
		t.Fatalf("reshard during a resize: %v, want 55000", err)
	}
	rejected, _ := familySum(scrape(t, p)["lattice_shard_root_reshard_rejected_total"], map[string]string{"tree": "catalogue", "reason": "resize_in_flight"})
	if rejected != 1 {
		t.Errorf("rejected with reason resize_in_flight counted %v, want 1", rejected)
	}
	var msg string
	if err := c.QueryRow(ctx, "SELECT lattice_reshard('catalogue', 4)").Scan(&msg); err != nil {
		t.Errorf("reshard to the count the tree has, during a resize: %v", err)
	}
	if err := c.QueryRow(ctx, "SELECT lattice_reshard('hollow', 2)").Scan(&msg); err != nil || !strings.Contains(msg, "re-pinned") {
		t.Fatalf("empty tree during a resize: %q, %v; want it re-pinned", msg, err)
	}
	var done bool
	if err := c.QueryRow(ctx, "SELECT lattice_resize_complete('catalogue')").Scan(&done); err != nil || done {
		t.Fatalf("lattice_resize_complete while held: %v, %v", done, err)
	}
	// Its status, composed as the other status functions compose: three
	// shards in flight (--max-concurrent-migrations), none done, no ETA yet.
	var total, flying int
	var eta *float64
	if err := c.QueryRow(ctx, `SELECT shards_total, migrations_in_flight, eta_seconds FROM lattice_resize_status('catalogue') s
		WHERE s.phase = 'rewrite' AND s.layout = 'fillfactor => 70' AND s.shards_done = 0`).Scan(&total, &flying, &eta); err != nil || total != 4 || flying != 3 || eta != nil {
		t.Errorf("lattice_resize_status while held: %d shards, %d in flight, ETA %v, %v; want 4, 3, NULL", total, flying, eta, err)
	}
	// The page's API and lattice status show it running, with the ETA
	// of its status: none yet.
	ops, lines := shownOperations(t, ctx, p, "catalogue")
	if len(ops) != 1 || ops[0].Kind != "resize" || ops[0].Phase != "rewrite" || ops[0].ETASeconds != nil {
		t.Errorf("/api/status shows the operations %+v of catalogue; want its resize in rewrite, ETA null", ops)
	} else if !strings.Contains(lines[0], "lattice/catalogue: phase rewrite") || !strings.HasSuffix(lines[0], "ETA unknown") {
		t.Errorf("lattice status shows the resize as %q", lines[0])
	}

	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	for _, tree := range []string{"catalogue", "hollow"} {
		pollUntil(t, 2*time.Minute, "the resize of "+tree+" to complete", func() (bool, error) {
			err := c.QueryRow(ctx, "SELECT lattice_resize_complete($1)", tree).Scan(&done)
			return done, err
		})
		checkLayout(t, ctx, tree, []string{"fillfactor=70"}, []string{})
		noShardTablesBeyond(t, ctx, tree)
	}
	if _, m := storedTree(t, ctx, harnessStore(t), "hollow"); m.DistinctShards() != 2 {
		t.Errorf("hollow has %d shards after its re-pin and resize, want 2", m.DistinctShards())
	}
	noShadowLeft(t, ctx)
}

// noShadowLeft waits until no node holds a replication slot, publication
// or fence of a migration.
func noShadowLeft(t *testing.T, ctx context.Context) {
	t.Helper()
	pollUntil(t, 30*time.Second, "the migrations' slots, publications and fences to be dropped", func() (bool, error) {
		for i := range 3 {
			c, err := pgx.Connect(ctx, testNodeDSN(t, i))
			if err != nil {
				return false, err
			}
			var n int
			err = c.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_publication)
				+ (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lattice_fence_m_%')`).Scan(&n)
			c.Close(ctx)
			if err != nil || n > 0 {
				return false, err
			}
		}
		return true, nil
	})
}

// TestFoldOfResizedDonor: a resize is not waited for. A shrink that started
// before the resize folds, in its second wave, the shard the resize is
// forwarding (held drained, before its freeze): the donor refuses
// retirement and keeps its table, and the fold completes routing-only. Once
// let go, the resize gives that shard up, drops the donor's table and its
// own target, and rewrites the rest.
func TestFoldOfResizedDonor(t *testing.T) {
	resetNodes(t)
	p, hold, drain := resizeHold(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	pool := proxyPool(t, ctx, p)
	createFaultTreeIn(t, ctx, pool, "catalogue", 2000, 5)
	// Shard 2 four times as heavy: the first wave folds 0+1 and 3+4, and
	// leaves shard 2 to the resize; the second has only pairs with it.
	tr, m := storedTree(t, ctx, harnessStore(t), "catalogue")
	for _, k := range keysOn(t, tr, m, "heavy-", 1200, func(_ int, sh shardmap.Shard) bool { return sh.Index == 2 }) {
		mustExec(t, c, "INSERT INTO catalogue VALUES ($1, 0, 'x')", k)
	}
	for i := range 3 {
		mustExec(t, connect(t, testNodeDSN(t, i)), "ANALYZE")
	}
	mustExec(t, c, "SELECT lattice_reshard('catalogue', 2)")
	pollUntil(t, time.Minute, "the first wave of folds", func() (bool, error) {
		migs, err := harnessStore(t).Migrations(ctx, "lattice", "catalogue")
		return len(migs) == 2, err
	})
	mustExec(t, c, "SELECT lattice_resize('catalogue', fillfactor => 60)")
	var resize *shardmap.Migration
	pollUntil(t, time.Minute, "the resize of shard 2", func() (bool, error) {
		migs, err := harnessStore(t).Migrations(ctx, "lattice", "catalogue")
		for _, mg := range migs {
			if mg.Kind == shardmap.Resize {
				resize = mg
			}
		}
		return resize != nil, err
	})
	if resize.Source != 2 {
		t.Fatalf("the resize took shard %d, want 2", resize.Source)
	}
	if err := os.Remove(drain); err != nil {
		t.Fatal(err)
	}
	waitReached(t, hold)
	waitReshardComplete(t, ctx, pool, "catalogue", 2*time.Minute)

	routingOnly, _ := familySum(scrape(t, p)["lattice_fold_routing_only_total"], map[string]string{"tree": "catalogue", "reason": "resize_in_flight"})
	if routingOnly != 1 {
		t.Errorf("routing-only folds %v, want 1", routingOnly)
	}
	_, m = storedTree(t, ctx, harnessStore(t), "catalogue")
	if m.Shards[2].State != shardmap.ShardRetired {
		t.Fatalf("shard 2 is %s after the shrink, want retired", m.Shards[2].State)
	}
	var kept bool
	n := connect(t, testNodeDSN(t, nodeIndex(resize.SourceNode)))
	if err := n.QueryRow(ctx, "SELECT to_regclass('lattice_s0002.catalogue') IS NOT NULL").Scan(&kept); err != nil || !kept {
		t.Fatalf("the donor a resize forwards lost its table (%v, %v): it must keep its storage", kept, err)
	}

	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 2*time.Minute, "the resize to complete", func() (bool, error) {
		var done bool
		err := c.QueryRow(ctx, "SELECT lattice_resize_complete('catalogue')").Scan(&done)
		return done, err
	})
	if err := n.QueryRow(ctx, "SELECT to_regclass('lattice_s0002.catalogue') IS NOT NULL").Scan(&kept); err != nil || kept {
		t.Errorf("the retired donor's table is left after the resize gave it up (%v, %v)", kept, err)
	}
	checkLayout(t, ctx, "catalogue", []string{"fillfactor=60"}, []string{})
	noShardTablesBeyond(t, ctx, "catalogue")
	noShadowLeft(t, ctx)
	if !strings.Contains(p.Log(), "resize of a shard a fold retired given up") {
		t.Error("the proxy's log does not show the resize giving the retired shard up")
	}
	var rows int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM catalogue").Scan(&rows); err != nil || rows != 3200 {
		t.Errorf("the tree holds %d rows (%v), want 3200", rows, err)
	}
}

// TestResizeCrash kills the proxy that runs a resize (SIGKILL, the
// test-only hook) in the middle of a shard's copy, under the ledger load. A
// new proxy takes the tree's lease over, resumes the resize and completes
// it: every shard has the layout, the ledger holds, no client saw an error,
// and nothing of a migration or a replaced shard is left.
func TestResizeCrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, load := crashRun(t, ctx, "copy", "SELECT lattice_resize('catalogue', fillfactor => 80)", "SELECT lattice_resize_complete('catalogue')")
	verifyReshardedTree(t, ctx, pool, load.ledger, 8)
	checkLayout(t, ctx, "catalogue", []string{"fillfactor=80"}, []string{})
	noShardTablesBeyond(t, ctx, "catalogue")
	t.Logf("%d writes, %d reads", load.writes.Load(), load.reads.Load())
}

// TestGroupResizeCrash is TestResizeCrash on a colocation group: the
// resize is called on reviews, a member colocated with catalogue, so each
// shard's migration rewrites both members' tables, and its proxy is killed
// in the middle of a shard's copy. The proxy that takes the group's lease
// over resumes and completes it: both members have the layout on every
// shard, the ledger holds, no client saw an error, reviews kept its rows,
// rows of equal keys are still on one shard, and nothing is left behind.
func TestGroupResizeCrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, load := crashRun(t, ctx, "copy", "SELECT lattice_resize('reviews', fillfactor => 80)", "SELECT lattice_resize_complete('catalogue')",
		"CREATE TABLE reviews (k text, n int, body text, PRIMARY KEY (k, n))",
		"INSERT INTO reviews SELECT 'c-' || (g % 20000), g, md5(g::text) FROM generate_series(0, 29999) g",
		"SELECT lattice_create_tree('reviews', 'k', colocate_with => 'catalogue')")
	verifyReshardedTree(t, ctx, pool, load.ledger, 8)
	for _, member := range []string{"catalogue", "reviews"} {
		checkLayout(t, ctx, member, []string{"fillfactor=80"}, []string{})
		noShardTablesBeyond(t, ctx, member)
	}
	var rows, sum int64
	if err := pool.QueryRow(ctx, "SELECT count(*), sum(n) FROM reviews").Scan(&rows, &sum); err != nil || rows != 30000 || sum != 29999*30000/2 {
		t.Errorf("reviews holds %d rows summing %d (%v), want 30000 summing %d", rows, sum, err, 29999*30000/2)
	}
	// The keys are 'c-' and a number: coPlacement reads them as numbers.
	// The load deletes some of catalogue's keys: those are not compared.
	nodes := []*pgx.Conn{connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1)), connect(t, testNodeDSN(t, 2))}
	cat := coPlacement(t, ctx, nodes, "catalogue", "substr(k, 3)")
	compared := 0
	for k, at := range coPlacement(t, ctx, nodes, "reviews", "substr(k, 3)") {
		if c, ok := cat[k]; ok {
			compared++
			if c != at {
				t.Fatalf("key c-%d: reviews is on %s, catalogue on %s", k, at, c)
			}
		}
	}
	if compared < 10_000 {
		t.Errorf("only %d keys of reviews found in catalogue", compared)
	}
	noShadowLeft(t, ctx)
	t.Logf("%d writes, %d reads", load.writes.Load(), load.reads.Load())
}
