package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/shardmap"
)

// TestFreezePassesTransactionThatWrote: a transaction that wrote to a
// split's source before the freeze, and whose next statements reach the
// moving slots while they are frozen (by the key, a read over every shard,
// a write without the key, an INSERT of several rows), goes on on the
// source, in the extended and the simple protocol. Held, it would keep its
// lock, which the fence waits for, until the freeze's budget rolled the
// freeze back (under TPC-C 9 of 31 freezes rolled back so). Here no freeze
// rolls back, and every write lands once.
func TestFreezePassesTransactionThatWrote(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hold := holdFile(t)
	// The transaction is open from before the drain ends until after the
	// freeze: a freeze puts itself off while a transaction older than its
	// budget holds the source (ci-58: 3 s on a loaded machine), so the
	// budget is long here. Without the rule the freeze still rolls back,
	// after it.
	p := startProxyEnv(t, 2, []string{"LATTICE_TEST_HOLD_AT=drain:" + hold}, "--reshard-tick", "200ms", "--freeze-budget", "15s")
	admin := connect(t, p.DSN("lattice"))
	const rows = 2000
	mustExec(t, admin, "CREATE TABLE passing (k int PRIMARY KEY, v bigint NOT NULL)")
	mustExec(t, admin, fmt.Sprintf("INSERT INTO passing SELECT g, 0 FROM generate_series(1, %d) g", rows))
	mustExec(t, admin, "SELECT lattice_create_tree('passing', 'k', shard_count => 2)")
	store := harnessStore(t)
	tr, _ := storedTree(t, ctx, store, "passing")
	for i, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		shards := 3 + i
		if i > 0 {
			_ = os.Remove(hold + ".reached")
			if err := os.WriteFile(hold, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		mustExec(t, admin, fmt.Sprintf("SELECT lattice_reshard('passing', %d)", shards))
		waitHeld(t, hold, "the split to reach its drain")
		migs, err := store.Migrations(ctx, "lattice", "passing")
		if err != nil || len(migs) != 1 {
			t.Fatalf("migrations %v, %v", migs, err)
		}
		key, slot := movingKey(t, tr, migs[0].Slots, 1, rows)
		added, _ := movingKey(t, tr, migs[0].Slots, rows*(2+i)+1, rows*(3+i))

		tx := connect(t, p.DSN("lattice"))
		update := "UPDATE passing SET v = v + 1 WHERE k = $1"
		mustExec(t, tx, "BEGIN")
		if _, err := tx.Exec(ctx, update, mode, key); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(hold); err != nil {
			t.Fatal(err)
		}
		pollUntil(t, time.Minute, "the moving slots to freeze", func() (bool, error) {
			m, err := store.Map(ctx, "lattice", "passing")
			return err == nil && m.IsFrozen(slot), err
		})
		if _, err := tx.Exec(ctx, update, mode, key); err != nil {
			t.Fatal(err)
		}
		// Over every shard: a read, and a write without the key.
		var sum int64
		if err := tx.QueryRow(ctx, "SELECT sum(v) FROM passing WHERE k > $1", mode, 0).Scan(&sum); err != nil || sum != 2 {
			t.Fatalf("protocol %v: sum %d, %v inside the transaction; want 2", mode, sum, err)
		}
		if _, err := tx.Exec(ctx, "UPDATE passing SET v = v + 1 WHERE v < $1", mode, 0); err != nil {
			t.Fatal(err)
		}
		// An INSERT of several rows, one of them in a moving slot.
		if _, err := tx.Exec(ctx, "INSERT INTO passing VALUES ($1, 0), ($2, 0)", mode, added, rows+1+i); err != nil {
			t.Fatal(err)
		}
		mustExec(t, tx, "COMMIT")
		tx.Close(ctx)
		pollUntil(t, time.Minute, "the reshard to complete", func() (bool, error) {
			var done bool
			err := admin.QueryRow(ctx, "SELECT lattice_reshard_complete('passing')").Scan(&done)
			return done, err
		})
		var v int64
		if err := admin.QueryRow(ctx, "SELECT v FROM passing WHERE k = $1", key).Scan(&v); err != nil || v != 2 {
			t.Fatalf("protocol %v: key %d holds %d, %v; want its two writes", mode, key, v, err)
		}
		mustExec(t, admin, "UPDATE passing SET v = 0 WHERE k = $1", key)
	}
	if n := strings.Count(p.Log(), "freeze rolled back"); n > 0 {
		t.Fatalf("%d freezes rolled back: the transaction's statement waited for its own lock", n)
	}
	var n int64
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM passing").Scan(&n); err != nil || n != rows+4 {
		t.Fatalf("count %d, %v; want %d", n, err, rows+4)
	}
}

// movingKey is a key of from..to whose slot is among slots, and its slot.
func movingKey(t *testing.T, tr *shardmap.Tree, slots [][2]int, from, to int) (key, slot int) {
	t.Helper()
	for k := from; k <= to; k++ {
		s, err := shardmap.SlotForText(tr.KeyType, []byte(strconv.Itoa(k)), tr.SlotCount)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range slots {
			if s >= r[0] && s <= r[1] {
				return k, s
			}
		}
	}
	t.Fatalf("no key of %d..%d in the moving slots %v", from, to, slots)
	return 0, 0
}
