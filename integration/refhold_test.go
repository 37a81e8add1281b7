package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/shardmap"
)

// TestReferenceCopiesChangeUnderWrites writes a reference table in the
// middle of transactions, through two proxies, while a node joins (it gets
// its copy before its first shards, which two moves place at once, under
// the catalog copy's table lock) and leaves again (its copy is released). Each proxy holds the table's
// writes while its copies change, so no write fails; before, every write
// that queued behind the copy's lock got LT001 ("the copies of reference
// table ... are on nodes ... now") mid-transaction. Every copy holds every
// committed write.
func TestReferenceCopiesChangeUnderWrites(t *testing.T) {
	const refholdRows = 60_000
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// n1 and n2; n3 joins later. Enough rows that copying them to a node
	// takes a while (a second or more, with dozens of writes held), and
	// few enough that the copy ends within a proxy's 10 s hold on a busy
	// 2-core machine: 200,000 rows once took 11.4 s there (CI run 427),
	// and the writes held past the hold met the fence.
	pools, procs := itemUnderTwoProxies(t, ctx,
		`INSERT INTO item SELECT i, i % 7, 'item-' || i, (i * 13 % 10000) / 100.0, repeat('x', 40) FROM generate_series(1, `+strconv.Itoa(refholdRows)+`) i`)
	var conns []*pgx.Conn
	for _, p := range procs {
		conns = append(conns, connect(t, p.DSN("lattice")))
	}
	admin := pools[0]

	load := startRefWriters(ctx, pools)
	finish := load.finish
	step := func(q, done string) {
		t.Helper()
		before := load.committed.Load()
		start := time.Now()
		if _, err := admin.Exec(ctx, q); err != nil {
			finish()
			t.Fatalf("%s: %v", q, err)
		}
		if done != "" {
			waitFor(t, ctx, admin, done, nil, func() error { finish(); return nil })
		}
		t.Logf("%s: %s, %d transactions committed meanwhile", q, time.Since(start).Round(time.Millisecond), load.committed.Load()-before)
	}
	time.Sleep(300 * time.Millisecond)
	step(fmt.Sprintf(`SELECT lattice_add_node('n3', '%s')`, testNodeDSN(t, 2)), "")
	for _, c := range conns {
		waitNodes(t, c, "n1,n2,n3")
	}
	// n3's first shards, two moves at once: the node gets its copy of item
	// first, once.
	step(`SELECT lattice_rebalance('stock', by => 'slots')`, `SELECT lattice_rebalance_complete('stock')`)
	step(`SELECT lattice_drain_node('n3')`, `SELECT lattice_drain_complete('n3')`)

	// The removal takes n3 out of item's copies. A transaction that locked
	// a row of item (on the catalog copy) holds the removal's table lock
	// back: its write of item goes on rather than wait for the removal.
	locker, err := pools[1].Begin(ctx)
	if err != nil {
		finish()
		t.Fatal(err)
	}
	defer locker.Rollback(context.WithoutCancel(ctx))
	if _, err := locker.Exec(ctx, `SELECT i_price FROM item WHERE i_id = 1 FOR UPDATE`); err != nil {
		finish()
		t.Fatal(err)
	}
	removed := make(chan error, 1)
	go func() {
		_, err := admin.Exec(ctx, `SELECT lattice_remove_node('n3')`)
		removed <- err
	}()
	catalog := connect(t, testNodeDSN(t, 0))
	pollUntil(t, time.Minute, "the removal to wait for the row lock", func() (bool, error) {
		var waiting bool
		err := catalog.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
			WHERE c.relname = 'item' AND l.mode = 'ExclusiveLock' AND NOT l.granted)`).Scan(&waiting)
		return waiting, err
	})
	if _, err := locker.Exec(ctx, `UPDATE item SET i_price = i_price + 1 WHERE i_id = 1`); err != nil {
		finish()
		t.Fatalf("a write of item by the transaction the removal waits for: %v", err)
	}
	if err := locker.Commit(ctx); err != nil {
		finish()
		t.Fatal(err)
	}
	if err := <-removed; err != nil {
		finish()
		t.Fatalf("lattice_remove_node: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	finish()

	for _, f := range load.failures {
		t.Error(f)
	}
	var copies []string
	for i := range 2 {
		n := connect(t, testNodeDSN(t, i))
		var sum string
		var rows int64
		if err := n.QueryRow(ctx, `SELECT count(*), md5(string_agg(format('%s|%s|%s|%s|%s', i_id, i_im_id, i_name, i_price, i_data), ',' ORDER BY i_id)) FROM public.item`).Scan(&rows, &sum); err != nil {
			t.Fatal(err)
		}
		if want := refholdRows + load.committed.Load(); rows != want { // the locker's write is an update
			t.Errorf("n%d's copy of item has %d rows, want %d (%d committed writes)", i+1, rows, want, load.committed.Load())
		}
		copies = append(copies, sum)
	}
	if copies[0] != copies[1] {
		t.Errorf("the copies of item differ: n1 %s, n2 %s", copies[0], copies[1])
	}
	var gone bool
	if err := connect(t, testNodeDSN(t, 2)).QueryRow(ctx, `SELECT to_regclass('public.item') IS NULL`).Scan(&gone); err != nil || !gone {
		t.Errorf("n3 keeps its copy of item after its removal (%v)", err)
	}
	// Every change waited for both proxies, the one that ran the Lattice
	// function included (its own statement holds no entry back), and the
	// proxies held writes meanwhile, each until the change was done.
	for i, p := range procs {
		if strings.Contains(p.Log(), "migration failed") {
			t.Errorf("proxy %d: a migration failed:\n%s", i, p.Log())
		}
	}
	if heldWrites(t, procs) == 0 {
		t.Error("no write was held while item's copies changed")
	}
	t.Logf("%d transactions committed, %d failed", load.committed.Load(), len(load.failures))
}

// TestReferenceStaleChangeMark leaves a reference table's entry marked
// changing, as a proxy killed in the middle of a change of its copies
// would: once the mark is older than shardmap.MaxChange, writes of the
// table are not held for it any more, and go to the copies the entry
// lists.
func TestReferenceStaleChangeMark(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, itemTable)
	mustExec(t, c, `SELECT lattice_create_reference_table('item')`)
	store, err := shardmap.OpenRedis(ctx, testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	refs, err := store.References(ctx, "lattice")
	if err != nil || len(refs) != 1 {
		t.Fatalf("reference tables: %v, %v", refs, err)
	}
	stale := *refs[0]
	stale.ChangingSince = time.Now().Add(-shardmap.MaxChange - time.Second)
	if err := store.PutReference(ctx, &stale, refs[0]); err != nil {
		t.Fatal(err)
	}
	// Once the proxy acknowledged the marked entry, its view has it.
	pollUntil(t, 10*time.Second, "the proxy to acknowledge the marked entry", func() (bool, error) {
		acks, err := store.Acks(ctx, "lattice", shardmap.ReferenceAckName("item"))
		for _, e := range acks {
			if e >= stale.Epoch {
				return true, err
			}
		}
		return false, err
	})
	for _, proto := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		if _, err := c.Exec(ctx, `INSERT INTO item VALUES ($1, 1, 'i', 1.00, 'd')`, proto, int(proto)+1); err != nil {
			t.Fatalf("a write beside a stale mark (%v): %v", proto, err)
		}
	}
	if n := metricSum(t, p, "lattice_proxy_reference_holds_total", nil); n != 0 {
		t.Errorf("%v writes held for a stale mark", n)
	}
	sameCopies(t, ctx, []*pgx.Conn{connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1))}, "")
}

// TestReferenceUndistributeUnderLoad turns a reference table back into an
// ordinary table while transactions write it through two proxies and
// readers check, through the other proxy, that each committed write is
// there. The change holds the table's writes as a change of its copies
// does: none fails (before, the writes between the registry's change and
// the fence's removal met the fence, LT001), and no read misses a write,
// since the proxies read the catalog copy alone before the other copies
// go.
func TestReferenceUndistributeUnderLoad(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pools, procs := itemUnderTwoProxies(t, ctx, `INSERT INTO item SELECT i, 1, 'item', 1.00, 'd' FROM generate_series(1, 20000) i`)
	admin := pools[0]

	load := startRefWriters(ctx, pools)
	// Readers look, through the proxy the writer did not use, for the
	// last row each writer committed.
	var stale []string
	var mu sync.Mutex
	readers := make(chan struct{})
	var rg sync.WaitGroup
	for r := range 2 {
		rg.Add(1)
		go func() {
			defer rg.Done()
			for {
				select {
				case <-readers:
					return
				default:
				}
				for w := r; w < len(load.last); w += 2 {
					id := load.last[w].Load()
					if id == 0 {
						continue
					}
					var n int
					err := pools[(w+1)%2].QueryRow(ctx, `SELECT count(*) FROM item WHERE i_id = $1`, id).Scan(&n)
					if err != nil || n != 1 {
						mu.Lock()
						stale = append(stale, fmt.Sprintf("reader %d, item %d of writer %d: %d rows, %v", r, id, w, n, err))
						mu.Unlock()
					}
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	before := load.committed.Load()
	if _, err := admin.Exec(ctx, `SELECT lattice_undistribute_table('item')`); err != nil {
		load.finish()
		t.Fatalf("lattice_undistribute_table: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	load.finish()
	close(readers)
	rg.Wait()

	for _, f := range load.failures {
		t.Error(f)
	}
	for _, s := range stale {
		t.Error("stale read: " + s)
	}
	t.Logf("%d transactions committed, %d of them before the change", load.committed.Load(), before)
	var rows int64
	if err := connect(t, testNodeDSN(t, 0)).QueryRow(ctx, `SELECT count(*) FROM public.item`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if want := 20_000 + load.committed.Load(); rows != want {
		t.Errorf("the catalog node's item has %d rows, want %d", rows, want)
	}
	var gone bool
	if err := connect(t, testNodeDSN(t, 1)).QueryRow(ctx, `SELECT to_regclass('public.item') IS NULL`).Scan(&gone); err != nil || !gone {
		t.Errorf("n2 keeps its copy of item (%v)", err)
	}
	if heldWrites(t, procs) == 0 {
		t.Error("no write was held while item became an ordinary table")
	}
}

// TestReferenceChangeGivesUpALock: a transaction left open after it locked
// a row of a reference table holds the catalog copy's table lock that a
// change of the copies needs. The change waits for it a bounded time and
// gives up with 55P03 and a hint, rather than keep the writes it holds
// waiting until their hold ends and they meet the fence (LT001): under
// writers through two proxies no write fails and no hold times out. Once
// the transaction ends, the change runs.
func TestReferenceChangeGivesUpALock(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pools, procs := itemUnderTwoProxies(t, ctx, `INSERT INTO item SELECT i, 1, 'item', 1.00, 'd' FROM generate_series(1, 1000) i`)
	admin := pools[0]
	locker, err := pools[1].Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(context.WithoutCancel(ctx))
	if _, err := locker.Exec(ctx, `SELECT i_price FROM item WHERE i_id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	load := startRefWriters(ctx, pools)
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	_, err = admin.Exec(ctx, `SELECT lattice_undistribute_table('item')`)
	if pgCode(err) != "55P03" || !strings.Contains(pgHint(err), "End the transactions") {
		load.finish()
		t.Fatalf("undistributing under a transaction's lock: %v (hint %q), want 55P03 with a hint", err, pgHint(err))
	}
	t.Logf("gave up after %s: %v", time.Since(start).Round(time.Millisecond), err)
	time.Sleep(300 * time.Millisecond)
	during := load.committed.Load()
	if err := locker.Commit(ctx); err != nil {
		load.finish()
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `SELECT lattice_undistribute_table('item')`); err != nil {
		load.finish()
		t.Fatalf("undistributing once the transaction ended: %v", err)
	}
	finishRefWriters(t, ctx, load, procs, 1000)
	t.Logf("%d transactions committed, %d of them before the lock went", load.committed.Load(), during)
}

// TestReferenceChangeAfterPreparedWrite: a write of a reference table
// whose Parse went to the catalog node before its Bind (pgx's Prepare:
// Parse, Describe, Sync; or Parse and Describe with a Flush) holds the
// catalog copy's lock from that Parse on, as PostgreSQL takes it when it
// parses: in a transaction that was on the catalog node before, in one
// that was only on another node (the Parse brings the catalog node in),
// and outside a transaction until the Sync. A change marked after that
// waits for it, and for another writer of the table; the write, bound
// under the mark, is not held for the change, so it commits, and the
// change goes on once the other writer ends. Held, the write waited for
// the change and the change for it, until the change gave up (55P03).
// Parsed on a backend the write did not then run on, the lock was that
// backend's: the write went unheld to the catalog copy, behind the change,
// while holding the copy on the other node that the change had to drop
// next, until the change gave up (55P03).
func TestReferenceChangeAfterPreparedWrite(t *testing.T) {
	const insert = `INSERT INTO item VALUES ($1, 1, 'p', 1.00, 'p')`
	inTx := func(first func(*testing.T) string) func(*testing.T, context.Context, *proxyProc, *pgxpool.Pool) (func() error, func() error) {
		return func(t *testing.T, ctx context.Context, _ *proxyProc, pool *pgxpool.Pool) (func() error, func() error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			if _, err := tx.Exec(ctx, first(t)); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Prepare(ctx, "add_item", insert); err != nil {
				t.Fatal(err)
			}
			write := func() error {
				_, err := tx.Exec(ctx, "add_item", 5000)
				return err
			}
			return write, func() error { return tx.Commit(ctx) }
		}
	}
	for _, tc := range []struct {
		name string
		// prepare parses the write through p (pool is on p) and returns
		// the write's Bind and the end of its transaction.
		prepare func(t *testing.T, ctx context.Context, p *proxyProc, pool *pgxpool.Pool) (write, end func() error)
	}{
		{"transaction on the catalog node", inTx(func(*testing.T) string { return `SELECT count(*) FROM item` })},
		{"transaction on another node", inTx(func(t *testing.T) string {
			return fmt.Sprintf(`SELECT s_quantity FROM stock WHERE s_w_id = %d`, keyOnNode(t, 1, "stock", "s_w_id"))
		})},
		{"no transaction, Parse and Describe flushed", func(t *testing.T, _ context.Context, p *proxyProc, _ *pgxpool.Pool) (func() error, func() error) {
			w := dialWire(t, p.DSN("lattice"))
			w.send(&pgproto3.Parse{Query: insert, ParameterOIDs: []uint32{pgtype.Int4OID}}, &pgproto3.Describe{ObjectType: 'S'}, &pgproto3.Flush{})
			if got := w.read(func(m pgproto3.BackendMessage) bool { _, ok := m.(*pgproto3.NoData); return ok }); got != "ParseComplete ParameterDescription NoData" {
				t.Fatalf("Parse and Describe of the write: %s", got)
			}
			write := func() error {
				got := w.round(&pgproto3.Bind{Parameters: [][]byte{[]byte("5000")}}, &pgproto3.Execute{}, &pgproto3.Sync{})
				if got != "BindComplete CommandComplete ReadyForQuery:I" {
					return fmt.Errorf("Bind, Execute, Sync: %s", got)
				}
				return nil
			}
			return write, func() error { return nil }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			pools, procs := itemUnderTwoProxies(t, ctx, `INSERT INTO item SELECT i, 1, 'item', 1.00, 'd' FROM generate_series(1, 1000) i`)
			write, end := tc.prepare(t, ctx, procs[1], pools[1])
			n1 := connect(t, testNodeDSN(t, 0))
			other, err := n1.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Rollback(context.WithoutCancel(ctx))
			if _, err := other.Exec(ctx, `LOCK TABLE public.item IN ROW EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			changed := make(chan error, 1)
			go func() {
				_, err := pools[0].Exec(ctx, `SELECT lattice_undistribute_table('item')`)
				changed <- err
			}()
			watch := connect(t, testNodeDSN(t, 0))
			pollUntil(t, time.Minute, "the change to wait for the catalog copy's lock", func() (bool, error) {
				select {
				case err := <-changed:
					t.Fatalf("the change did not wait for the writers of item: %v", err)
				default:
				}
				var waiting bool
				err := watch.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'LOCK TABLE %item%'`).Scan(&waiting)
				return waiting, err
			})
			if err := write(); err != nil {
				t.Fatalf("the prepared write under the change's mark: %v", err)
			}
			if err := end(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-changed:
				t.Fatalf("the change ended while another writer held item: %v", err)
			default:
			}
			if err := other.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-changed; err != nil {
				t.Fatalf("undistributing while a write of item was prepared: %v", err)
			}
			heldWrites(t, procs)
			var rows int64
			if err := watch.QueryRow(ctx, `SELECT count(*) FROM public.item`).Scan(&rows); err != nil || rows != 1001 {
				t.Errorf("the catalog node's item has %d rows (%v), want 1001", rows, err)
			}
		})
	}
}

