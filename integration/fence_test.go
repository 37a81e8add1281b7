package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// keyInSlots returns a key whose slot lies in [lo, hi] (inside == true) or
// outside it.
func keyInSlots(t *testing.T, lo, hi int, inside bool) string {
	t.Helper()
	for i := 0; i < 100000; i++ {
		k := fmt.Sprintf("key-%d", i)
		s, err := shardmap.SlotForText(shardmap.KeyText, []byte(k), 4096)
		if err != nil {
			t.Fatal(err)
		}
		if (s >= lo && s <= hi) == inside {
			return k
		}
	}
	t.Fatal("no key found")
	return ""
}

// TestSlotFence checks the fence of a freeze: writes to the fenced slots get
// LT001, other slots keep working, the migrator's cleanup passes, and
// installing it waits for a transaction already writing to a fenced slot.
func TestSlotFence(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := ctCluster(t, 1)
	tree := &shardmap.Tree{Tenant: "lattice", Name: "fenced", KeyColumn: "k", KeyType: shardmap.KeyText, SlotCount: 4096}
	table := pgshard.ShardTable(tree, 3)
	conn, err := pgx.Connect(ctx, testNodeDSN(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{"CREATE SCHEMA " + shardmap.SchemaName(3), "CREATE TABLE " + table + " (k text PRIMARY KEY, v int)"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	in1, in2 := keyInSlots(t, 2048, 4095, true), keyInSlots(t, 3000, 4095, true)
	out := keyInSlots(t, 2048, 4095, false)
	if _, err := conn.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 1), ($2, 1)", in1, out); err != nil {
		t.Fatal(err)
	}

	// A writer inside the table when the fence is installed: the install
	// waits for it, and its row is committed before the fence.
	writer, err := pgx.Connect(ctx, testNodeDSN(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(ctx)
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 2)", in2); err != nil {
		t.Fatal(err)
	}
	fence := pgshard.SlotFence{Migration: "f1", Tree: tree, Shard: 3, Slots: [][2]int{{2048, 4095}}, Target: 9, Epoch: 7}
	installed := make(chan error, 1)
	go func() { installed <- cl.InstallSlotFence(ctx, "n1", fence) }()
	select {
	case err := <-installed:
		t.Fatalf("the fence was installed while a writer was inside the table (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-installed; err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name, sql string
		args      []any
		code      string
	}{
		{"insert into a fenced slot", "INSERT INTO " + table + " VALUES ($1, 3)", []any{keyInSlots(t, 2048, 2100, true)}, "LT001"},
		{"update of a fenced row", "UPDATE " + table + " SET v = 4 WHERE k = $1", []any{in1}, "LT001"},
		{"delete of a fenced row", "DELETE FROM " + table + " WHERE k = $1", []any{in2}, "LT001"},
		{"truncate", "TRUNCATE " + table, nil, "LT001"},
		{"update of another slot", "UPDATE " + table + " SET v = 5 WHERE k = $1", []any{out}, ""},
		{"insert into another slot", "INSERT INTO " + table + " VALUES ($1, 6)", []any{keyInSlots(t, 0, 2047, true) + "x"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := conn.Exec(ctx, c.sql, c.args...)
			var pgErr *pgconn.PgError
			switch {
			case c.code == "" && err != nil:
				t.Fatalf("got %v, want success", err)
			case c.code != "" && (!errors.As(err, &pgErr) || pgErr.Code != c.code):
				t.Fatalf("got %v, want SQLSTATE %s", err, c.code)
			case c.code != "" && pgErr.Detail != "moved to shard 9 at epoch 7":
				t.Fatalf("detail %q, want the target and the epoch of the fence", pgErr.Detail)
			}
		})
	}

	// The migrator's release passes the fence.
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL "+pgshard.MigratorSetting+" = 'on'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DELETE FROM "+table+" WHERE "+btreeindex.SlotPredicate(tree, "", fence.Slots))
		return err
	})
	if err != nil {
		t.Fatalf("migrator delete: %v", err)
	}
	if err := cl.DropSlotFence(ctx, "n1", fence); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 7)", in1); err != nil {
		t.Fatalf("write after the fence was dropped: %v", err)
	}
}

// fencedShard makes shard table 3 of tree "fenced" on the first node,
// empty, and a cluster over that node.
func fencedShard(t *testing.T) (*pgshard.Cluster, string, *pgx.Conn) {
	t.Helper()
	resetNodes(t)
	table := pgshard.ShardTable(fencedTree, 3)
	conn := connect(t, testNodeDSN(t, 0))
	mustExec(t, conn, "CREATE SCHEMA "+shardmap.SchemaName(3))
	mustExec(t, conn, "CREATE TABLE "+table+" (k text PRIMARY KEY, v int)")
	return ctCluster(t, 1), table, conn
}

// fencedTree is the tree of fencedShard.
var fencedTree = &shardmap.Tree{Tenant: "lattice", Name: "fenced", KeyColumn: "k", KeyType: shardmap.KeyText, SlotCount: 4096}

// fencedSlots is a fence of the upper half of fencedShard's slots.
func fencedSlots() pgshard.SlotFence {
	return pgshard.SlotFence{Migration: "f1", Tree: fencedTree, Shard: 3, Slots: [][2]int{{2048, 4095}}, Target: 9, Epoch: 7}
}

