package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TestWriteBoundBeforeFlushSurvivesReshard: a write bound before a Flush
// and executed after it holds no view of the map while it waits, so no
// acknowledgement waits for it. Its Bind's lock on the shard table is what
// keeps a split of that shard from freezing past it: the fence's arm
// waits for the lock and the freeze is rolled back. Executed while the
// reshard runs, the write must land where the tree's reads find it
// afterwards, not in moved rows of its shard that the release deletes.
func TestWriteBoundBeforeFlushSurvivesReshard(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := startProxy(t, 2, "--reshard-tick", "200ms", "--freeze-budget", "500ms")
	pool := proxyPool(t, ctx, p,
		"CREATE TABLE bflush (k bigint PRIMARY KEY, v int NOT NULL)",
		"INSERT INTO bflush SELECT g, 0 FROM generate_series(1, 2000) g",
		"SELECT lattice_create_tree('bflush', 'k', shard_count => 2)")

	// A row of the slots the split of shard 0 (slots 0 to 2047) moves.
	var key string
	if err := pool.QueryRow(ctx, "SELECT min(k)::text FROM bflush WHERE (hashint8extended(k, 0) & 4095) BETWEEN 1024 AND 2047").Scan(&key); err != nil {
		t.Fatal(err)
	}
	w := dialWire(t, p.DSN("lattice"))
	w.send(&pgproto3.Parse{Query: "UPDATE bflush SET v = 7 WHERE k = $1"},
		&pgproto3.Bind{Parameters: [][]byte{text(key)}}, &pgproto3.Flush{})
	if got := w.read(func(m pgproto3.BackendMessage) bool { _, ok := m.(*pgproto3.BindComplete); return ok }); got != "ParseComplete BindComplete" {
		t.Fatalf("Parse, Bind, Flush: %s", got)
	}
	if _, err := pool.Exec(ctx, "SELECT lattice_reshard('bflush', 4)"); err != nil {
		t.Fatal(err)
	}
	// Long enough for the split of the row's shard to try its freeze.
	pollUntil(t, time.Minute, "a freeze to be tried", func() (bool, error) {
		return strings.Contains(p.Log(), "migration phase") && strings.Contains(p.Log(), "phase=freeze"), nil
	})
	time.Sleep(2 * time.Second)
	got := w.round(&pgproto3.Execute{}, &pgproto3.Sync{})
	switch got {
	case "CommandComplete ReadyForQuery:I":
	case "ErrorResponse:LT001 ReadyForQuery:I":
		t.Logf("the write was refused by the fence, not lost: %s", got)
	default:
		t.Fatalf("Execute, Sync: %s", got)
	}
	waitReshardComplete(t, ctx, pool, "bflush", 2*time.Minute)
	var v, n int
	if err := pool.QueryRow(ctx, "SELECT v FROM bflush WHERE k = $1", key).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM bflush").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if got == "CommandComplete ReadyForQuery:I" && v != 7 || n != 2000 {
		t.Fatalf("after the reshard: row %s has v = %d after %q; %d rows, want 2000", key, v, got, n)
	}
}

// TestReferenceWriteBoundBeforeFlushSurvivesCopy: a reference table's
// write bound before a Flush and executed after it, while the table is
// copied to a node that joins (a move places a shard there, and the copy
// comes first), reaches every copy, the new one included. It holds no view
// while it waits; the locks its Bind took on each copy hold the new copy
// back until it has run.
func TestReferenceWriteBoundBeforeFlushSurvivesCopy(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := startProxy(t, 2, "--reshard-tick", "200ms")
	pool := proxyPool(t, ctx, p,
		"CREATE TABLE item (i_id int PRIMARY KEY, i_im_id int, i_name text, i_price numeric(5,2), i_data text)",
		"INSERT INTO item SELECT i, i % 7, 'item-' || i, 1.50, 'x' FROM generate_series(1, 100) i",
		"SELECT lattice_create_reference_table('item')",
		"CREATE TABLE stock (s_i_id int PRIMARY KEY, s_quantity int NOT NULL)",
		"INSERT INTO stock SELECT g, 10 FROM generate_series(1, 100) g",
		"SELECT lattice_create_tree('stock', 's_i_id', shard_count => 2)")
	if _, err := pool.Exec(ctx, "SELECT lattice_add_node('n3', $1)", testNodeDSN(t, 2)); err != nil {
		t.Fatal(err)
	}

	w := dialWire(t, p.DSN("lattice"))
	w.send(&pgproto3.Parse{Query: "UPDATE item SET i_name = 'bound' WHERE i_id = $1"},
		&pgproto3.Bind{Parameters: [][]byte{text("5")}}, &pgproto3.Flush{})
	if got := w.read(func(m pgproto3.BackendMessage) bool { _, ok := m.(*pgproto3.BindComplete); return ok }); got != "ParseComplete BindComplete" {
		t.Fatalf("Parse, Bind, Flush: %s", got)
	}
	if _, err := pool.Exec(ctx, "SELECT lattice_move_shard('stock', 0, 'n3')"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if got := w.round(&pgproto3.Execute{}, &pgproto3.Sync{}); got != "CommandComplete ReadyForQuery:I" {
		t.Fatalf("Execute, Sync: %s", got)
	}
	pollUntil(t, 2*time.Minute, "the move to complete", func() (bool, error) {
		var ok bool
		err := pool.QueryRow(ctx, "SELECT lattice_rebalance_complete('stock')").Scan(&ok)
		return ok, err
	})
	var nodes []*pgx.Conn
	for i := range 3 {
		nodes = append(nodes, connect(t, testNodeDSN(t, i)))
	}
	if copies := sameCopies(t, ctx, nodes, ""); !strings.Contains(copies, "5|5|bound|") {
		t.Fatalf("the copies lack the bound write: %.300s", copies)
	}
}
