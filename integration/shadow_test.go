package integration

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/migrator"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// shadowWriter changes known keys of the source shard and remembers the
// last acknowledged value of each, so the target can be checked against it.
type shadowWriter struct {
	pool *pgxpool.Pool
	mu   sync.Mutex
	last map[string]*int // nil: deleted
	// cut are keys whose write the end of the run cut off: it may have
	// committed without being acknowledged, so the ledger cannot tell.
	cut map[string]bool
}

func (w *shadowWriter) run(ctx context.Context, table string, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 1))
	for ctx.Err() == nil {
		// Each writer owns its keys, so the ledger records a key's writes
		// in the order they committed.
		k := fmt.Sprintf("k%05d", rng.IntN(30000/4)*4+int(seed))
		v := rng.IntN(1 << 20)
		var err error
		switch rng.IntN(4) {
		case 0:
			_, err = w.pool.Exec(ctx, "DELETE FROM "+table+" WHERE k = $1", k)
			if err == nil {
				w.record(k, nil)
			}
		case 1:
			// Updates only v: the large pad column stays an unchanged
			// TOAST value in the stream.
			var tag string
			err = w.pool.QueryRow(ctx, "WITH u AS (UPDATE "+table+" SET v = $2 WHERE k = $1 RETURNING 1) SELECT count(*)::text FROM u", k, v).Scan(&tag)
			if err == nil && tag == "1" {
				w.record(k, &v)
			}
		default:
			_, err = w.pool.Exec(ctx, "INSERT INTO "+table+" (k, v, pad) VALUES ($1, $2, $3) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v", k, v, strings.Repeat("p", 10))
			if err == nil {
				w.record(k, &v)
			}
		}
		if err != nil && ctx.Err() != nil {
			w.mu.Lock()
			w.cut[k] = true
			w.mu.Unlock()
		}
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

func (w *shadowWriter) record(k string, v *int) {
	w.mu.Lock()
	w.last[k] = v
	w.mu.Unlock()
}

// shadowTables makes shard 0 of tree name on node 0 and shard 1 on node 1,
// both empty, and returns the tree and the two tables.
func shadowTables(t *testing.T, ctx context.Context, name string) (tree *shardmap.Tree, src, dst string) {
	t.Helper()
	tree = &shardmap.Tree{Tenant: "lattice", Name: name, KeyColumn: "k", KeyType: shardmap.KeyText, SlotCount: 4096}
	src, dst = pgshard.ShardTable(tree, 0), pgshard.ShardTable(tree, 1)
	for i, table := range []string{src, dst} {
		c, err := pgx.Connect(ctx, testNodeDSN(t, i))
		if err != nil {
			t.Fatal(err)
		}
		schema := strings.Split(table, ".")[0]
		for _, q := range []string{"CREATE SCHEMA IF NOT EXISTS " + schema, "CREATE TABLE " + table + " (k text PRIMARY KEY, v int NOT NULL, pad text)"} {
			if _, err := c.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		c.Close(ctx)
	}
	return tree, src, dst
}

// TestShadowGhostBatch: a run of a shadow copy gives up while its apply
// batch is still in the network (a forwarder in front of the target holds
// the bytes), a later run applies a newer value of the same row, and then
// the network delivers the old batch. It must not commit: the later run
// ended the earlier run's connection on the target before it resumed.
func TestShadowGhostBatch(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tree, src, dst := shadowTables(t, ctx, "ghost")
	srcConn, err := pgx.Connect(ctx, testNodeDSN(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer srcConn.Close(ctx)
	tgtConn, err := pgx.Connect(ctx, testNodeDSN(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer tgtConn.Close(ctx)
	if _, err := srcConn.Exec(ctx, "INSERT INTO "+src+" SELECT 'g' || g, 1 FROM generate_series(1, 100) g"); err != nil {
		t.Fatal(err)
	}
	fwd := startForwarder(t, fmt.Sprintf("127.0.0.1:%d", testNode(t, 1).Port), stallEvery)
	spec := migrator.ShadowSpec{ID: "ghost1", Tree: tree, SourceDSN: testNodeDSN(t, 0),
		TargetDSN: fmt.Sprintf("postgres://lattice@%s/lattice?sslmode=disable", fwd.addr()),
		Source:    0, Target: 1, Slots: [][2]int{{0, 4095}}}
	log := slog.Default()
	set := func(v int) pglogrepl.LSN {
		t.Helper()
		var lsn string
		if _, err := srcConn.Exec(ctx, "UPDATE "+src+" SET v = $1 WHERE k = 'g1'", v); err != nil {
			t.Fatal(err)
		}
		if err := srcConn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		l, err := pglogrepl.ParseLSN(lsn)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	targetV := func() int {
		t.Helper()
		var v int
		if err := tgtConn.QueryRow(ctx, "SELECT v FROM "+dst+" WHERE k = 'g1'").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	first, err := migrator.StartShadow(ctx, spec, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.WaitApplied(ctx, set(2)); err != nil {
		t.Fatal(err)
	}
	fwd.stall()
	set(3) // the first run's next batch carries it, and the forwarder holds it
	pollUntil(t, 30*time.Second, "the first run's batch held in the network", func() (bool, error) { return fwd.held.Load() > 0, nil })
	_ = first.Stop() // it gives up on its connection; the batch is still in flight

	spec.TargetDSN = testNodeDSN(t, 1)
	second, err := migrator.StartShadow(ctx, spec, log)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Stop()
	if err := second.WaitApplied(ctx, set(4)); err != nil {
		t.Fatal(err)
	}
	if v := targetV(); v != 4 {
		t.Fatalf("the second run left v = %d on the target, want 4", v)
	}
	fwd.resume() // the network delivers the first run's batch now
	ports := fwd.serverPorts()
	pollUntil(t, 30*time.Second, "the first run's target connection to end", func() (bool, error) {
		var n int
		err := tgtConn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE client_port = ANY($1)", ports).Scan(&n)
		return n == 0, err
	})
	if v := targetV(); v != 4 {
		t.Fatalf("the first run's batch committed after the second run had applied a newer change: v = %d on the target, want 4", v)
	}
	if err := second.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := migrator.DropShadow(ctx, spec); err != nil {
		t.Fatal(err)
	}
}

// TestShadowCopy moves half the slots of one shard table to a table on
// another node while writers change it, stops and resumes the stream, and
// checks the target holds exactly the source's rows of those slots.
func TestShadowCopy(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tree, src, dst := shadowTables(t, ctx, "items")
	srcPool, err := pgxpool.New(ctx, testNodeDSN(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer srcPool.Close()
	// Large incompressible pads on some rows make updates carry unchanged
	// TOAST values.
	if _, err := srcPool.Exec(ctx, `INSERT INTO `+src+` SELECT 'k' || lpad(g::text, 5, '0'), g,
		CASE WHEN g % 10 = 0 THEN (SELECT string_agg(md5(g::text || x::text), '') FROM generate_series(1, 200) x) END
		FROM generate_series(0, 19999) g`); err != nil {
		t.Fatal(err)
	}
	w := &shadowWriter{pool: srcPool, last: map[string]*int{}, cut: map[string]bool{}}
	spec := migrator.ShadowSpec{ID: "t1", Tree: tree, SourceDSN: testNodeDSN(t, 0), TargetDSN: testNodeDSN(t, 1),
		Source: 0, Target: 1, Slots: [][2]int{{2048, 4095}}}
	log := slog.Default()

	writeCtx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- w.run(writeCtx, src, uint64(i))
		}()
	}
	stopAll := func() {
		stopWriters()
		wg.Wait()
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatalf("writer: %v", err)
			}
		}
	}

	sh, err := migrator.StartShadow(ctx, spec, log)
	if err != nil {
		stopAll()
		t.Fatal(err)
	}
	copied := sh.Stats().RowsCopied
	if copied == 0 {
		t.Error("the copy moved no rows")
	}
	time.Sleep(500 * time.Millisecond) // let writers produce stream changes
	if err := sh.Stop(); err != nil {
		stopAll()
		t.Fatalf("stop: %v", err)
	}
	// Changes made while no stream runs must arrive after the resume.
	time.Sleep(300 * time.Millisecond)
	sh, err = migrator.StartShadow(ctx, spec, log)
	if err != nil {
		stopAll()
		t.Fatal(err)
	}
	if got := sh.Stats().RowsCopied; got != copied {
		t.Errorf("resume copied again: rows_copied %d, was %d", got, copied)
	}
	time.Sleep(500 * time.Millisecond)
	stopAll()

	var lsnText string
	if err := srcPool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsnText); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(lsnText)
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.WaitApplied(ctx, lsn); err != nil {
		t.Fatal(err)
	}
	st := sh.Stats()
	if err := sh.Stop(); err != nil {
		t.Fatal(err)
	}
	if st.RowsApplied == 0 {
		t.Error("the stream applied no change while writers ran")
	}

	pred := btreeindex.SlotPredicate(tree, "", spec.Slots)
	checksum := func(dsn, table string) (int64, string) {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var n int64
		var sum string
		if err := c.QueryRow(ctx, "SELECT count(*), coalesce(md5(string_agg(k || ':' || v || ':' || coalesce(pad, '-'), ',' ORDER BY k)), '') FROM "+
			table+" WHERE "+pred).Scan(&n, &sum); err != nil {
			t.Fatal(err)
		}
		return n, sum
	}
	sn, ssum := checksum(testNodeDSN(t, 0), src)
	tn, tsum := checksum(testNodeDSN(t, 1), dst)
	if sn != tn || ssum != tsum {
		t.Fatalf("target differs from source's moving slots: source %d rows %s, target %d rows %s", sn, ssum, tn, tsum)
	}
	// The ledger agrees too, so the comparison is not of two empty sets.
	checked := 0
	for k, v := range w.last {
		if w.cut[k] {
			continue
		}
		var got *int
		err := srcPool.QueryRow(ctx, "SELECT v FROM "+src+" WHERE k = $1", k).Scan(&got)
		if err == pgx.ErrNoRows {
			got = nil
		} else if err != nil {
			t.Fatal(err)
		}
		if (got == nil) != (v == nil) || got != nil && *got != *v {
			t.Fatalf("key %s: source has %v, ledger %v", k, got, v)
		}
		checked++
	}
	t.Logf("copied %d rows, applied %d changes, %d moving rows, %d ledger keys", copied, st.RowsApplied, tn, checked)

	if err := migrator.DropShadow(ctx, spec); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := srcPool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_publication)`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d slots or publications left on the source", left)
	}
}
