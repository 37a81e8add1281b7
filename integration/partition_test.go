package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/shardmap"
)

// TestPartitions runs the ledger workload through two proxies, each in a
// network namespace of its own, while reshards run, and partitions them
// with real packet drops (netns_test.go): the second proxy from Redis,
// both ways and each way alone, and the coordinator's proxy on a lossy,
// throttled link to every node, its replication connections included.
// Each reshard completes once its partition heals; the clients see only
// refusals with a SQLSTATE that says the statement did not run, or 08006
// for a statement the partition held back on its way to a node (its
// backend's socket gives up after 8 s, so that it cannot arrive after the
// heal), and only while a partition lasts (a held statement fails up to
// its 10 s hold later); and the ledger check passes at the end: nothing
// acknowledged is lost, duplicated or read stale.
func TestPartitions(t *testing.T) {
	requireNetNS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fc, nsA, nsB, poolA, poolB := startNetPair(t, ctx)
	load := &reshardLoad{keys: 20_000, ledger: &loadLedger{acked: map[string]loadEntry{}, deletes: map[string]int64{}},
		tolerate: []string{"57P03", "55000", "08006"}, pools: []*pgxpool.Pool{poolA, poolB}}
	admin := load.pools[0]
	stop, wg, errs := load.seedAndRun(t, ctx, 4)
	defer stop()
	loadFailed := func() {
		t.Helper()
		select {
		case err := <-errs:
			if err != nil {
				stop()
				t.Fatal(err)
			}
		default:
		}
	}

	redis := fc.redisPort(t)
	type window struct{ from, to time.Time }
	var windows []window
	shards := 4
	// lockAll locks every owning shard table of the tree in mode (see
	// lockTable) to hold its migrations in a phase: SHARE UPDATE EXCLUSIVE
	// in the copy, ROW EXCLUSIVE in the drain. Reads and writes go on.
	lockAll := func(mode string) (release func()) {
		_, m, err := fc.shardMap(ctx, "catalogue")
		if err != nil {
			t.Fatal(err)
		}
		var rels []func()
		for _, idx := range m.OwningShards() {
			rels = append(rels, fc.lockShard(t, ctx, "catalogue", idx, mode))
		}
		return func() {
			for _, r := range rels {
				r()
			}
		}
	}
	// coordinatorCutFrom waits for a migration in phase, cuts the
	// coordinator's proxy from the node that node picks of it, then lets
	// the migration go on into the partition.
	coordinatorCutFrom := func(phase shardmap.MigrationPhase, node func(*shardmap.Migration) string, held func()) func() {
		var mig *shardmap.Migration
		pollUntil(t, 60*time.Second, "a migration in phase "+string(phase), func() (bool, error) {
			migs, err := fc.store.Migrations(ctx, "lattice", "catalogue")
			for _, m := range migs {
				if m.Phase == phase {
					mig = m
				}
			}
			return mig != nil, err
		})
		i := int(node(mig)[1] - '1')
		heal := nsA.cut(t, fc.nodePort(i), cutBoth)
		time.Sleep(2 * time.Second)
		held()
		return heal
	}
	var held func()
	for _, sc := range []struct {
		name      string
		target    int
		ns        *netNS
		before    func() // before the reshard starts
		partition func() (heal func())
	}{
		{"proxy cut off from redis both ways", 6, nsB, nil, func() func() { return nsB.cut(t, redis, cutBoth) }},
		{"proxy's packets to redis dropped", 8, nsB, nil, func() func() { return nsB.cut(t, redis, cutOut) }},
		{"redis's packets to the proxy dropped", 6, nsB, nil, func() func() { return nsB.cut(t, redis, cutIn) }},
		{"proxy cut off from one node", 8, nsB, nil, func() func() { return nsB.cut(t, fc.nodePort(1), cutBoth) }},
		{"proxy cut off from redis and a node", 6, nsB, nil, func() func() {
			a, b := nsB.cut(t, redis, cutBoth), nsB.cut(t, fc.nodePort(2), cutBoth)
			return func() { b(); a() }
		}},
		{"proxy's packets to a node dropped", 4, nsB, nil, func() func() { return nsB.cut(t, fc.nodePort(0), cutOut) }},
		{"coordinator cut off from the target mid-copy", 6, nsA,
			func() { held = lockAll("SHARE UPDATE EXCLUSIVE") },
			func() func() {
				return coordinatorCutFrom(shardmap.PhaseCopy, func(m *shardmap.Migration) string { return m.TargetNode }, held)
			}},
		{"coordinator cut off from the source mid-drain", 8, nsA,
			func() { held = lockAll("ROW EXCLUSIVE") },
			func() func() {
				return coordinatorCutFrom(shardmap.PhaseDrain, func(m *shardmap.Migration) string { return m.SourceNode }, held)
			}},
		{"coordinator on a lossy, throttled link to every node", 4, nsA, nil, func() func() {
			var ports []int
			for i := range fc.nodes {
				ports = append(ports, fc.nodePort(i))
			}
			lossHeal, slowHeal := nsA.lossy(t, 0.05, ports...), nsA.throttle(t, "8mbit")
			return func() { lossHeal(); slowHeal() }
		}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			if sc.before != nil {
				sc.before()
			}
			if _, err := admin.Exec(ctx, "SELECT lattice_reshard('catalogue', $1)", sc.target); err != nil {
				t.Fatal(err)
			}
			pollUntil(t, 60*time.Second, "a migration to start", func() (bool, error) {
				phases, err := migrationPhases(ctx, fc, "catalogue")
				return len(phases) > 0, err
			})
			w := window{from: time.Now()}
			heal := sc.partition()
			// Longer than the proxy lease (5 s): a proxy cut off from
			// redis serves from its cached maps.
			time.Sleep(7 * time.Second)
			heal()
			w.to = time.Now()
			if sc.ns.dropped == 0 {
				t.Fatal("the partition dropped no packet")
			}
			t.Logf("the partition dropped %d packets", sc.ns.dropped)
			windows = append(windows, w)
			loadFailed()
			waitReshardComplete(t, ctx, admin, "catalogue", 2*time.Minute)
			loadFailed()
			shards = sc.target
			t.Logf("resharded to %d (%d writes, %d reads, %d refused so far)", sc.target, load.writes.Load(), load.reads.Load(), load.refused.Load())
		})
		if t.Failed() {
			stop()
			return
		}
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// A refusal comes while a partition lasts, or from a statement held
	// then (it fails after its 10 s hold), never otherwise.
	for _, at := range load.refusalTimes() {
		ok := false
		for _, w := range windows {
			if !at.Before(w.from) && !at.After(w.to.Add(12*time.Second)) {
				ok = true
			}
		}
		if !ok {
			t.Errorf("a client was refused at %s, outside every partition", at.Format(time.TimeOnly))
		}
	}
	if load.writes.Load() == 0 || load.reads.Load() == 0 {
		t.Fatalf("the load did nothing: %d writes, %d reads", load.writes.Load(), load.reads.Load())
	}
	t.Logf("%d writes, %d reads, %d refused", load.writes.Load(), load.reads.Load(), load.refused.Load())
	verifyLedgerOn(t, ctx, admin, fc.nodeDSNs(), load.ledger, shards)
}
