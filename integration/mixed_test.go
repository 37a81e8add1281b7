package integration

import (
	"context"
	"errors"
	"fmt"
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
// UPDATE or DELETE without the key must not reach the copies (the slot
// predicate keeps them out, so they neither count them nor meet the fence),
// while a write for one key of those slots still gets LT001.
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
	store := harnessStore(t)
	tree, m := storedTree(t, ctx, store, "mx")
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
		// Keyless writes pass by the copies that the fence guards.
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
	store := harnessStore(t)
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

// TestFoldSurvivorKeylessWrites holds a real fold between its copy and its
// flip (a lock on every shard table makes each freeze's fence time out), so
// the survivor is mixed and holds copies of the donor's rows. Writes
// without the shard key must count and return every row once: each donor
// row is written on the donor only, and reaches the survivor's copy
// through the migration's stream. Before the fix, UPDATE fx SET v = v + 1
// reported 1000 plus the number of copies.
func TestFoldSurvivorKeylessWrites(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	const rows = 1000
	mustExec(t, c, "CREATE TABLE fx (k text PRIMARY KEY, g int NOT NULL, v int NOT NULL)")
	mustExec(t, c, "INSERT INTO fx SELECT 'f' || g, g, g FROM generate_series(1, 1000) g")
	mustExec(t, c, "SELECT lattice_create_tree('fx', 'k', shard_count => 4)")
	want := make(map[string]int, rows) // k -> v, as the client wrote it
	for g := 1; g <= rows; g++ {
		want["f"+strconv.Itoa(g)] = g
	}
	store := harnessStore(t)
	tree, m := storedTree(t, ctx, store, "fx")
	nodeDSN := func(name string) string { return testNodeDSN(t, int(name[1]-'1')) }
	// The fence's CREATE TRIGGER conflicts with ROW EXCLUSIVE: every freeze
	// rolls back to the drain, while reads and writes go through.
	var unlock []func()
	for idx, sh := range m.Shards {
		unlock = append(unlock, lockTable(t, ctx, nodeDSN(sh.Node), pgshard.ShardTable(tree, idx), "ROW EXCLUSIVE"))
	}
	mustExec(t, c, "SELECT lattice_reshard('fx', 3)")
	var fold *shardmap.Migration
	pollUntil(t, 2*time.Minute, "the fold to copy the donor's rows into the survivor", func() (bool, error) {
		migs, err := store.Migrations(ctx, "lattice", "fx")
		for _, mig := range migs {
			if mig.Kind == shardmap.Fold && (mig.Phase == shardmap.PhaseDrain || mig.Phase == shardmap.PhaseFreeze) {
				fold = mig
			}
		}
		return fold != nil, err
	})
	donorRows := func(conn *pgx.Conn, shard int) map[string]int {
		t.Helper()
		rs, err := conn.Query(ctx, "SELECT k, v FROM "+pgshard.ShardTable(tree, shard)+" WHERE "+btreeindex.SlotPredicate(tree, "", fold.Slots))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		var k string
		var v int
		if _, err := pgx.ForEachRow(rs, []any{&k, &v}, func() error { out[k] = v; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	donorConn, survConn := connect(t, nodeDSN(fold.SourceNode)), connect(t, nodeDSN(fold.TargetNode))
	if copies := len(donorRows(survConn, fold.Target)); copies == 0 {
		t.Fatalf("the survivor, shard %d, holds no copy of the donor's rows", fold.Target)
	}
	if m, err := store.Map(ctx, "lattice", "fx"); err != nil || !m.Shards[fold.Target].Mixed {
		t.Fatalf("the survivor is not mixed in the map: %v", err)
	}

	type querier interface {
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	}
	// returned runs a statement with RETURNING k, v and checks it returned
	// every key at most once, with the value the client expects after it.
	returned := func(q querier, mode pgx.QueryExecMode, sql string, args ...any) map[string]int {
		t.Helper()
		rs, err := q.Query(ctx, sql, append([]any{mode}, args...)...)
		if err != nil {
			t.Fatalf("%s (mode %v): %v", sql, mode, err)
		}
		out := map[string]int{}
		var k string
		var v int
		_, err = pgx.ForEachRow(rs, []any{&k, &v}, func() error {
			if _, dup := out[k]; dup {
				return fmt.Errorf("key %s returned twice", k)
			}
			out[k] = v
			return nil
		})
		if err != nil {
			t.Fatalf("%s (mode %v): %v", sql, mode, err)
		}
		return out
	}
	simple, extended := pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement
	for round, mode := range []pgx.QueryExecMode{simple, extended} {
		tag, err := c.Exec(ctx, "UPDATE fx SET v = v + 1", mode)
		if err != nil || tag.RowsAffected() != int64(len(want)) {
			t.Fatalf("keyless UPDATE (mode %v): %d rows (%v), want %d", mode, tag.RowsAffected(), err, len(want))
		}
		for k := range want {
			want[k]++
		}

		// A WHERE on a non-key column, with RETURNING.
		got := returned(c, mode, "UPDATE fx SET v = v + 10 WHERE g % 3 = $1 RETURNING k, v", round)
		n := 0
		for k := range want {
			if g, _ := strconv.Atoi(k[1:]); g%3 == round {
				want[k] += 10
				n++
				if got[k] != want[k] {
					t.Fatalf("UPDATE ... RETURNING (mode %v): %s = %d, want %d", mode, k, got[k], want[k])
				}
			}
		}
		if len(got) != n {
			t.Fatalf("UPDATE ... RETURNING (mode %v): %d rows, want %d", mode, len(got), n)
		}

		// DELETE ... RETURNING in a transaction over every node, rolled back.
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = returned(tx, mode, "DELETE FROM fx WHERE g > 500 RETURNING k, v")
		n = 0
		for k, v := range want {
			if g, _ := strconv.Atoi(k[1:]); g > 500 {
				n++
				if got[k] != v {
					t.Fatalf("DELETE ... RETURNING (mode %v): %s = %d, want %d", mode, k, got[k], v)
				}
			}
		}
		if len(got) != n {
			t.Fatalf("DELETE ... RETURNING (mode %v): %d rows, want %d", mode, len(got), n)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}

		// A committed DELETE of a few rows.
		lo, hi := round*20+1, round*20+5
		tag, err = c.Exec(ctx, "DELETE FROM fx WHERE g BETWEEN $1 AND $2", mode, lo, hi)
		if err != nil || tag.RowsAffected() != int64(hi-lo+1) {
			t.Fatalf("keyless DELETE (mode %v): %d rows (%v), want %d", mode, tag.RowsAffected(), err, hi-lo+1)
		}
		for g := lo; g <= hi; g++ {
			delete(want, "f"+strconv.Itoa(g))
		}

		// An upsert routes each row by its key: the rows just deleted come
		// back, the others are updated, each once.
		var vals []string
		for g := lo; g < lo+20; g++ {
			vals = append(vals, fmt.Sprintf("('f%d', %d, 0)", g, g))
		}
		got = returned(c, mode, "INSERT INTO fx (k, g, v) VALUES "+strings.Join(vals, ", ")+
			" ON CONFLICT (k) DO UPDATE SET v = fx.v + 100 RETURNING k, v")
		for g := lo; g < lo+20; g++ {
			k := "f" + strconv.Itoa(g)
			if v, ok := want[k]; ok {
				want[k] = v + 100
			} else {
				want[k] = 0
			}
			if got[k] != want[k] {
				t.Fatalf("INSERT ... ON CONFLICT (mode %v): %s = %d, want %d", mode, k, got[k], want[k])
			}
		}
		if len(got) != 20 {
			t.Fatalf("INSERT ... ON CONFLICT (mode %v): %d rows, want 20", mode, len(got))
		}
	}
	checkRows := func(what string) {
		t.Helper()
		got := returned(c, simple, "SELECT k, v FROM fx")
		if len(got) != len(want) {
			t.Fatalf("%s: %d rows, want %d", what, len(got), len(want))
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("%s: %s = %d, want %d", what, k, got[k], v)
			}
		}
	}
	checkRows("through the proxy during the fold")

	// The donor's rows were written on the donor, and the stream brings the
	// survivor's copies to the same values.
	donor := donorRows(donorConn, fold.Source)
	for k, v := range donor {
		if want[k] != v {
			t.Fatalf("donor row %s = %d, want %d", k, v, want[k])
		}
	}
	pollUntil(t, time.Minute, "the survivor's copies to match the donor", func() (bool, error) {
		copies := donorRows(survConn, fold.Target)
		if len(copies) != len(donor) {
			return false, nil
		}
		for k, v := range donor {
			if copies[k] != v {
				return false, nil
			}
		}
		return true, nil
	})

	for _, u := range unlock {
		u()
	}
	pollUntil(t, 2*time.Minute, "the fold to complete", func() (bool, error) {
		var done bool
		err := c.QueryRow(ctx, "SELECT lattice_reshard_complete('fx')").Scan(&done)
		return done, err
	})
	checkRows("through the proxy after the fold")
	_, m = storedTree(t, ctx, store, "fx")
	if n := len(m.OwningShards()); n != 3 || m.Shards[fold.Target].Mixed || m.Shards[fold.Source].State != shardmap.ShardRetired {
		t.Fatalf("after the fold: %d owning shards, survivor %+v, donor %+v", n, m.Shards[fold.Target], m.Shards[fold.Source])
	}
}
