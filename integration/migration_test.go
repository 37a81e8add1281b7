package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/migrator"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// mapWriter writes keys the way a proxy routes them: by the map of a view
// it holds through a shardmap.Registration, as a proxy holds one per
// statement, so that a migration's acknowledgements wait for the writes
// planned on an older map (a write stalled between its plan and its send
// could otherwise reach a source after its fence was dropped). It waits
// while a slot is frozen, tries again on LT001, and records each
// acknowledged value.
type mapWriter struct {
	reg   *shardmap.Registration
	tree  *shardmap.Tree
	pools map[string]*pgxpool.Pool // by node

	mu     sync.Mutex
	ledger map[string]int
	// cut is the value of each key's write that the end of the run cut
	// off: it may have committed without being acknowledged. Each key has
	// one writer, so it is the key's last write.
	cut map[string]int
}

// newMapWriter registers a writer with the store as a proxy registers,
// and waits until it is live.
func newMapWriter(t *testing.T, ctx context.Context, store *shardmap.RedisStore, tree *shardmap.Tree) *mapWriter {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	cache := shardmap.NewCache(store, time.Second, log)
	reg := shardmap.NewRegistration("map-writer-"+sanitize(t.Name()), store, cache, 0, 0, log)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = cache.Run(runCtx) })
	wg.Go(func() { reg.Run(runCtx) })
	t.Cleanup(func() { stop(); wg.Wait() })
	for !reg.Live() {
		if ctx.Err() != nil {
			t.Fatal("the writer's registration never went live")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return &mapWriter{reg: reg, tree: tree, pools: map[string]*pgxpool.Pool{}, ledger: map[string]int{}, cut: map[string]int{}}
}

func (w *mapWriter) write(ctx context.Context, key string, v int) error {
	slot, err := shardmap.SlotForText(shardmap.KeyText, []byte(key), w.tree.SlotCount)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		view, release, err := w.reg.Acquire(ctx, w.tree.Tenant)
		if err != nil {
			return err
		}
		m := view.GroupMap(w.tree.MapName())
		if m.IsFrozen(slot) {
			release()
			time.Sleep(time.Millisecond)
			continue
		}
		sh := m.Owner(slot)
		_, err = w.pools[sh.Node].Exec(ctx, "INSERT INTO "+pgshard.ShardTable(w.tree, sh.Index)+
			" (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v", key, v)
		release()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == sqlstate.SlotMoved {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				w.mu.Lock()
				w.cut[key] = v
				w.mu.Unlock()
			}
			return err
		}
		w.mu.Lock()
		w.ledger[key] = v
		w.mu.Unlock()
		return nil
	}
	return ctx.Err()
}

