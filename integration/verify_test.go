package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// nodeIndex is the harness index of node "n<i+1>".
func nodeIndex(node string) int { n, _ := strconv.Atoi(node[1:]); return n - 1 }

// slotRows counts the rows of slots in a shard table, on its node directly.
func slotRows(t *testing.T, ctx context.Context, tr *shardmap.Tree, shard int, node string, slots [][2]int) int {
	t.Helper()
	c := connect(t, testNodeDSN(t, nodeIndex(node)))
	var n int
	if err := c.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE %s", pgshard.ShardTable(tr, shard),
		btreeindex.SlotPredicate(tr, "", slots))).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestVerifyCatchesCorruption: a row changed on the split target during the
// drain, past replication (a direct connection with
// session_replication_role = replica), is caught after the flip: the
// migration stops in verify_failed before the release, lattice_reshard_status
// names its slot, a migration_verify_failed event goes out, and the source
// keeps every moving row. lattice_repair_migration copies the row again,
// the reshard completes, and every row holds its value.
func TestVerifyCatchesCorruption(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p := startProxyEnv(t, 2, []string{"LATTICE_TEST_HOLD_AT=drain:" + hold}, "--reshard-tick", "200ms")
	admin := connect(t, p.DSN("lattice"))
	listener := connect(t, p.DSN("lattice"))
	const rows = 5000
	mustExec(t, admin, "CREATE TABLE items (k text PRIMARY KEY, v bigint NOT NULL)")
	mustExec(t, admin, fmt.Sprintf("INSERT INTO items SELECT 'k' || g, g FROM generate_series(1, %d) g", rows))
	mustExec(t, admin, "SELECT lattice_create_tree('items', 'k', shard_count => 2)")
	mustExec(t, listener, "LISTEN lattice_events")
	store := harnessStore(t)
	tr, err := store.Tree(ctx, "lattice", "items")
	if err != nil {
		t.Fatal(err)
	}

	mustExec(t, admin, "SELECT lattice_reshard('items', 3)")
	pollUntil(t, time.Minute, "the split to reach its drain", func() (bool, error) {
		_, err := os.Stat(hold + ".reached")
		return err == nil, nil
	})
	migs, err := store.Migrations(ctx, "lattice", "items")
	if err != nil || len(migs) != 1 {
		t.Fatalf("migrations %v, %v", migs, err)
	}
	mig := migs[0]
	moving := slotRows(t, ctx, tr, mig.Source, mig.SourceNode, mig.Slots)
	if moving == 0 {
		t.Fatal("no rows in the moving slots")
	}

	// Corrupt one copied row on the target, past replication.
	target := connect(t, testNodeDSN(t, nodeIndex(mig.TargetNode)))
	mustExec(t, target, "SET session_replication_role = replica")
	var key string
	if err := target.QueryRow(ctx, fmt.Sprintf("UPDATE %s SET v = -1 WHERE k = (SELECT min(k) FROM %s) RETURNING k",
		pgshard.ShardTable(tr, mig.Target), pgshard.ShardTable(tr, mig.Target))).Scan(&key); err != nil {
		t.Fatal(err)
	}
	slot, err := shardmap.SlotForText(tr.KeyType, []byte(key), tr.SlotCount)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}

	var failed, slots *string
	pollUntil(t, time.Minute, "the migration to fail its verification", func() (bool, error) {
		var phase string
		err := admin.QueryRow(ctx, "SELECT phase, verify_failed_migration, verify_failed_slots FROM lattice_reshard_status('items')").Scan(&phase, &failed, &slots)
		return phase == "verify_failed", err
	})
	if *failed != mig.ID || *slots != strconv.Itoa(slot) {
		t.Fatalf("lattice_reshard_status names migration %s, slots %s; want %s, slot %d", *failed, *slots, mig.ID, slot)
	}
	var done bool
	if err := admin.QueryRow(ctx, "SELECT lattice_reshard_complete('items')").Scan(&done); err != nil || done {
		t.Fatalf("reshard complete %v, %v while its move failed verification", done, err)
	}
	// Ticks go by; the release does not happen.
	time.Sleep(time.Second)
	if n := slotRows(t, ctx, tr, mig.Source, mig.SourceNode, mig.Slots); n != moving {
		t.Fatalf("the source holds %d of its %d moving rows: the release ran", n, moving)
	}
	recs, err := store.Migrations(ctx, "lattice", "items")
	if err != nil || len(recs) != 1 || recs[0].Phase != shardmap.PhaseVerifyFailed {
		t.Fatalf("migration records %v, %v", recs, err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	for {
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			t.Fatalf("no migration_verify_failed event: %v", err)
		}
		var ev struct {
			Event     string `json:"event"`
			Migration string `json:"migration"`
			Slots     []int  `json:"slots"`
		}
		if err := json.Unmarshal([]byte(n.Payload), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Event == "migration_verify_failed" {
			if ev.Migration != mig.ID || len(ev.Slots) != 1 || ev.Slots[0] != slot {
				t.Fatalf("event %s", n.Payload)
			}
			break
		}
	}

	var msg string
	if err := admin.QueryRow(ctx, "SELECT lattice_repair_migration($1)", mig.ID).Scan(&msg); err != nil {
		t.Fatal(err)
	}
	t.Log(msg)
	pollUntil(t, 2*time.Minute, "the reshard to complete", func() (bool, error) {
		err := admin.QueryRow(ctx, "SELECT lattice_reshard_complete('items')").Scan(&done)
		return done, err
	})
	var n, sum int64
	if err := admin.QueryRow(ctx, "SELECT count(*), sum(v) FROM items").Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	if n != rows || sum != rows*(rows+1)/2 {
		t.Fatalf("after the repair: %d rows, sum %d; want %d, %d", n, sum, rows, rows*(rows+1)/2)
	}
	var v int64
	if err := admin.QueryRow(ctx, "SELECT v FROM items WHERE k = $1", key).Scan(&v); err != nil || strconv.FormatInt(v, 10) != key[1:] {
		t.Fatalf("repaired row %s holds %d (%v)", key, v, err)
	}
	checkVerified(t, admin, "items", rows)
}

// checkVerified runs lattice_verify: every row on its owner, none stray.
func checkVerified(t *testing.T, c *pgx.Conn, tree string, rows int64) {
	t.Helper()
	r, err := c.Query(context.Background(), "SELECT status, sum(rows)::int8 FROM lattice_verify($1) GROUP BY status ORDER BY status", tree)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	var status string
	var n int64
	if _, err := pgx.ForEachRow(r, []any{&status, &n}, func() error { got[status] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["owned"] != rows {
		t.Fatalf("lattice_verify(%s): %v, want %d rows owned", tree, got, rows)
	}
}

// TestLatticeVerify: lattice_verify reports rows on a shard that does not
// own their slot; repair => true deletes those whose key the owner holds
// and leaves the one that may be a write's only copy.
func TestLatticeVerify(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	const rows = 1000
	mustExec(t, c, "CREATE TABLE items (k text PRIMARY KEY, v bigint NOT NULL)")
	mustExec(t, c, fmt.Sprintf("INSERT INTO items SELECT 'k' || g, g FROM generate_series(1, %d) g", rows))
	mustExec(t, c, "SELECT lattice_create_tree('items', 'k', shard_count => 2)")
	checkVerified(t, c, "items", rows)
	store := harnessStore(t)
	tr, m := storedTree(t, ctx, store, "items")
	// A copy of k1 and a row without a copy, on the shard that does not own k1's slot.
	slot, _ := shardmap.SlotForText(tr.KeyType, []byte("k1"), tr.SlotCount)
	other := 1 - m.Slots[slot]
	node := connect(t, testNodeDSN(t, nodeIndex(m.Shards[other].Node)))
	lone := ""
	for i := 0; lone == ""; i++ {
		k := "lone" + strconv.Itoa(i)
		if s, _ := shardmap.SlotForText(tr.KeyType, []byte(k), tr.SlotCount); m.Slots[s] != other {
			lone = k
		}
	}
	mustExec(t, node, fmt.Sprintf("INSERT INTO %s VALUES ('k1', 1), ($1, 0)", pgshard.ShardTable(tr, other)), lone)

	strays := func() map[string]int64 {
		r, err := c.Query(ctx, "SELECT k.status, sum(k.rows)::int8 FROM lattice_verify('items') AS k WHERE k.status <> 'owned' GROUP BY 1")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		var s string
		var n int64
		if _, err := pgx.ForEachRow(r, []any{&s, &n}, func() error { out[s] = n; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := strays(); got["stray"] != 2 || len(got) != 1 {
		t.Fatalf("lattice_verify before the repair: %v, want 2 stray rows", got)
	}
	// A repair runs only in a statement of its own.
	r, err := c.Query(ctx, "SELECT * FROM lattice_verify('items', repair => true)")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	var shard, sl, owner int32
	var nodeName, s string
	var n int64
	if _, err := pgx.ForEachRow(r, []any{&shard, &nodeName, &sl, &n, &owner, &s}, func() error { got[s] += n; return nil }); err != nil {
		t.Fatal(err)
	}
	if got["removed"] != 1 || got["stray"] != 1 || got["owned"] != rows {
		t.Fatalf("lattice_verify(repair => true): %v, want 1 removed, 1 stray", got)
	}
	if got := strays(); got["stray"] != 1 || len(got) != 1 {
		t.Fatalf("lattice_verify after the repair: %v, want the row without a copy", got)
	}
	if _, err := c.Exec(ctx, "SELECT count(*) FROM lattice_verify('items', repair => true) v"); sqlState(err) != "0A000" {
		t.Fatalf("a composed repair: %v, want 0A000", err)
	}
}
