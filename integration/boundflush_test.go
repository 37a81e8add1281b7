package integration

import (
	"context"
	"strings"
	"testing"
	"time"

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