// finishRefWriters stops load once item became an ordinary table, and
// fails t on a failed write, a held write whose hold timed out, or a
// committed write missing from the catalog node's item, which held base
// rows before the writers began.
func finishRefWriters(t *testing.T, ctx context.Context, load *refWriters, procs []*proxyProc, base int64) {
	t.Helper()
	time.Sleep(300 * time.Millisecond)
	load.finish()
	for _, f := range load.failures {
		t.Error(f)
	}
	heldWrites(t, procs)
	var rows int64
	if err := connect(t, testNodeDSN(t, 0)).QueryRow(ctx, `SELECT count(*) FROM public.item`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if want := base + load.committed.Load(); rows != want {
		t.Errorf("the catalog node's item has %d rows, want %d", rows, want)
	}
}

// TestReferenceUndistributeAgain makes item ordinary while a view on n2,
// made there directly, keeps n2's copy from being dropped: the call fails
// with that drop's SQLSTATE and a hint, the table's writes go on at once
// through both proxies (no hold is left behind), and once the view is gone
// a second call drops the copy the first left.
func TestReferenceUndistributeAgain(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pools, procs, n2 := undistributeBlocked(t, ctx)
	admin := pools[0]
	for i, pool := range pools {
		start := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE stock SET s_quantity = s_quantity + 1 WHERE s_w_id = $1`, i+1); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO item VALUES ($1, 1, 'w', 1.00, 'w')`, 2000+i)
			return err
		})
		if err != nil || time.Since(start) > 5*time.Second {
			t.Fatalf("a write of item through proxy %d after the failed call: %v after %s", i, err, time.Since(start))
		}
	}
	mustExec(t, n2, `DROP VIEW item_ids`)
	if _, err := admin.Exec(ctx, `SELECT lattice_undistribute_table('item')`); err != nil {
		t.Fatalf("undistributing again: %v", err)
	}
	heldWrites(t, procs)
	var left bool
	if err := n2.QueryRow(ctx, `SELECT to_regclass('public.item') IS NOT NULL`).Scan(&left); err != nil || left {
		t.Errorf("n2 still holds a copy of item: %v, %v", left, err)
	}
	var rows int64
	if err := connect(t, testNodeDSN(t, 0)).QueryRow(ctx, `SELECT count(*) FROM public.item`).Scan(&rows); err != nil || rows != 1002 {
		t.Errorf("the catalog node's item has %d rows (%v), want 1002", rows, err)
	}
	var refs int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM lattice_reference_tables()`).Scan(&refs); err != nil || refs != 0 {
		t.Errorf("lattice_reference_tables lists %d tables (%v), want none", refs, err)
	}
}

// undistributeBlocked makes item, of 1,000 rows, a reference table under
// two proxies (itemUnderTwoProxies), keeps n2's copy from being dropped by
// a view made there, item_ids, and has lattice_undistribute_table fail on
// it with that drop's SQLSTATE and the hint to run it again. It returns
// the pools, the proxies and a connection to n2.
func undistributeBlocked(t *testing.T, ctx context.Context) ([]*pgxpool.Pool, []*proxyProc, *pgx.Conn) {
	t.Helper()
	pools, procs := itemUnderTwoProxies(t, ctx, `INSERT INTO item SELECT i, 1, 'item', 1.00, 'd' FROM generate_series(1, 1000) i`)
	n2 := connect(t, testNodeDSN(t, 1))
	mustExec(t, n2, `CREATE VIEW item_ids AS SELECT i_id FROM public.item`)
	_, err := pools[0].Exec(ctx, `SELECT lattice_undistribute_table('item')`)
	if pgCode(err) != "2BP01" || !strings.Contains(pgHint(err), "lattice_undistribute_table('item') again") {
		t.Fatalf("undistributing while n2's copy cannot be dropped: %v (hint %q), want 2BP01 with a hint", err, pgHint(err))
	}
	t.Logf("first call: %v", err)
	return pools, procs, n2
}

// TestRemoveNodeDropsALeftCopy: an undistribution that could not drop
// n2's copy (a view on it, made there) leaves it to drop. Once the view is
// gone, draining and removing n2 drops the copy there and takes n2 out of
// the entry, which no later call could do: it skips a node no longer
// registered. The next call then finds nothing left to drop.
func TestRemoveNodeDropsALeftCopy(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pools, _, n2 := undistributeBlocked(t, ctx)
	admin := pools[0]
	mustExec(t, n2, `DROP VIEW item_ids`)
	if _, err := admin.Exec(ctx, `SELECT lattice_drain_node('n2')`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, admin, "SELECT lattice_drain_complete('n2')", nil, func() error { return nil })
	if _, err := admin.Exec(ctx, `SELECT lattice_remove_node('n2')`); err != nil {
		t.Fatal(err)
	}
	var left bool
	if err := n2.QueryRow(ctx, `SELECT to_regclass('public.item') IS NOT NULL`).Scan(&left); err != nil || left {
		t.Errorf("n2 keeps its copy of item after its removal: %v, %v", left, err)
	}
	if _, err := admin.Exec(ctx, `SELECT lattice_undistribute_table('item')`); err != nil {
		t.Fatalf("undistributing after n2's removal: %v", err)
	}
	var refs int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM lattice_reference_tables()`).Scan(&refs); err != nil || refs != 0 {
		t.Errorf("lattice_reference_tables lists %d tables (%v), want none", refs, err)
	}
}

