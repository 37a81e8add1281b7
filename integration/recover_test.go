package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// flushRedis empties the fault cluster's redis, as a restart without AOF
// or an operator's FLUSHALL would.
func (fc *faultCluster) flushRedis(t *testing.T, ctx context.Context) {
	t.Helper()
	rdb, err := redisClient(fc.redis.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("redis FLUSHALL: %v", err)
	}
}

// recoverMap runs `lattice recover-map` over the fault cluster and returns
// its output.
func (fc *faultCluster) recoverMap(t *testing.T, ctx context.Context) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, latticeBinary(t), fc.recoverArgs()...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("lattice recover-map: %v\n--- stdout ---\n%s--- stderr ---\n%s", err, out.String(), errOut.String())
	}
	t.Logf("lattice recover-map:\n%s", out.String())
	return out.String()
}

// recoverMapErr is recoverMap for a run that may fail: it returns the
// output, and the error's text with it.
func (fc *faultCluster) recoverMapErr(t *testing.T, ctx context.Context) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, latticeBinary(t), fc.recoverArgs()...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s\n(exit: %v)", out, err)
	}
	return string(out)
}

// recoverArgs are the arguments of `lattice recover-map` over the cluster.
func (fc *faultCluster) recoverArgs() []string {
	args := []string{"recover-map", "--redis", fc.redis.URL(), "--settle", "3s"}
	for i, dsn := range fc.nodeDSNs() {
		args = append(args, "--node", fmt.Sprintf("n%d=%s", i+1, dsn))
	}
	return args
}

// waitRefused waits until a read of tree through pool is refused with
// LT002, and fails the test if a read ever answers other than with every
// one of want's rows or LT002: a proxy must never serve a tenant whose maps
// are gone as one without trees.
func waitRefused(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tree string, want int) {
	t.Helper()
	pollUntil(t, 30*time.Second, "the proxy to refuse "+tree+" with LT002", func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tree).Scan(&n)
		switch {
		case err == nil && n == want:
			return false, nil // served from the maps cached before the flush
		case err == nil:
			return false, fmt.Errorf("count(*) of %s = %d after the flush, want %d or LT002", tree, n, want)
		case sqlState(err) == "LT002":
			return true, nil
		}
		return false, err
	})
}