// TestSplitAndFold splits a shard and folds the new shard back while
// writers follow the map, then checks every acknowledged write is in the
// shard that owns its slot, exactly once, and nothing of the migrations is
// left on the nodes.
func TestSplitAndFold(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := ctCluster(t, 2)
	store := harnessStore(t)
	cat, err := pgx.Connect(ctx, testNodeDSN(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer cat.Close(ctx)
	ctExec(t, ctx, cat, `CREATE TABLE items (k text PRIMARY KEY, v int NOT NULL)`,
		`INSERT INTO items SELECT 'k' || g, g FROM generate_series(1, 20000) g`)
	tree, _, err := c.CreateTree(ctx, store, pgshard.TreeSpec{Table: "items", KeyColumn: "k", ShardCount: 4})
	if err != nil {
		t.Fatal(err)
	}
	w := newMapWriter(t, ctx, store, tree)
	for i, n := range c.NodeNames() {
		p, err := pgxpool.New(ctx, testNodeDSN(t, i))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		w.pools[n] = p
	}
	writeCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for writeCtx.Err() == nil {
				// Each key has one writer (n%4 == i): the ledger records
				// acknowledgements, which two writers of one key could
				// record in the other order than their commits.
				key := fmt.Sprintf("k%d", rng.IntN(30000/4)*4+i)
				if err := w.write(writeCtx, key, rng.IntN(1<<30)); err != nil && writeCtx.Err() == nil {
					errs <- err
					return
				}
			}
		}()
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r := migrator.NewRunner(c, store, migrator.Options{}, nil, log)
	split, err := r.StartSplit(ctx, tree, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx, split); err != nil {
		t.Fatalf("split: %v", err)
	}
	fold, err := r.StartFold(ctx, tree, split.Target, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx, fold); err != nil {
		t.Fatalf("fold: %v", err)
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}

	m, err := store.Map(ctx, tree.Tenant, tree.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Frozen) != 0 || m.Shards[split.Target].State != shardmap.ShardRetired || m.DistinctShards() != 4 {
		t.Fatalf("map after split and fold: frozen %v, shard %d %s, %d distinct shards", m.Frozen, split.Target, m.Shards[split.Target].State, m.DistinctShards())
	}
	if m.HighWater <= split.Target {
		t.Fatalf("high water %d would hand out retired index %d again", m.HighWater, split.Target)
	}
	// Every row sits in the shard owning its slot, once.
	total := 0
	for _, idx := range m.OwningShards() {
		sh := m.Shards[idx]
		p := w.pools[sh.Node]
		var own, all int
		if err := p.QueryRow(ctx, "SELECT count(*) FILTER (WHERE "+btreeindex.SlotPredicate(tree, "", m.SlotRanges(idx))+"), count(*) FROM "+
			pgshard.ShardTable(tree, idx)).Scan(&own, &all); err != nil {
			t.Fatal(err)
		}
		if own != all {
			t.Errorf("shard %d holds %d rows of slots it does not own", idx, all-own)
		}
		total += all
	}
	const want = 20000
	isNew := func(k string) bool {
		var n int
		_, err := fmt.Sscanf(k, "k%d", &n)
		return err == nil && (n < 1 || n > 20000)
	}
	extra, maybe := 0, 0
	for k := range w.ledger {
		if isNew(k) {
			extra++
		}
	}
	for k := range w.cut {
		if _, acked := w.ledger[k]; !acked && isNew(k) {
			maybe++
		}
	}
	if total < want+extra || total > want+extra+maybe {
		t.Errorf("rows in all shards: %d, want %d (20000 initial + %d new keys, + up to %d cut off at the end)", total, want+extra, extra, maybe)
	}
	for k, v := range w.ledger {
		slot, _ := shardmap.SlotForText(shardmap.KeyText, []byte(k), tree.SlotCount)
		sh := m.Owner(slot)
		var got int
		if err := w.pools[sh.Node].QueryRow(ctx, "SELECT v FROM "+pgshard.ShardTable(tree, sh.Index)+" WHERE k = $1", k).Scan(&got); err != nil {
			t.Fatalf("key %s (acknowledged %d): %v", k, v, err)
		}
		if cut, ok := w.cut[k]; got != v && (!ok || got != cut) {
			t.Fatalf("key %s: %d, last acknowledged %d", k, got, v)
		}
	}
	for n, p := range w.pools {
		var left int
		if err := p.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_publication)
			+ (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lattice_fence_m_%')`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left != 0 {
			t.Errorf("node %s: %d slots, publications or fences left", n, left)
		}
	}
	var donor bool
	if err := w.pools[split.TargetNode].QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgshard.ShardTable(tree, split.Target)).Scan(&donor); err != nil {
		t.Fatal(err)
	}
	if donor {
		t.Errorf("the fold donor's table %s is still there", pgshard.ShardTable(tree, split.Target))
	}
	if migs, _ := store.Migrations(ctx, tree.Tenant, tree.Name); len(migs) != 0 {
		t.Errorf("%d migration records left", len(migs))
	}
	t.Logf("ledger: %d keys, split copied %d rows, fold copied %d rows", len(w.ledger), split.RowsCopied, fold.RowsCopied)
}