// heldWrites fails t if a proxy let a held write of a reference table go
// when its hold timed out, or saw a change go on without every proxy's
// acknowledgement; it returns the writes held and released.
func heldWrites(t *testing.T, procs []*proxyProc) float64 {
	t.Helper()
	var released float64
	for i, p := range procs {
		if strings.Contains(p.Log(), "not every proxy acknowledged") {
			t.Errorf("proxy %d: a change of item's copies went on without every acknowledgement", i)
		}
		if n := metricSum(t, p, "lattice_proxy_reference_holds_total", map[string]string{"outcome": "timed_out"}); n != 0 {
			t.Errorf("proxy %d: %v writes held until the hold timed out", i, n)
		}
		released += metricSum(t, p, "lattice_proxy_reference_holds_total", map[string]string{"outcome": "released"})
	}
	t.Logf("%v writes held and released", released)
	return released
}

// itemColumns are the columns of TPC-C's item table, which the reference
// table tests use.
const itemColumns = `(i_id int PRIMARY KEY, i_im_id int NOT NULL, i_name text NOT NULL, i_price numeric(7,2) NOT NULL, i_data text)`

const itemTable = `CREATE TABLE item ` + itemColumns

// itemUnderTwoProxies starts two proxies over nodes n1 and n2, with a pool
// to each, and makes item, filled by fill, a reference table, with a tree
// stock of 64 rows in 6 shards beside it.
func itemUnderTwoProxies(t *testing.T, ctx context.Context, fill string) ([]*pgxpool.Pool, []*proxyProc) {
	t.Helper()
	var pools []*pgxpool.Pool
	var procs []*proxyProc
	for range 2 {
		p := startProxy(t, 2)
		procs = append(procs, p)
		pool, err := pgxpool.New(ctx, p.DSN("lattice"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pools = append(pools, pool)
	}
	for _, q := range []string{
		itemTable,
		fill,
		`SELECT lattice_create_reference_table('item')`,
		`CREATE TABLE stock (s_w_id int PRIMARY KEY, s_quantity int NOT NULL)`,
		`INSERT INTO stock SELECT w, 0 FROM generate_series(1, 64) w`,
		`SELECT lattice_create_tree('stock', 's_w_id', shard_count => 6)`,
	} {
		if _, err := pools[0].Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return pools, procs
}

// refWriters are four writers, each transaction of which updates a row of
// the tree stock and then inserts a row of item, alternating between
// pools: a refused write of item fails a transaction already under way.
type refWriters struct {
	committed atomic.Int64
	last      [4]atomic.Int64 // each writer's last committed item
	mu        sync.Mutex
	failures  []string
	stop      chan struct{}
	stopOnce  sync.Once
	wg        sync.WaitGroup
}

func startRefWriters(ctx context.Context, pools []*pgxpool.Pool) *refWriters {
	l := &refWriters{stop: make(chan struct{})}
	for w := range len(l.last) {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			pool := pools[w%len(pools)]
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				id := 1_000_000*(w+1) + i
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `UPDATE stock SET s_quantity = s_quantity + 1 WHERE s_w_id = $1`, 1+id%64); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `INSERT INTO item VALUES ($1, 1, 'w', 1.00, 'w')`, id)
					return err
				})
				if err != nil {
					l.mu.Lock()
					l.failures = append(l.failures, fmt.Sprintf("writer %d, item %d: %v", w, id, err))
					l.mu.Unlock()
					continue
				}
				l.committed.Add(1)
				l.last[w].Store(int64(id))
			}
		}()
	}
	return l
}

// finish stops the writers and waits for them.
func (l *refWriters) finish() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
}