// TestFenceApartFromControlPool: arming a fence, which happens inside a
// write pause, does not wait for a connection of the node's control pool,
// which a release's deletes or another migration's work can hold whole.
func TestFenceApartFromControlPool(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, table, conn := fencedShard(t)
	admin, err := cl.Admin(ctx, "n1", "lattice")
	if err != nil {
		t.Fatal(err)
	}
	// Every connection of the control pool, held.
	for {
		actx, acancel := context.WithTimeout(ctx, 200*time.Millisecond)
		c, err := admin.Acquire(actx)
		acancel()
		if err != nil {
			break
		}
		defer c.Release()
	}
	fence := fencedSlots()
	fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
	defer fcancel()
	if err := cl.InstallSlotFence(fctx, "n1", fence); err != nil {
		t.Fatalf("the fence waited for the control pool: %v", err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 1)", keyInSlots(t, 2048, 4095, true)); err == nil {
		t.Fatal("a write to a fenced slot passed")
	}
}

// TestFenceArmAfterConnectionLoss: the arm's connection is never pinged
// (a ping would add a round trip to the write pause), so an arm that finds
// it broken, here by pg_terminate_backend between the prepare and the arm,
// goes again on a new connection rather than failing the freeze.
func TestFenceArmAfterConnectionLoss(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, table, conn := fencedShard(t)
	fence := fencedSlots()
	if err := cl.PrepareSlotFence(ctx, "n1", fence); err != nil {
		t.Fatal(err)
	}
	var ended int
	if err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity
		WHERE application_name = 'lattice-admin' AND pid <> pg_backend_pid()`).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if ended == 0 {
		t.Fatal("no connection of the cluster's pools to end")
	}
	if _, err := cl.ArmSlotFence(ctx, "n1", fence); err != nil {
		t.Fatalf("arm after its connection was ended: %v", err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 1)", keyInSlots(t, 2048, 4095, true)); err == nil {
		t.Fatal("a write to a fenced slot passed")
	}
}

// TestFenceArmGivenUpNeverCommits: an arm whose freeze budget ends while
// it waits for the table's lock returns only once its backend can no
// longer commit. pgconn gives up on a context's end by closing the
// connection, and the backend, still waiting, would take the lock when the
// writer ends and fence the slots of a freeze that was rolled back.
func TestFenceArmGivenUpNeverCommits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, table, conn := fencedShard(t)
	fence := fencedSlots()
	if err := cl.PrepareSlotFence(ctx, "n1", fence); err != nil {
		t.Fatal(err)
	}
	writer := connect(t, testNodeDSN(t, 0))
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN ROW EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	// The budget ends inside the arm's first lock wait (50 ms), and the
	// writer ends at once after.
	actx, acancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = cl.ArmSlotFence(actx, "n1", fence)
	acancel()
	if rerr := tx.Rollback(ctx); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil {
		t.Fatal("the arm passed a held lock")
	}
	time.Sleep(300 * time.Millisecond)
	var triggers int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lattice_fence_m_%'").Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	if triggers != 0 {
		t.Fatalf("the arm given up (%v) committed %d fence triggers after it returned", err, triggers)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 1)", keyInSlots(t, 2048, 4095, true)); err != nil {
		t.Fatalf("a write after the arm was given up: %v", err)
	}
}

// TestFenceArmConnectionWarmed: a prepare readies the connection the arm
// will take, so the arm inside the pause loads no catalog cache: its
// first prepare on a connection runs the arm's statements on a temporary
// table, and every prepare opens the fence's tables, in a transaction
// rolled back. A lock held on the table does not hold the prepare, the
// dry run leaves nothing behind, and the arm after it still fences.
func TestFenceArmConnectionWarmed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, table, conn := fencedShard(t)
	schema := shardmap.SchemaName(3)
	mustExec(t, conn, "CREATE TABLE "+schema+"."+pgshard.OwnerTable+" (tree text PRIMARY KEY, epoch bigint NOT NULL, slots int4multirange NOT NULL, updated timestamptz NOT NULL DEFAULT now())")
	mustExec(t, conn, "INSERT INTO "+schema+"."+pgshard.OwnerTable+" VALUES ('fenced', 1, '{[0,4096)}')")
	var logged syncBuffer
	cl, err := pgshard.NewCluster([]pgshard.Node{{Name: "n1", DSN: testNodeDSN(t, 0)}},
		slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	fence := fencedSlots()
	fence.Handover = &pgshard.Handover{Kind: "split", TargetNode: "n1"}
	for range 2 {
		if err := cl.PrepareSlotFence(ctx, "n1", fence); err != nil {
			t.Fatal(err)
		}
	}
	warmed := regexp.MustCompile(`arm connection warmed" shard=3 first=(\w+)`).FindAllStringSubmatch(logged.String(), -1)
	if len(warmed) != 2 || warmed[0][1] != "true" || warmed[1][1] != "false" {
		t.Fatalf("want a first warm-up with the dry run, then one without; the log:\n%s", logged.String())
	}
	// A DDL statement holding the table does not hold the prepare: the
	// warm-up gives up after its lock_timeout.
	lock, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	prepared := make(chan error, 1)
	go func() { prepared <- cl.PrepareSlotFence(ctx, "n1", fence) }()
	select {
	case err := <-prepared:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a prepare waited for the table's lock")
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`arm connection not warmed" shard=3 first=false err=.*55P03`).MatchString(logged.String()) {
		t.Fatalf("want a warm-up that gave up on the lock; the log:\n%s", logged.String())
	}
	if _, err := cl.ArmSlotFence(ctx, "n1", fence); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, 1)", keyInSlots(t, 2048, 4095, true)); !sqlstate.Is(err, sqlstate.SlotMoved) {
		t.Fatalf("a write to a fenced slot after the arm: %v, want %s", err, sqlstate.SlotMoved)
	}
	var triggers int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'lattice_arm_warm%'").Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	if triggers != 0 {
		t.Fatalf("the dry run left %d triggers", triggers)
	}
}
