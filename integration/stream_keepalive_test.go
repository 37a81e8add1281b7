package integration

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestStreamOutlivesCopy: a split's stream starts before its copy commits
// (docs/DESIGN.md 5.1) and is read only after it; the source ends a
// walsender it hears nothing from for wal_sender_timeout. With that set to
// 2 s on the nodes, the copy is held (the test-only hook, just before its
// commit) for three times as long while clients write the moving slots.
// The stream must come through on the status updates sent during the copy:
// one run carries the split to its end, with no stream stopped, and every
// write is in the tree.
func TestStreamOutlivesCopy(t *testing.T) {
	resetNodes(t)
	setNodeSetting(t, 2, "wal_sender_timeout", "2s")
	log := splitWithHeldCopy(t, 5000, func(*testing.T, context.Context) { time.Sleep(6 * time.Second) })
	if strings.Contains(log, "shadow copy stream stopped") {
		t.Errorf("the stream stopped during the held copy:\n%s", grepLines(log, "stream stopped|replication"))
	}
	runs := regexp.MustCompile(`msg="migration run"`).FindAllStringIndex(log, -1)
	if len(runs) != 1 {
		t.Errorf("%d runs of the split, want 1:\n%s", len(runs), grepLines(log, "migration run|level=ERROR|level=WARN"))
	}
}

// splitWithHeldCopy splits a tree "items" of rows rows on 2 nodes from 2
// shards to 3 with the copy held before its commit (the test-only hook)
// while clients insert 200 rows and update every seeded one, the moving
// slots among them; it calls during, lets the copy go, waits for the
// split, checks that every write is in the tree, and returns the proxy's
// log.
func splitWithHeldCopy(t *testing.T, rows int, during func(t *testing.T, ctx context.Context)) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hold := holdFile(t)
	p := startProxyEnv(t, 2, []string{"LATTICE_TEST_HOLD_AT=copy:" + hold}, "--reshard-tick", "200ms")
	pool := proxyPool(t, ctx, p)
	admin := connect(t, p.DSN("lattice"))
	mustExec(t, admin, "CREATE TABLE items (k text PRIMARY KEY, v bigint NOT NULL)")
	mustExec(t, admin, fmt.Sprintf("INSERT INTO items SELECT 'k' || g, g FROM generate_series(1, %d) g", rows))
	mustExec(t, admin, "SELECT lattice_create_tree('items', 'k', shard_count => 2)")

	mustExec(t, admin, "SELECT lattice_reshard('items', 3)")
	waitHeld(t, hold, "the split's copy to be held before its commit")
	const added = 200
	for g := range added {
		if _, err := pool.Exec(ctx, "INSERT INTO items VALUES ($1, $2)", fmt.Sprintf("n%d", g), g); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, "UPDATE items SET v = v + 1000000 WHERE k LIKE 'k%'"); err != nil {
		t.Fatal(err)
	}
	during(t, ctx)
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	waitReshardComplete(t, ctx, pool, "items", 2*time.Minute)
	var count, sum int64
	if err := pool.QueryRow(ctx, "SELECT count(*), sum(v) FROM items").Scan(&count, &sum); err != nil {
		t.Fatal(err)
	}
	wantSum := int64(rows)*int64(rows+1)/2 + int64(rows)*1000000 + added*(added-1)/2
	if count != int64(rows+added) || sum != wantSum {
		t.Fatalf("%d rows summing to %d after the split, want %d summing to %d", count, sum, rows+added, wantSum)
	}
	return p.Log()
}

// grepLines is the lines of log that match the regular expression re.
func grepLines(log, re string) string {
	m := regexp.MustCompile(re)
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if m.MatchString(l) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