// treeContents reads every row of tree through pool.
func treeContents(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tree string) map[string]int64 {
	t.Helper()
	rows, err := pool.Query(ctx, "SELECT k, v FROM "+tree)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		if _, dup := out[k]; dup {
			t.Fatalf("%s: key %s read twice", tree, k)
		}
		out[k] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRecoverMapIdle: FLUSHALL on an idle deployment, then `lattice
// recover-map`. Meanwhile the proxy refuses the tenant with LT002 rather
// than read the empty templates; afterwards every tree serves every row,
// at an epoch above every epoch before, with its registry entry as it was
// (the DDL log as the template's definition), and can be resharded again.
func TestRecoverMapIdle(t *testing.T) {
	fc := startFaultCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	p := fc.proxy(t, nil)
	pool := proxyPool(t, ctx, p)
	trees := map[string]map[string]int64{
		"rec_a": createFaultTreeIn(t, ctx, pool, "rec_a", 4000, 4),
		"rec_b": createFaultTreeIn(t, ctx, pool, "rec_b", 3000, 3),
	}
	// A fold and a split make a map that is not the identity, with a
	// retired index, and a map epoch past every ownership record's (the
	// split's release clears the source's mixed flag after the last
	// record); DDL makes the log longer than the creation.
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('rec_b', 2)"); err != nil {
		t.Fatal(err)
	}
	waitReshardComplete(t, ctx, pool, "rec_b", 90*time.Second)
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('rec_b', 3)"); err != nil {
		t.Fatal(err)
	}
	waitReshardComplete(t, ctx, pool, "rec_b", 90*time.Second)
	if _, err := pool.Exec(ctx, "ALTER TABLE rec_a ADD COLUMN note text DEFAULT 'n'"); err != nil {
		t.Fatal(err)
	}
	before := map[string]*shardmap.Map{}
	regs := map[string]*shardmap.Tree{}
	for name := range trees {
		tr, m, err := fc.shardMap(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		before[name], regs[name] = m, tr
	}

	deployment, err := fc.store.ClusterID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fc.flushRedis(t, ctx)
	for name, rows := range trees {
		waitRefused(t, ctx, pool, name, len(rows))
	}
	out := fc.recoverMap(t, ctx)
	// The proxy's presence sessions name the deployment that Redis lost.
	if got, err := fc.store.ClusterID(ctx); err != nil || got != deployment {
		t.Errorf("deployment id after recovery %q (%v), want %q as before", got, err, deployment)
	}
	for name := range trees {
		if !strings.Contains(out, "lattice/"+name+": rebuilt at epoch") {
			t.Errorf("recover-map did not report %s rebuilt", name)
		}
	}
	pollUntil(t, 30*time.Second, "the proxy to serve the recovered trees", func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM rec_a").Scan(&n)
		if sqlState(err) == "LT002" {
			return false, nil
		}
		return err == nil, err
	})
	for name, rows := range trees {
		got := treeContents(t, ctx, pool, name)
		if len(got) != len(rows) {
			t.Errorf("%s serves %d rows after recovery, want %d", name, len(got), len(rows))
		}
		for k, v := range rows {
			if got[k] != v {
				t.Errorf("%s: key %s = %d after recovery, want %d", name, k, got[k], v)
				break
			}
		}
		checkTreeAgainst(t, ctx, fc, name, rows, newInsertLedger())
		tr, m, err := fc.shardMap(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		old, reg := before[name], regs[name]
		if m.Epoch <= old.Epoch {
			t.Errorf("%s: epoch %d after recovery, not above %d before", name, m.Epoch, old.Epoch)
		}
		if m.HighWater < old.HighWater {
			t.Errorf("%s: high-water mark %d after recovery, below %d before", name, m.HighWater, old.HighWater)
		}
		if !slicesEqual(m.Slots, old.Slots) {
			t.Errorf("%s: the recovered slot map differs from the one before", name)
		}
		if tr.KeyColumn != reg.KeyColumn || tr.KeyType != reg.KeyType || tr.SlotCount != reg.SlotCount ||
			tr.ShardCount != reg.ShardCount || !tr.Created.Equal(reg.Created) || strings.Join(tr.Columns, ",") != strings.Join(reg.Columns, ",") {
			t.Errorf("%s: registry entry after recovery %+v, before %+v", name, tr, reg)
		}
	}
	// The rebuilt DDL log makes shards with the added column, and the
	// high-water mark hands out a new index.
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('rec_a', 5)"); err != nil {
		t.Fatal(err)
	}
	waitReshardComplete(t, ctx, pool, "rec_a", 90*time.Second)
	var note string
	if err := pool.QueryRow(ctx, "SELECT note FROM rec_a WHERE k = 'k-7'").Scan(&note); err != nil || note != "n" {
		t.Fatalf("note of k-7 after the reshard: %q, %v", note, err)
	}
	checkResharded(t, ctx, fc, pool, "rec_a", 5, trees["rec_a"], newInsertLedger())
	_, m, err := fc.shardMap(ctx, "rec_a")
	if err != nil {
		t.Fatal(err)
	}
	for idx := range m.Shards {
		if _, old := before["rec_a"].Shards[idx]; !old && idx < before["rec_a"].HighWater {
			t.Errorf("the split after recovery reused index %d, below the high-water mark %d", idx, before["rec_a"].HighWater)
		}
	}
}

func slicesEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// refusalCodes are the SQLSTATEs a client may see while the maps are
// missing: the refusal itself, and a statement held for frozen slots when
// Redis lost them. Neither ran the statement.
var refusalCodes = []string{"LT002", "55000"}

