package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/migrator"
	"github.com/lattice-db/lattice/shardmap"
)

// sharedCluster is the harness's cluster as the fault helpers read it
// (readTreeRows, lockShard, shardMap); it stops nothing.
func sharedCluster(t *testing.T) *faultCluster {
	return &faultCluster{nodes: harness.nodes, store: harnessStore(t)}
}

// mergeTrees creates trees src and dst (k text primary key, v bigint, ts
// timestamptz) through pool: src with keys s-lo .. s-(hi-1), v = 1000+g,
// ts on 2020-01-01 for even g and 2020-01-02 for odd; dst with keys s-dlo
// .. s-(dhi-1), v = g, ts 2020-01-01 12:00.
func mergeTrees(t *testing.T, ctx context.Context, pool *pgxpool.Pool, src, dst string, lo, hi, dlo, dhi, shards int) {
	t.Helper()
	for _, q := range []string{
		"CREATE TABLE " + src + " (k text PRIMARY KEY, v bigint NOT NULL, ts timestamptz)",
		fmt.Sprintf("INSERT INTO %s SELECT 's-' || g, 1000 + g, '2020-01-01'::timestamptz + (g %% 2) * interval '1 day' FROM generate_series(%d, %d) g", src, lo, hi-1),
		fmt.Sprintf("SELECT lattice_create_tree('%s', 'k', shard_count => %d)", src, shards),
		"CREATE TABLE " + dst + " (k text PRIMARY KEY, v bigint NOT NULL, ts timestamptz, extra text DEFAULT 'kept')",
		fmt.Sprintf("INSERT INTO %s SELECT 's-' || g, g, '2020-01-01 12:00' FROM generate_series(%d, %d) g", dst, dlo, dhi-1),
		fmt.Sprintf("SELECT lattice_create_tree('%s', 'k', shard_count => %d)", dst, shards),
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// waitMerged polls lattice_merge_complete(dst) until it is true.
func waitMerged(t *testing.T, ctx context.Context, pool *pgxpool.Pool, dst string, timeout time.Duration) {
	t.Helper()
	pollUntil(t, timeout, "the merge into "+dst+" to complete", func() (bool, error) {
		var done bool
		err := pool.QueryRow(ctx, "SELECT lattice_merge_complete($1)", dst).Scan(&done)
		return done, err
	})
}

// treeValues reads k -> v of tree through the proxy.
func treeValues(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tree string) map[string]int64 {
	t.Helper()
	rows, err := pool.Query(ctx, "SELECT k, v FROM "+tree)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	var k string
	var v int64
	if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = v; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestMergeOnConflict merges one tree into another under each on_conflict
// rule, table-driven, and checks every row of the target against the rule,
// read through the proxy and straight from the shards (each key once, on
// the shard that owns its slot). Then each refusal: its SQLSTATE and a hint.
func TestMergeOnConflict(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := startProxy(t, 3, "--reshard-tick", "200ms")
	pool := proxyPool(t, ctx, p)
	fc := sharedCluster(t)
	// Source keys 0..199, target keys 100..299: 100..199 are in both.
	for i, tc := range []struct {
		rule string // "" for the default
		want func(g int) int64
	}{
		{"", func(g int) int64 { return 1000 + int64(g) }},
		{"source", func(g int) int64 { return 1000 + int64(g) }},
		{"target", func(g int) int64 { return int64(g) }},
		// The source's ts is a day apart on odd keys: newer than the
		// target's noon there, older on even ones.
		{"ts", func(g int) int64 {
			if g%2 == 1 {
				return 1000 + int64(g)
			}
			return int64(g)
		}},
	} {
		t.Run("rule="+tc.rule, func(t *testing.T) {
			src, dst := "msrc"+strconv.Itoa(i), "mdst"+strconv.Itoa(i)
			mergeTrees(t, ctx, pool, src, dst, 0, 200, 100, 300, 4)
			q := fmt.Sprintf("SELECT lattice_merge('%s', '%s')", src, dst)
			if tc.rule != "" {
				q = fmt.Sprintf("SELECT lattice_merge('%s', '%s', on_conflict => '%s')", src, dst, tc.rule)
			}
			var id string
			if err := pool.QueryRow(ctx, q).Scan(&id); err != nil || id == "" {
				t.Fatalf("%s: %q, %v", q, id, err)
			}
			waitMerged(t, ctx, pool, dst, time.Minute)
			got := treeValues(t, ctx, pool, dst)
			for g := 0; g < 300; g++ {
				want := int64(g) // a target row the source has not
				if g < 100 {
					want = 1000 + int64(g)
				} else if g < 200 {
					want = tc.want(g)
				}
				if v, ok := got["s-"+strconv.Itoa(g)]; !ok || v != want {
					t.Errorf("s-%d: v = %d (present %v), want %d", g, v, ok, want)
				}
			}
			if len(got) != 300 {
				t.Errorf("%d rows in the target, want 300", len(got))
			}
			tr, m, err := fc.shardMap(ctx, dst)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(readTreeRows(t, ctx, fc, tr, m)); n != 300 {
				t.Errorf("%d rows stored in the target's shards, want 300", n)
			}
			// A target column the source lacks keeps its value or default.
			var kept int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+dst+" WHERE extra = 'kept'").Scan(&kept); err != nil || kept != 300 {
				t.Errorf("extra = 'kept' on %d rows (%v), want 300", kept, err)
			}
		})
	}

	for _, q := range []string{
		"CREATE TABLE mint (k bigint PRIMARY KEY, v bigint)",
		"SELECT lattice_create_tree('mint', 'k', shard_count => 2)",
		"CREATE TABLE mnarrow (k text PRIMARY KEY, v bigint)",
		"SELECT lattice_create_tree('mnarrow', 'k', shard_count => 2)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, tc := range []struct{ q, code string }{
		{"SELECT lattice_merge('msrc0', 'mint')", "42804"},                         // key types differ
		{"SELECT lattice_merge('msrc0', 'mnarrow')", "42703"},                      // the target lacks ts
		{"SELECT lattice_merge('msrc0', 'msrc0')", "22023"},                        // one tree
		{"SELECT lattice_merge('msrc0', 'mdst0', on_conflict => 'nope')", "22023"}, // no such rule or column
		{"SELECT lattice_merge('msrc0', 'nosuch')", "42P01"},
	} {
		_, err := pool.Exec(ctx, tc.q)
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || pg.Code != tc.code || pg.Hint == "" {
			t.Errorf("%s: %v, want SQLSTATE %s with a hint", tc.q, err, tc.code)
		}
	}
}

// mergeEvent is the part of a tree event the merge tests read.
type mergeEvent struct {
	Event     string `json:"event"`
	Tree      string `json:"tree"`
	Operation string `json:"operation"`
}

// eventsUntil reads tree events on c, which LISTENs lattice_events, until
// one named last for tree arrives, and returns the names of tree's events.
func eventsUntil(t *testing.T, c *pgx.Conn, tree, last string) []string {
	t.Helper()
	var names []string
	for {
		var ev mergeEvent
		if err := json.Unmarshal([]byte(waitNote(t, c).Payload), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Tree != tree {
			continue
		}
		names = append(names, ev.Event)
		if ev.Event == last {
			return names
		}
	}
}

// holdFile creates a file for LATTICE_TEST_HOLD_AT and returns its path.
func holdFile(t *testing.T) string {
	t.Helper()
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return hold
}

// waitHeld waits until a run reached the hold point of file hold.
func waitHeld(t *testing.T, hold, what string) {
	t.Helper()
	pollUntil(t, time.Minute, what, func() (bool, error) {
		_, err := os.Stat(hold + ".reached")
		return err == nil, nil
	})
}

// TestMergeUnderShrink: a merge runs while a shrink folds the source. The
// merge is held (the test-only hook) once it has drained the first of the
// 4 source shards it recorded; the source is folded to 2 shards meanwhile,
// retiring recorded shards. Let go, the merge finds them gone, and drains
// the source's current shards again: the target ends with every source
// row exactly once, and the re-drain shows as an event and in the log.
func TestMergeUnderShrink(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hold := holdFile(t)
	p := startProxyEnv(t, 3, []string{"LATTICE_TEST_HOLD_AT=merge_shard_done:" + hold}, "--reshard-tick", "200ms")
	pool := proxyPool(t, ctx, p)
	fc := sharedCluster(t)
	listener, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	mustExec(t, listener, "LISTEN lattice_events")

	mergeTrees(t, ctx, pool, "ssrc", "sdst", 0, 2000, 5000, 5010, 4)
	if _, err := pool.Exec(ctx, "SELECT lattice_merge('ssrc', 'sdst')"); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, hold, "the merge to drain its first source shard")
	var phase string
	var done, total int32
	var eta *float64
	if err := pool.QueryRow(ctx, "SELECT phase, shards_done, shards_total, eta_seconds FROM lattice_merge_status('sdst')").Scan(&phase, &done, &total, &eta); err != nil ||
		phase != "copy" || done != 1 || total != 4 || eta == nil || *eta <= 0 {
		t.Fatalf("lattice_merge_status: phase %q, %d of %d shards done, ETA %v (%v); want copy, 1 of 4, an ETA", phase, done, total, eta, err)
	}
	// The page's API and lattice status show the merge with an ETA, the
	// status function's (the merge is held, so its estimate only grows).
	ops, lines := shownOperations(t, ctx, p, "sdst")
	if len(ops) != 1 || ops[0].Kind != "merge" || ops[0].Tree != "ssrc" || ops[0].ETASeconds == nil || *ops[0].ETASeconds < *eta {
		t.Errorf("/api/status shows the operations %+v of sdst; want the merge from ssrc with an ETA of at least %v", ops, *eta)
	} else if !regexp.MustCompile(`^merge \S+ of lattice/ssrc: phase copy, .* ETA ([0-9]+[hms])+$`).MatchString(lines[0]) {
		t.Errorf("lattice status shows the merge as %q", lines[0])
	}
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('ssrc', 2)"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitReshardComplete(t, ctx, pool, "ssrc", 2*time.Minute)
	t.Logf("the shrink of the source took %s", time.Since(start))
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	waitMerged(t, ctx, pool, "sdst", 2*time.Minute)
	t.Logf("the merge took %s after its hold", time.Since(start))
	if err := pool.QueryRow(ctx, "SELECT phase, eta_seconds FROM lattice_merge_status('sdst')").Scan(&phase, &eta); err != nil || phase != "idle" || eta == nil || *eta != 0 {
		t.Errorf("lattice_merge_status after the merge: %q, ETA %v (%v); want one idle row, ETA 0", phase, eta, err)
	}

	events := eventsUntil(t, listener, "sdst", "merge_completed")
	if strings.Join(events, ",") != "merge_started,merge_redrained,merge_completed" {
		t.Errorf("the target's events: %v, want merge_started, merge_redrained, merge_completed", events)
	}
	tr, m, err := fc.shardMap(ctx, "sdst")
	if err != nil {
		t.Fatal(err)
	}
	stored := readTreeRows(t, ctx, fc, tr, m) // each key once, on its slot's owner
	if len(stored) != 2010 {
		t.Errorf("%d rows in the target, want 2010", len(stored))
	}
	for g := 0; g < 2000; g++ {
		if r, ok := stored["s-"+strconv.Itoa(g)]; !ok || r.v != 1000+int64(g) {
			t.Fatalf("s-%d: %+v (present %v), want v = %d", g, r, ok, 1000+g)
		}
	}
	// Counters and the duration histogram, tagged with the target tree and
	// the tenant; the re-drain wrote the drained shard's rows once more.
	tt, sdst := []string{"tenant", "tree"}, map[string]string{"tree": "sdst", "tenant": "lattice"}
	checkMetrics(t, p, []metricCase{
		{"lattice_merge_started_total", tt, sdst, eq(1), "1 merge"},
		{"lattice_merge_completed_total", tt, sdst, eq(1), "1 merge"},
		{"lattice_merge_seconds", tt, sdst, eq(1), "1 merge"},
		{"lattice_merge_redrains_total", tt, sdst, eq(1), "1 re-drain"},
		{"lattice_merge_rows_total", tt, sdst, gt(2000), "every source row, and the first shard's again"},
	})
}

// TestMergeKill9MidCopy kills the proxy that runs a merge (SIGKILL, the
// test-only crash hook) inside its first transfer, with rows staged on a
// target node. Another proxy resumes the merge once it takes the source
// tree's lease, and completes it; every source row is in the
// target once, and nothing of the merge is left on the nodes: no
// lattice-merge session, no staging table.
func TestMergeKill9MidCopy(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fast := []string{"--reshard-lease", "3s", "--reshard-tick", "200ms"}
	b := startProxy(t, 3, append([]string{"--coordinator=false"}, fast...)...)
	a := startProxyEnv(t, 3, []string{"LATTICE_TEST_CRASH_AT=merge_copy"}, fast...)
	pool := proxyPool(t, ctx, b)
	mergeTrees(t, ctx, pool, "ksrc", "kdst", 0, 1000, 900, 1100, 4)
	apool := proxyPool(t, ctx, a)
	_, _ = apool.Exec(ctx, "SELECT lattice_merge('ksrc', 'kdst')") // its proxy may die before it answers
	if !a.WaitExit(time.Minute) {
		t.Fatal("the merge's proxy did not reach crash point merge_copy")
	}
	if err := a.crashedAt("merge_copy"); err != nil {
		t.Fatal(err)
	}
	c := startProxy(t, 3, fast...)
	waitMerged(t, ctx, pool, "kdst", 2*time.Minute)
	// The log line follows the record's removal.
	pollUntil(t, 30*time.Second, "the resuming proxy to log the merge's completion", func() (bool, error) {
		return strings.Contains(c.Log(), "kind=merge tree=ksrc tenant=lattice phase=copy resumed=true") && strings.Contains(c.Log(), `msg="merge completed"`), nil
	})
	fc := sharedCluster(t)
	tr, m, err := fc.shardMap(ctx, "kdst")
	if err != nil {
		t.Fatal(err)
	}
	stored := readTreeRows(t, ctx, fc, tr, m)
	if len(stored) != 1100 {
		t.Errorf("%d rows in the target, want 1100", len(stored))
	}
	for g := 0; g < 1000; g++ {
		if r := stored["s-"+strconv.Itoa(g)]; r.v != 1000+int64(g) {
			t.Fatalf("s-%d: v = %d, want %d", g, r.v, 1000+g)
		}
	}
	pollUntil(t, 30*time.Second, "no merge session or staging table on any node", func() (bool, error) {
		for i := range fc.nodes {
			conn, err := pgx.Connect(ctx, fc.nodeDSN(i))
			if err != nil {
				return false, err
			}
			var n int
			err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lattice-merge')
				+ (SELECT count(*) FROM pg_class WHERE relname = 'lattice_merge_stage')`).Scan(&n)
			conn.Close(ctx)
			if err != nil || n > 0 {
				return false, err
			}
		}
		return true, nil
	})
}

// TestMergeHoldsTargetFold is the interlock of a merge and a fold of its
// target: while a merge into a tree runs, the tree's fold neither freezes
// nor releases its donor. The fold is started first and kept in its drain
// by locks on the target's shards (its fence cannot be armed); then the
// merge starts and is held once it drained its first source shard. The
// fold must report itself held, stay unflipped once the locks are gone,
// and commit only after the merge completed; the target ends with every
// row once, on its slot's owner.
func TestMergeHoldsTargetFold(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hold := holdFile(t)
	p := startProxyEnv(t, 3, []string{"LATTICE_TEST_HOLD_AT=merge_shard_done:" + hold}, "--reshard-tick", "200ms")
	pool := proxyPool(t, ctx, p)
	fc := sharedCluster(t)
	listener, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	mustExec(t, listener, "LISTEN lattice_events")

	mergeTrees(t, ctx, pool, "isrc", "idst", 0, 400, 1000, 1200, 4)
	var releases []func()
	for i := range 4 {
		releases = append(releases, fc.lockShard(t, ctx, "idst", i, "ROW EXCLUSIVE"))
	}
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('idst', 3)"); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, time.Minute, "the target's fold to reach its drain", func() (bool, error) {
		phases, err := migrationPhases(ctx, fc, "idst")
		return len(phases) == 1 && phases[0] == shardmap.PhaseDrain, err
	})
	if _, err := pool.Exec(ctx, "SELECT lattice_merge('isrc', 'idst')"); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, hold, "the merge to drain its first source shard")
	pollUntil(t, time.Minute, "the fold to be held by the merge", func() (bool, error) {
		return strings.Contains(p.Log(), "fold held: a snapshot of the tree or a merge into it runs"), nil
	})
	for _, release := range releases {
		release()
	}
	if phases, err := migrationPhases(ctx, fc, "idst"); err != nil || len(phases) != 1 || phases[0] != shardmap.PhaseDrain {
		t.Fatalf("the fold's phases while the merge runs: %v (%v), want drain", phases, err)
	}
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	waitMerged(t, ctx, pool, "idst", 2*time.Minute)
	waitReshardComplete(t, ctx, pool, "idst", 2*time.Minute)
	events := strings.Join(eventsUntil(t, listener, "idst", "reshard_completed"), ",")
	if i, j := strings.Index(events, "merge_completed"), strings.Index(events, "migration_committed"); i < 0 || j < i {
		t.Errorf("the target's events %s: the fold committed before the merge completed", events)
	}
	tr, m, err := fc.shardMap(ctx, "idst")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(readTreeRows(t, ctx, fc, tr, m)); n != 600 {
		t.Errorf("%d rows in the target, want 600", n)
	}
}

// TestMergeIntoResharding: a merge routes rows by a map of the target that
// a split made stale before they are written. The merge is held right after
// it read the target's map; the target is then grown from 4 shards to 5 (a
// split flipped and released). Let go, the merge writes each row only where
// the shard's ownership record holds its slot and routes the rest again on
// the new map: every row once, on its slot's owner.
func TestMergeIntoResharding(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hold := holdFile(t)
	p := startProxyEnv(t, 3, []string{"LATTICE_TEST_HOLD_AT=merge_route:" + hold}, "--reshard-tick", "200ms")
	pool := proxyPool(t, ctx, p)
	fc := sharedCluster(t)
	mergeTrees(t, ctx, pool, "rsrc", "rdst", 0, 1000, 2000, 2100, 4)
	if _, err := pool.Exec(ctx, "SELECT lattice_merge('rsrc', 'rdst')"); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, hold, "the merge to read the target's map")
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('rdst', 5)"); err != nil {
		t.Fatal(err)
	}
	waitReshardComplete(t, ctx, pool, "rdst", 2*time.Minute)
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	waitMerged(t, ctx, pool, "rdst", 2*time.Minute)
	tr, m, err := fc.shardMap(ctx, "rdst")
	if err != nil {
		t.Fatal(err)
	}
	stored := readTreeRows(t, ctx, fc, tr, m) // each key once, on its slot's owner
	if len(stored) != 1100 {
		t.Errorf("%d rows in the target, want 1100", len(stored))
	}
}

// TestMergeRefusedRows: a merge whose target refuses a row for good (a
// source value its column type cannot take) stops as failed rather than
// retrying forever: lattice_merge_complete reports the error, the status
// shows it, the record holds no fold of the target, refuses no other merge
// from the source and is not run again, and lattice_merge run again once
// the row is fixed replaces it and merges every row. A failed merge whose
// source is dropped is forgotten.
func TestMergeRefusedRows(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := startProxy(t, 2, "--reshard-tick", "200ms")
	pool := proxyPool(t, ctx, p)
	for _, q := range []string{
		"CREATE TABLE mfs (id int PRIMARY KEY, v text)",
		"INSERT INTO mfs SELECT g, g::text FROM generate_series(1, 200) g",
		"UPDATE mfs SET v = 'abc' WHERE id = 150",
		"SELECT lattice_create_tree('mfs', 'id', shard_count => 4)",
		"CREATE TABLE mft (id int PRIMARY KEY, v int)",
		"SELECT lattice_create_tree('mft', 'id', shard_count => 4)",
		"CREATE TABLE mft2 (id int PRIMARY KEY, v text)",
		"SELECT lattice_create_tree('mft2', 'id', shard_count => 4)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var first string
	if err := pool.QueryRow(ctx, "SELECT lattice_merge('mfs', 'mft')").Scan(&first); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	pollUntil(t, 30*time.Second, "lattice_merge_complete('mft') to report the refused row", func() (bool, error) {
		var done bool
		err := pool.QueryRow(ctx, "SELECT lattice_merge_complete('mft')").Scan(&done)
		if done {
			t.Fatal("the merge completed without the refused row")
		}
		return errors.As(err, &pgErr), nil
	})
	if pgErr.Code != "55000" || !strings.Contains(pgErr.Message, "invalid input syntax for type integer") || !strings.Contains(pgErr.Hint, "lattice_merge('mfs', 'mft')") {
		t.Errorf("lattice_merge_complete: %s %q, hint %q", pgErr.Code, pgErr.Message, pgErr.Hint)
	}
	var phase, lastErr string
	if err := pool.QueryRow(ctx, "SELECT phase, last_error FROM lattice_merge_status('mft')").Scan(&phase, &lastErr); err != nil || phase != shardmap.OpFailed || lastErr == "" {
		t.Errorf("status: phase %q, last error %q (%v)", phase, lastErr, err)
	}
	if (migrator.TreeOpInterlocks{Store: harnessStore(t)}).HoldFold(ctx, "lattice", "mft") {
		t.Error("the failed merge holds the target's folds")
	}
	// Nor does it refuse another merge from its source.
	if _, err := pool.Exec(ctx, "SELECT lattice_merge('mfs', 'mft2')"); err != nil {
		t.Errorf("another merge from the failed merge's source: %v", err)
	} else {
		waitMerged(t, ctx, pool, "mft2", time.Minute)
	}
	time.Sleep(time.Second) // five ticks
	if n := strings.Count(p.Log(), `msg="tree operation run" op=`+first); n != 1 {
		t.Errorf("the failed merge ran %d times, want once", n)
	}

	if _, err := pool.Exec(ctx, "UPDATE mfs SET v = '150' WHERE id = 150"); err != nil {
		t.Fatal(err)
	}
	var second string
	if err := pool.QueryRow(ctx, "SELECT lattice_merge('mfs', 'mft')").Scan(&second); err != nil || second == first {
		t.Fatalf("lattice_merge again: %q (%v), want a new merge", second, err)
	}
	waitMerged(t, ctx, pool, "mft", time.Minute)
	var n, sum int64
	if err := pool.QueryRow(ctx, "SELECT count(*), sum(v) FROM mft").Scan(&n, &sum); err != nil || n != 200 || sum != 200*201/2 {
		t.Fatalf("mft holds %d rows summing to %d (%v), want 200 summing to %d", n, sum, err, 200*201/2)
	}

	// A merge that failed from a source dropped since is forgotten.
	for _, q := range []string{"UPDATE mfs SET v = 'abc' WHERE id = 150", "SELECT lattice_merge('mfs', 'mft')"} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	pollUntil(t, 30*time.Second, "the merge to fail again", func() (bool, error) {
		var phase string
		err := pool.QueryRow(ctx, "SELECT phase FROM lattice_merge_status('mft')").Scan(&phase)
		return phase == shardmap.OpFailed, err
	})
	if _, err := pool.Exec(ctx, "DROP TABLE mfs"); err != nil {
		t.Fatal(err)
	}
	waitMerged(t, ctx, pool, "mft", 30*time.Second)
	pollUntil(t, 30*time.Second, "the failed merge's record to go", func() (bool, error) {
		ops, err := harnessStore(t).TreeOps(ctx, "lattice", "mft")
		return len(ops) == 0, err
	})
}
