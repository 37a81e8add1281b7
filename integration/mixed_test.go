package integration

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// TestMixedShardScan puts a split source in the state it has between the
// flip and the release: shard 0 holds, besides its own rows, a copy of
// every row of shard 1, is marked mixed, and is fenced for shard 1's slots.
// Reads over several shards through the proxy must see each row once, and
// UPDATE or DELETE without the key must skip the copies instead of failing
// on the fence, while a write for one key of those slots still gets LT001.
func TestMixedShardScan(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startProxy(t, 3)
	c, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	const rows = 1000
	for _, q := range []string{
		"CREATE TABLE mx (k text PRIMARY KEY, v int NOT NULL)",
		"INSERT INTO mx SELECT 'm' || g, g FROM generate_series(1, 1000) g",
		"SELECT lattice_create_tree('mx', 'k', shard_count => 4)",
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	store, err := shardmap.OpenRedis(ctx, testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	tree, err := store.Tree(ctx, "lattice", "mx")
	if err != nil {
		t.Fatal(err)
	}
	m, err := store.Map(ctx, "lattice", "mx")
	if err != nil {
		t.Fatal(err)
	}
	src, moved := m.Shards[0], m.Shards[1]
	nodeIndex := func(name string) int { return int(name[1] - '1') }
	srcConn := ctConnect(t, ctx, testNodeDSN(t, nodeIndex(src.Node)))
	movedConn := ctConnect(t, ctx, testNodeDSN(t, nodeIndex(moved.Node)))

	// Copy shard 1's rows into shard 0, as a split leaves them there.
	var buf strings.Builder
	if _, err := movedConn.PgConn().CopyTo(ctx, &buf, "COPY "+pgshard.ShardTable(tree, 1)+" TO STDOUT"); err != nil {
		t.Fatal(err)
	}
	copied, err := srcConn.PgConn().CopyFrom(ctx, strings.NewReader(buf.String()), "COPY "+pgshard.ShardTable(tree, 0)+" FROM STDIN")
	if err != nil {
		t.Fatal(err)
	}
	if copied.RowsAffected() == 0 {
		t.Fatal("shard 1 holds no rows")
	}
	cl := ctCluster(t, 3)
	fence := pgshard.SlotFence{Migration: "mixtest", Tree: tree, Shard: 0, Slots: m.SlotRanges(1), Target: 1, Epoch: m.Epoch + 1}
	if err := cl.InstallSlotFence(ctx, src.Node, fence); err != nil {
		t.Fatal(err)
	}
	next := m.Clone()
	s0 := next.Shards[0]
	s0.Mixed = true
	next.Shards[0] = s0
	if err := store.SwapMap(ctx, next, m.Epoch); err != nil {
		t.Fatal(err)
	}
	// The proxy acknowledges an epoch once it routes by it.
	waitAck(t, ctx, store, "mx", next.Epoch)

	simple := pgx.QueryExecModeSimpleProtocol
	extended := pgx.QueryExecModeCacheStatement
	for i, mode := range []pgx.QueryExecMode{simple, extended} {
		// Each round's keyless UPDATE adds 1 to every row.
		sum := strconv.Itoa(500500 + i*rows)
		for _, q := range []struct{ sql, want string }{
			{"SELECT count(*) FROM mx", "1000"},
			{"SELECT count(*), sum(v) FROM mx AS x WHERE x.v > 0", "1000 " + sum},
			{"SELECT count(DISTINCT k) FROM mx", "1000"},
		} {
			got, err := queryStrings(t, c, q.sql, mode)
			if err != nil {
				t.Fatalf("%s (mode %v): %v", q.sql, mode, err)
			}
			if strings.Join(got, ";") != q.want {
				t.Errorf("%s (mode %v) = %q, want %q", q.sql, mode, got, q.want)
			}
		}
		// A plain fan-out: every key once.
		ks, err := c.Query(ctx, "SELECT public.mx.k FROM public.mx WHERE public.mx.v > 0", mode)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		var k string
		if _, err := pgx.ForEachRow(ks, []any{&k}, func() error { seen[k]++; return nil }); err != nil {
			t.Fatal(err)
		}
		for key, n := range seen {
			if n != 1 {
				t.Fatalf("mode %v: key %s read %d times", mode, key, n)
			}
		}
		if len(seen) != rows {
			t.Fatalf("mode %v: %d keys read, want %d", mode, len(seen), rows)
		}
		// Keyless writes skip the copies that the fence guards.
		tag, err := c.Exec(ctx, "UPDATE mx SET v = v + 1", mode)
		if err != nil || tag.RowsAffected() != rows {
			t.Fatalf("keyless UPDATE (mode %v): %v rows, %v", mode, tag.RowsAffected(), err)
		}
		tag, err = c.Exec(ctx, "DELETE FROM mx WHERE v < 0", mode)
		if err != nil || tag.RowsAffected() != 0 {
			t.Fatalf("keyless DELETE (mode %v): %v rows, %v", mode, tag.RowsAffected(), err)
		}
	}
	// COPY TO of the tree: every row once.
	var out strings.Builder
	tag, err := c.PgConn().CopyTo(ctx, &out, "COPY mx TO STDOUT")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n"); n != rows || tag.RowsAffected() != rows {
		t.Fatalf("COPY mx TO STDOUT: %d lines, tag %d rows, want %d", n, tag.RowsAffected(), rows)
	}
	// The copies on shard 0 were not touched, and a write for one of their
	// keys still meets the fence.
	var k string
	var v int
	if err := srcConn.QueryRow(ctx, "SELECT k, v FROM "+pgshard.ShardTable(tree, 0)+" WHERE "+
		btreeindex.SlotPredicate(tree, "", m.SlotRanges(1))+" LIMIT 1").Scan(&k, &v); err != nil {
		t.Fatal(err)
	}
	if want, _ := strconv.Atoi(strings.TrimPrefix(k, "m")); v != want {
		t.Fatalf("the copy of %s on shard 0 has v = %d, want %d: a keyless write went through the fence", k, v, want)
	}
	_, err = srcConn.Exec(ctx, "UPDATE "+pgshard.ShardTable(tree, 0)+" SET v = 0 WHERE k = $1", k)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != sqlstate.SlotMoved {
		t.Fatalf("a write for one moved key on the source: %v, want %s", err, sqlstate.SlotMoved)
	}
}

// waitAck waits until every proxy acknowledged epoch of tree: from then on
// it routes by that map or a later one.
func waitAck(t *testing.T, ctx context.Context, store *shardmap.RedisStore, tree string, epoch uint64) {
	t.Helper()
	for {
		acks, err := store.Acks(ctx, "lattice", tree)
		if err != nil {
			t.Fatal(err)
		}
		done := len(acks) > 0
		for _, e := range acks {
			done = done && e >= epoch
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the proxy did not acknowledge epoch %d: %v", epoch, acks)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestHoldFrozen freezes one slot in the map: statements for its keys and
// statements over several shards are held, and fail with 55000 when the
// slot stays frozen past the hold timeout, while a key of another slot is
// served at once; a held statement runs once the slot thaws.
func TestHoldFrozen(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := startProxy(t, 3)
	c, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, q := range []string{
		"CREATE TABLE hf (k text PRIMARY KEY, v int NOT NULL)",
		"SELECT lattice_create_tree('hf', 'k', shard_count => 4)",
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	store, err := shardmap.OpenRedis(ctx, testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	frozenKey, otherKey := keyInSlots(t, 100, 100, true), keyInSlots(t, 100, 100, false)
	swap := func(frozen [][2]int) uint64 {
		m, err := store.Map(ctx, "lattice", "hf")
		if err != nil {
			t.Fatal(err)
		}
		next := m.Clone()
		next.Frozen = frozen
		if err := store.SwapMap(ctx, next, m.Epoch); err != nil {
			t.Fatal(err)
		}
		return next.Epoch
	}
	waitAck(t, ctx, store, "hf", swap([][2]int{{100, 100}}))

	if _, err := c.Exec(ctx, "INSERT INTO hf VALUES ($1, 1)", otherKey); err != nil {
		t.Fatalf("a key of another slot: %v", err)
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{"INSERT INTO hf VALUES ($1, 1)", []any{frozenKey}},
		{"INSERT INTO hf VALUES ($1, 1)", []any{pgx.QueryExecModeSimpleProtocol, frozenKey}},
		{"SELECT count(*) FROM hf", nil},
	} {
		_, err := c.Exec(ctx, q.sql, q.args...)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "55000" {
			t.Fatalf("%s while its slot stays frozen: %v, want SQLSTATE 55000", q.sql, err)
		}
	}

	held := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "INSERT INTO hf VALUES ($1, 2)", frozenKey)
		held <- err
	}()
	swap(nil)
	if err := <-held; err != nil {
		t.Fatalf("a held statement after the slot thawed: %v", err)
	}
	var v int
	if err := c.QueryRow(ctx, "SELECT v FROM hf WHERE k = $1", frozenKey).Scan(&v); err != nil || v != 2 {
		t.Fatalf("the held write: v = %d, %v", v, err)
	}
}