// TestRecoverMapMidReshard: FLUSHALL while a reshard runs under the ledger
// workload through two proxies, then `lattice recover-map`, which finishes
// the migrations that had fenced their source and rolls back the others.
// The clients see only refusals in between; afterwards the reshard is
// asked for again and completes, and the ledger check passes: nothing
// acknowledged is lost, duplicated or read stale.
func TestRecoverMapMidReshard(t *testing.T) {
	fc := startFaultCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	procs := []*proxyProc{fc.proxy(t, nil), fc.proxy(t, nil)}
	load := &reshardLoad{keys: 20_000, ledger: &loadLedger{acked: map[string]loadEntry{}, deletes: map[string]int64{}},
		tolerate: refusalCodes}
	for _, p := range procs {
		load.pools = append(load.pools, proxyPool(t, ctx, p))
	}
	admin := load.pools[0]
	stop, wg, errs := load.seedAndRun(t, ctx, 4)
	defer stop()
	// Shard 0's split is held in its copy (the lock keeps its publication
	// from being made) until Redis is flushed, so that the flush comes
	// with migrations flipped and one in flight: unheld, the four splits
	// ran from start to end in under a second, and a loaded run looked
	// before and after (ci-416).
	held := fc.lockShard(t, ctx, "catalogue", 0, "SHARE UPDATE EXCLUSIVE")
	if _, err := admin.Exec(ctx, "SELECT lattice_reshard('catalogue', 8)"); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 90*time.Second, "a migration to flip with others in flight", func() (bool, error) {
		phases, err := migrationPhases(ctx, fc, "catalogue")
		if err != nil {
			return false, err
		}
		flipped, flying := 0, 0
		for _, ph := range phases {
			switch ph {
			case shardmap.PhaseRelease, shardmap.PhaseDone:
				flipped++
			default:
				flying++
			}
		}
		return flipped > 0 && flying > 0, nil
	})
	fc.flushRedis(t, ctx)
	t.Log("redis flushed mid-reshard")
	held()
	pollUntil(t, 30*time.Second, "the proxies to refuse the tenant", func() (bool, error) {
		for _, pool := range load.pools {
			if _, err := pool.Exec(ctx, "SELECT 1"); sqlState(err) != "LT002" {
				return false, nil
			}
		}
		return true, nil
	})
	// The load must meet the outage too, not only the probe above.
	pollUntil(t, 30*time.Second, "the load to be refused while the maps are missing", func() (bool, error) {
		return load.refused.Load() > 0, nil
	})
	fc.recoverMap(t, ctx)
	if _, err := admin.Exec(ctx, "SELECT lattice_reshard('catalogue', 8)"); err != nil {
		t.Fatal(err)
	}
	waitReshardComplete(t, ctx, admin, "catalogue", 3*time.Minute)
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if load.writes.Load() == 0 || load.reads.Load() == 0 || load.refused.Load() == 0 {
		t.Fatalf("the load did not cross the outage: %d writes, %d reads, %d refusals",
			load.writes.Load(), load.reads.Load(), load.refused.Load())
	}
	t.Logf("%d writes, %d reads, %d refused while the maps were missing", load.writes.Load(), load.reads.Load(), load.refused.Load())
	verifyLedgerOn(t, ctx, admin, fc.nodeDSNs(), load.ledger, 8)
}

