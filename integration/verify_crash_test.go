package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// TestVerifyAfterCrash: the coordinator's proxy is killed (SIGKILL) right
// after the flip, before it compared the move, so the freeze's snapshots die
// with it; one row was changed on the split target in the drain, past
// replication. Clients then write the moved slots through another proxy
// (updates, inserts, a delete, one insert into the corrupted slot). The
// proxy that takes the coordinator over compares the source's fenced rows
// with the target's rows as of the flip, rebuilt from the target's write
// log: it names the corrupted slot, keeps the source's rows, and records
// the client's key in that slot as written since the flip. The repair
// restores the row and keeps every client write.
func TestVerifyAfterCrash(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fast := []string{"--reshard-lease", "3s", "--reshard-tick", "200ms"}
	b := startProxy(t, 2, append([]string{"--coordinator=false"}, fast...)...)
	a := startProxyEnv(t, 2, []string{"LATTICE_TEST_HOLD_AT=drain:" + hold, "LATTICE_TEST_CRASH_AT=flip"}, fast...)
	admin := connect(t, b.DSN("lattice"))
	const rows = 2000
	// Columns whose text depends on the session's settings: the write log
	// keeps a row as text and must read it back as it was.
	mustExec(t, admin, "CREATE TABLE items (k text PRIMARY KEY, v bigint NOT NULL, f float8, at timestamptz, b bytea)")
	mustExec(t, admin, fmt.Sprintf(`INSERT INTO items SELECT 'k' || g, g, random() * 1e6, now() - g * interval '1 min', decode(md5(g::text), 'hex')
		FROM generate_series(1, %d) g`, rows))
	mustExec(t, admin, "SELECT lattice_create_tree('items', 'k', shard_count => 2)")
	store := harnessStore(t)
	tr, err := store.Tree(ctx, "lattice", "items")
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, connect(t, a.DSN("lattice")), "SELECT lattice_reshard('items', 3)")
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
	target := connect(t, testNodeDSN(t, nodeIndex(mig.TargetNode)))
	mustExec(t, target, "SET session_replication_role = replica")
	var bad string
	if err := target.QueryRow(ctx, fmt.Sprintf("UPDATE %s SET v = -1 WHERE k = (SELECT min(k) FROM %s) RETURNING k",
		pgshard.ShardTable(tr, mig.Target), pgshard.ShardTable(tr, mig.Target))).Scan(&bad); err != nil {
		t.Fatal(err)
	}
	slotOf := func(key string) int {
		s, err := shardmap.SlotForText(tr.KeyType, []byte(key), tr.SlotCount)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	badSlot := slotOf(bad)
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	if !a.WaitExit(time.Minute) {
		t.Fatal("the coordinator's proxy did not reach crash point flip")
	}
	if err := a.crashedAt("flip"); err != nil {
		t.Fatal(err)
	}

	// Clients write the moved slots on the flipped map, with no coordinator.
	inMoved := func(key string) bool {
		s := slotOf(key)
		for _, rg := range mig.Slots {
			if s >= rg[0] && s <= rg[1] {
				return true
			}
		}
		return false
	}
	var moved []string
	for g := 1; g <= rows && len(moved) < 11; g++ {
		if k := "k" + strconv.Itoa(g); k != bad && inMoved(k) {
			moved = append(moved, k)
		}
	}
	// Another session's settings change the text of what it writes.
	mustExec(t, admin, "SET TimeZone = 'Asia/Kolkata'; SET extra_float_digits = 0; SET DateStyle = 'German'")
	mustExec(t, admin, "UPDATE items SET v = v + 1000000 WHERE k = ANY ($1)", moved[:10])
	mustExec(t, admin, "DELETE FROM items WHERE k = $1", moved[10])
	var deleted int64
	fmt.Sscan(moved[10][1:], &deleted)
	var fresh string // a new key in the corrupted slot
	for i := 0; fresh == ""; i++ {
		if k := "n" + strconv.Itoa(i); slotOf(k) == badSlot {
			fresh = k
		}
	}
	mustExec(t, admin, "INSERT INTO items (k, v) VALUES ($1, 7), ('m1', 8) ON CONFLICT (k) DO UPDATE SET v = excluded.v", fresh)

	c := startProxy(t, 2, fast...) // takes the coordinator over once the lease expires
	var phase string
	var slots *string
	pollUntil(t, time.Minute, "the migration to fail its verification", func() (bool, error) {
		err := admin.QueryRow(ctx, "SELECT phase, verify_failed_slots FROM lattice_reshard_status('items')").Scan(&phase, &slots)
		return phase == "verify_failed", err
	})
	if *slots != strconv.Itoa(badSlot) {
		t.Fatalf("verify_failed_slots %s, want %d", *slots, badSlot)
	}
	if !strings.Contains(c.Log(), "compared from the target's write log") {
		t.Fatal("the restarted coordinator did not compare from the write log")
	}
	if n := slotRows(t, ctx, tr, mig.Source, mig.SourceNode, mig.Slots); n != moving {
		t.Fatalf("the source holds %d of its %d moving rows: the release ran", n, moving)
	}
	var v *shardmap.Verification
	pollUntil(t, time.Minute, "the keys written since the flip to be recorded", func() (bool, error) {
		recs, err := store.Migrations(ctx, "lattice", "items")
		if err != nil || len(recs) != 1 {
			return false, fmt.Errorf("migrations %v, %v", recs, err)
		}
		v = recs[0].Verify
		return v.WrittenRead, nil
	})
	if !v.FromLog || len(v.Written) != 1 || v.Written[0].Slot != badSlot || !v.WrittenRead {
		t.Fatalf("verification %+v: want one key written since the flip, in slot %d", v, badSlot)
	}

	var msg string
	if err := admin.QueryRow(ctx, "SELECT lattice_repair_migration($1)", mig.ID).Scan(&msg); err != nil {
		t.Fatal(err)
	}
	t.Log(msg)
	pollUntil(t, time.Minute, "the reshard to complete", func() (bool, error) {
		var done bool
		err := admin.QueryRow(ctx, "SELECT lattice_reshard_complete('items')").Scan(&done)
		return done, err
	})
	var n, sum int64
	if err := admin.QueryRow(ctx, "SELECT count(*), sum(v) FROM items").Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	wantSum := int64(rows*(rows+1)/2) + 10*1000000 - deleted + 7 + 8
	if n != rows+1 || sum != wantSum {
		t.Fatalf("after the repair: %d rows, sum %d; want %d, %d", n, sum, rows+1, wantSum)
	}
	var got int64
	if err := admin.QueryRow(ctx, "SELECT v FROM items WHERE k = $1", bad).Scan(&got); err != nil || strconv.FormatInt(got, 10) != bad[1:] {
		t.Fatalf("repaired row %s holds %d (%v)", bad, got, err)
	}
	if n := writeLogsLeft(t, ctx, []string{testNodeDSN(t, nodeIndex(mig.TargetNode))}); n != 0 {
		t.Fatalf("%d write log triggers left on the target", n)
	}
	checkVerified(t, admin, "items", rows+1)
}

// writeLogsLeft counts the moves' write log triggers (5.5) and tables on
// the nodes: the release, or a recovery once it has proven the move, drops
// them.
func writeLogsLeft(t *testing.T, ctx context.Context, dsns []string) int {
	t.Helper()
	total := 0
	for _, dsn := range dsns {
		var n int
		if err := connect(t, dsn).QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lattice\_written\_m\_%')
			+ (SELECT count(*) FROM pg_class WHERE relname LIKE 'lattice\_written\_m\_%')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
}
