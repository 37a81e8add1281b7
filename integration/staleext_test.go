package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// staleFixture is a tree "mx" (k text, v int; keys m1..m1000, v = n) of 4
// shards created through a proxy, and the store it lives in.
type staleFixture struct {
	store *shardmap.RedisStore
	tree  *shardmap.Tree
	m     *shardmap.Map
	key   string // a key of shard src
	src   int    // the shard of key
	dst   int    // another shard, where fold moves src's slots
}

func newStaleFixture(t *testing.T, ctx context.Context, c *pgx.Conn, redisURL string) *staleFixture {
	t.Helper()
	for _, q := range []string{
		"CREATE TABLE mx (k text PRIMARY KEY, v int NOT NULL)",
		"INSERT INTO mx SELECT 'm' || g, g FROM generate_series(1, 1000) g",
		"SELECT lattice_create_tree('mx', 'k', shard_count => 4)",
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	store, err := shardmap.OpenRedis(ctx, redisURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f := &staleFixture{store: store, key: "m1"}
	if f.tree, err = store.Tree(ctx, "lattice", "mx"); err != nil {
		t.Fatal(err)
	}
	if f.m, err = store.Map(ctx, "lattice", "mx"); err != nil {
		t.Fatal(err)
	}
	slot, err := shardmap.SlotForText(f.tree.KeyType, []byte(f.key), len(f.m.Slots))
	if err != nil {
		t.Fatal(err)
	}
	f.src = f.m.Slots[slot]
	for _, idx := range f.m.OwningShards() {
		if idx != f.src {
			f.dst = idx
			break
		}
	}
	return f
}

func nodeConn(t *testing.T, ctx context.Context, node string) *pgx.Conn {
	t.Helper()
	return ctConnect(t, ctx, testNodeDSN(t, int(node[1]-'1')))
}

// copyRows copies every row of shard src into shard dst, as a fold's
// shadow copy does.
func (f *staleFixture) copyRows(t *testing.T, ctx context.Context) {
	t.Helper()
	from, to := nodeConn(t, ctx, f.m.Shards[f.src].Node), nodeConn(t, ctx, f.m.Shards[f.dst].Node)
	var buf strings.Builder
	if _, err := from.PgConn().CopyTo(ctx, &buf, "COPY "+pgshard.ShardTable(f.tree, f.src)+" TO STDOUT"); err != nil {
		t.Fatal(err)
	}
	if _, err := to.PgConn().CopyFrom(ctx, strings.NewReader(buf.String()), "COPY "+pgshard.ShardTable(f.tree, f.dst)+" FROM STDIN"); err != nil {
		t.Fatal(err)
	}
}

// fold stores the map of a finished fold of src into dst, as its flip does.
func (f *staleFixture) fold(t *testing.T, ctx context.Context) uint64 {
	t.Helper()
	next := f.m.Clone()
	for s, idx := range next.Slots {
		if idx == f.src {
			next.Slots[s] = f.dst
		}
	}
	donor := next.Shards[f.src]
	donor.State = shardmap.ShardRetired
	next.Shards[f.src] = donor
	if err := f.store.SwapMap(ctx, next, f.m.Epoch); err != nil {
		t.Fatal(err)
	}
	return next.Epoch
}

// poolWaits reads lattice_pool_acquire_waits_total of node from the
// proxy's /metrics.
func poolWaits(t *testing.T, p *proxyProc, node string) int {
	t.Helper()
	resp, err := http.Get("http://" + p.AdminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	prefix := fmt.Sprintf(`lattice_pool_acquire_waits_total{node=%q,tenant="lattice"} `, node)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			return int(n)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return 0 // no pool of node yet
}

// TestStaleExtendedRetry: a write for one key sent with the extended
// protocol (Parse, Bind, Execute, Sync in one batch) is planned on a map
// that then goes stale: while it waits for the one backend of its node
// (another session's transaction holds it), the key's shard is folded away
// (rows copied, source fenced, map flipped). On the source it meets the
// fence (LT001); the proxy routes it again on the new map, and the client
// sees no error.
func TestStaleExtendedRetry(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startProxy(t, 3, "--pool-size", "1")
	admin, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	f := newStaleFixture(t, ctx, admin, testRedisURL(t))
	srcNode := f.m.Shards[f.src].Node

	// The transaction holds the only backend of the source's node; its
	// read does not stop the fence from being installed.
	blocker, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var before int
	if err := tx.QueryRow(ctx, "SELECT v FROM mx WHERE k = $1", f.key).Scan(&before); err != nil {
		t.Fatal(err)
	}
	waits := poolWaits(t, p, srcNode)

	writer, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(ctx)
	done := make(chan error, 1)
	go func() {
		res := writer.PgConn().ExecParams(ctx, "UPDATE mx SET v = $1 WHERE k = $2",
			[][]byte{[]byte("-7"), []byte(f.key)}, nil, nil, nil).Read()
		if res.Err == nil && res.CommandTag.RowsAffected() != 1 {
			res.Err = fmt.Errorf("UPDATE %d, want UPDATE 1", res.CommandTag.RowsAffected())
		}
		done <- res.Err
	}()
	// Planned (at Bind) and routed to the source: it waits for the backend.
	for poolWaits(t, p, srcNode) == waits {
		select {
		case err := <-done:
			t.Fatalf("the write ended before it waited for a backend: %v", err)
		case <-ctx.Done():
			t.Fatal("the write never waited for the source's backend")
		case <-time.After(10 * time.Millisecond):
		}
	}

	f.copyRows(t, ctx)
	fence := pgshard.SlotFence{Migration: "staleext", Tree: f.tree, Shard: f.src,
		Slots: f.m.SlotRanges(f.src), Target: f.dst, Epoch: f.m.Epoch + 1}
	if err := ctCluster(t, 3).InstallSlotFence(ctx, srcNode, fence); err != nil {
		t.Fatal(err)
	}
	f.fold(t, ctx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	if err := <-done; err != nil {
		t.Fatalf("the write planned on the stale map: %v, want no error", err)
	}
	var got int
	if err := admin.QueryRow(ctx, "SELECT v FROM mx WHERE k = $1", f.key).Scan(&got); err != nil || got != -7 {
		t.Fatalf("after the write, v = %d (%v), want -7", got, err)
	}
	src := nodeConn(t, ctx, srcNode)
	if err := src.QueryRow(ctx, "SELECT v FROM "+pgshard.ShardTable(f.tree, f.src)+" WHERE k = $1", f.key).Scan(&got); err != nil || got != before {
		t.Fatalf("the source's row has v = %d (%v), want the untouched %d: the fence let the stale write through", got, err, before)
	}
}