// TestRecoverMapFencedMigration: the coordinator's proxy dies with a
// migration's fence armed (before the flip, and after it), Redis loses its
// data, and `lattice recover-map` finishes the migration from the nodes:
// the stream drained, the target given the slots, the release done.
// Every row is served again, once, from its owner.
func TestRecoverMapFencedMigration(t *testing.T) {
	for _, point := range []string{"freeze", "flip"} {
		t.Run(point, func(t *testing.T) {
			fc := startFaultCluster(t, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			a := fc.proxy(t, []string{"LATTICE_TEST_CRASH_AT=" + point}, "--reshard-tick", "200ms")
			pool := proxyPool(t, ctx, a)
			initial := createFaultTreeIn(t, ctx, pool, "rec_f", 4000, 4)
			if _, err := pool.Exec(ctx, "SELECT lattice_reshard('rec_f', 5)"); err != nil {
				t.Fatal(err)
			}
			if !a.WaitExit(60 * time.Second) {
				t.Fatalf("the coordinator's proxy did not reach crash point %s", point)
			}
			if err := a.crashedAt(point); err != nil {
				t.Fatal(err)
			}
			fc.flushRedis(t, ctx)
			out := fc.recoverMap(t, ctx)
			if !strings.Contains(out, "lattice/rec_f: rebuilt at epoch") || !strings.Contains(out, "finished migrations") {
				t.Fatalf("recover-map did not finish the fenced migration:\n%s", out)
			}
			// Dropped only once recover-map compared the move from it.
			if n := writeLogsLeft(t, ctx, fc.nodeDSNs()); n != 0 {
				t.Fatalf("%d pieces of the target's write log left after recover-map", n)
			}
			b := fc.proxy(t, nil)
			got := treeContents(t, ctx, proxyPool(t, ctx, b), "rec_f")
			if len(got) != len(initial) {
				t.Errorf("%d rows served after recovery, want %d", len(got), len(initial))
			}
			checkResharded(t, ctx, fc, proxyPool(t, ctx, b), "rec_f", 5, initial, newInsertLedger())
		})
	}
}

// TestRecoverMapMove: the coordinator's proxy dies in a move of shard 0 to
// the other node, before its fence (at the drain: rolled back, the shard
// stays on its node) and after its flip (finished: the shard is on the new
// node), Redis loses its data, and `lattice recover-map` resolves the move
// from the nodes. The shard's table is then on exactly one node, the
// move's target table or the source table is gone with its schema's
// record, and every row is served once.
func TestRecoverMapMove(t *testing.T) {
	for _, tc := range []struct {
		point, outcome string
		moved          bool
	}{{"drain", "rolled back migrations", false}, {"flip", "finished migrations", true}} {
		t.Run(tc.point, func(t *testing.T) {
			fc := startFaultCluster(t, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			a := fc.proxy(t, []string{"LATTICE_TEST_CRASH_AT=" + tc.point}, "--reshard-tick", "200ms")
			pool := proxyPool(t, ctx, a)
			initial := createFaultTreeIn(t, ctx, pool, "rec_m", 2000, 4)
			_, m, err := fc.shardMap(ctx, "rec_m")
			if err != nil {
				t.Fatal(err)
			}
			from := m.Shards[0].Node
			to := map[string]string{"n1": "n2", "n2": "n1"}[from]
			if _, err := pool.Exec(ctx, "SELECT lattice_move_shard('rec_m', 0, $1)", to); err != nil {
				t.Fatal(err)
			}
			if !a.WaitExit(60 * time.Second) {
				t.Fatalf("the coordinator's proxy did not reach crash point %s", tc.point)
			}
			if err := a.crashedAt(tc.point); err != nil {
				t.Fatal(err)
			}
			fc.flushRedis(t, ctx)
			out := fc.recoverMap(t, ctx)
			if !strings.Contains(out, "lattice/rec_m: rebuilt at epoch") || !strings.Contains(out, tc.outcome) {
				t.Fatalf("recover-map did not report %s:\n%s", tc.outcome, out)
			}
			_, m, err = fc.shardMap(ctx, "rec_m")
			if err != nil {
				t.Fatal(err)
			}
			want := map[bool]string{false: from, true: to}[tc.moved]
			if m.Shards[0].Node != want {
				t.Errorf("shard 0 is on %s after recovery, want %s", m.Shards[0].Node, want)
			}
			for i := range fc.nodes {
				node := fmt.Sprintf("n%d", i+1)
				conn, err := pgx.Connect(ctx, fc.nodeDSN(i))
				if err != nil {
					t.Fatal(err)
				}
				var has bool
				err = conn.QueryRow(ctx, "SELECT to_regclass('lattice_s0000.rec_m') IS NOT NULL").Scan(&has)
				conn.Close(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if has != (node == want) {
					t.Errorf("node %s has shard 0's table: %v, want it only on %s", node, has, want)
				}
			}
			b := fc.proxy(t, nil)
			checkResharded(t, ctx, fc, proxyPool(t, ctx, b), "rec_m", 4, initial, newInsertLedger())
		})
	}
}

// TestRecoverMapVerifyFailed: a split's target gets a row changed mid-drain,
// past replication, and Redis loses its data either while the migration is
// held in verify_failed, or after the coordinator was killed between the
// flip and the comparison (so no comparison ran). Then `lattice
// recover-map` runs. The source's copy of the differing row is the only
// good one: the recovery refuses the tenant, naming the migration (and,
// having compared the move from the target's write log itself, its slot);
// nothing is written to Redis, so the tenant stays refused with LT002,
// rather than release the migration and make the corrupted copy the row.
// After the crash, the mismatch it found is recorded on the source, so the
// next recover-map refuses too.
func TestRecoverMapVerifyFailed(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "verify_failed", true: "crash_at_flip"}[crash], func(t *testing.T) {
			recoverVerifyFailed(t, crash)
		})
	}
}

func recoverVerifyFailed(t *testing.T, crash bool) {
	fc := startFaultCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"LATTICE_TEST_HOLD_AT=drain:" + hold}
	if crash {
		env = append(env, "LATTICE_TEST_CRASH_AT=flip")
	}
	a := fc.proxy(t, env, "--reshard-tick", "200ms")
	pool := proxyPool(t, ctx, a)
	initial := createFaultTreeIn(t, ctx, pool, "rec_v", 2000, 2)
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('rec_v', 3)"); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, time.Minute, "the split to reach its drain", func() (bool, error) {
		_, err := os.Stat(hold + ".reached")
		return err == nil, nil
	})
	tr, _, err := fc.shardMap(ctx, "rec_v")
	if err != nil {
		t.Fatal(err)
	}
	migs, err := fc.store.Migrations(ctx, "lattice", "rec_v")
	if err != nil || len(migs) != 1 {
		t.Fatalf("migrations %v, %v", migs, err)
	}
	mig := migs[0]
	target, err := pgx.Connect(ctx, fc.nodeDSN(nodeIndex(mig.TargetNode)))
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close(ctx)
	var key string
	table := pgshard.ShardTable(tr, mig.Target)
	if _, err := target.Exec(ctx, "SET session_replication_role = replica"); err != nil {
		t.Fatal(err)
	}
	if err := target.QueryRow(ctx, fmt.Sprintf("UPDATE %s SET v = -1 WHERE k = (SELECT min(k) FROM %s) RETURNING k", table, table)).Scan(&key); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	want := "migration " + mig.ID + " of tree rec_v failed its verification"
	if crash {
		if !a.WaitExit(time.Minute) {
			t.Fatal("the coordinator's proxy did not reach crash point flip")
		}
		if err := a.crashedAt("flip"); err != nil {
			t.Fatal(err)
		}
		slot, err := shardmap.SlotForText(tr.KeyType, []byte(key), tr.SlotCount)
		if err != nil {
			t.Fatal(err)
		}
		want = fmt.Sprintf("migration %s of tree rec_v: slots %d differ", mig.ID, slot)
	} else {
		pollUntil(t, time.Minute, "the split to fail its verification", func() (bool, error) {
			migs, err := fc.store.Migrations(ctx, "lattice", "rec_v")
			return len(migs) == 1 && migs[0].Phase == shardmap.PhaseVerifyFailed, err
		})
	}
	fc.flushRedis(t, ctx)
	out := fc.recoverMapErr(t, ctx)
	b := fc.proxy(t, nil)
	var v int64
	err = proxyPool(t, ctx, b).QueryRow(ctx, "SELECT v FROM rec_v WHERE k = $1", key).Scan(&v)
	switch {
	case err == nil && v != initial[key]:
		t.Fatalf("after recovery %s reads v = %d, the target's corrupted copy; the source had %d: the recovery released a move that failed its verification", key, v, initial[key])
	case sqlState(err) != "LT002":
		t.Fatalf("after recovery %s reads %d, %v; want the tenant refused with LT002", key, v, err)
	case !strings.Contains(out, want):
		t.Fatalf("recover-map did not say %q:\n%s", want, out)
	}
	t.Logf("recover-map refused:\n%s", out)
	if again := fc.recoverMapErr(t, ctx); crash && !strings.Contains(again, "migration "+mig.ID+" of tree rec_v failed its verification") {
		t.Fatalf("the second recover-map did not refuse the migration its first found differing:\n%s", again)
	}
}

// TestEmbeddedRedisRestart: without --redis the shard maps live in the
// process only. A proxy started again over the same nodes, as `make demo`
// run twice is, rebuilds them from the nodes before it serves: the tree
// and its rows are there, and it takes new writes.
func TestEmbeddedRedisRestart(t *testing.T) {
	resetNodes(t)
	ctx := context.Background()
	nodes := []string{testNodeDSN(t, 0), testNodeDSN(t, 1)}
	first := startProxyOn(t, "", nodes, nil)
	c := connect(t, first.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE kept (k bigint PRIMARY KEY, v text)`)
	mustExec(t, c, `SELECT lattice_create_tree('kept', 'k', shard_count => 4)`)
	mustExec(t, c, `INSERT INTO kept SELECT g, 'v' || g FROM generate_series(1, 200) g`)
	c.Close(ctx)
	first.Kill()

	again := startProxyOn(t, "", nodes, nil)
	if !strings.Contains(again.Log(), "shard maps rebuilt from the nodes") {
		t.Errorf("the second proxy logged no rebuilt map:\n%s", again.Log())
	}
	c = connect(t, again.DSN("lattice"))
	mustExec(t, c, `INSERT INTO kept VALUES (201, 'after the restart')`)
	var n, shards int64
	if err := c.QueryRow(ctx, `SELECT count(*) FROM kept`).Scan(&n); err != nil || n != 201 {
		t.Fatalf("count after the restart: %d, %v; want 201", n, err)
	}
	if err := c.QueryRow(ctx, `SELECT count(*) FROM lattice_shards('kept')`).Scan(&shards); err != nil || shards != 4 {
		t.Fatalf("shards after the restart: %d, %v; want 4", shards, err)
	}
}
