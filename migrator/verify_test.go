package migrator

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/shardmap"
)

// corruptAtDrain changes one copied row on the target once the copy is
// done, as a write that bypassed replication would, and returns its slot.
func (r *testRig) corruptAtDrain(run *Runner, mig *shardmap.Migration, edit func(f *fakeNodes, slot int)) int {
	slot := mig.Slots[0][0] + 1
	run.crash = func(p string) {
		if p == "drain" {
			edit(r.nodes, slot)
		}
	}
	return slot
}

// TestVerifyCatchesCorruption: a row changed, added or lost on the target
// stops the move in verify_failed, the slot named, before the release;
// the source keeps its rows and the slot is frozen. The repair copies the
// row again and the move completes.
func TestVerifyCatchesCorruption(t *testing.T) {
	edits := map[string]func(f *fakeNodes, slot int){
		"changed": func(f *fakeNodes, slot int) { f.put(f.target, slot, keyOf(slot, 0), "corrupt") },
		"added":   func(f *fakeNodes, slot int) { f.put(f.target, slot, "stray", "v") },
		"lost": func(f *fakeNodes, slot int) {
			f.mu.Lock()
			delete(f.tables[f.target][slot], keyOf(slot, 0))
			f.mu.Unlock()
		},
		// Two rows swapped between keys: the count stays, the sum does not.
		"swapped": func(f *fakeNodes, slot int) {
			f.put(f.target, slot, keyOf(slot, 0), "x")
			f.put(f.target, slot, keyOf(slot, 1), "y")
		},
	}
	for name, edit := range edits {
		for _, kind := range []shardmap.MigrationKind{shardmap.Split, shardmap.Fold} {
			t.Run(name+"/"+string(kind), func(t *testing.T) {
				r := newRig(t)
				mig := r.start(kind)
				r.nodes.target = mig.Target
				run := r.runner("")
				slot := r.corruptAtDrain(run, mig, edit)
				if _, err := r.run(run, mig); err != nil {
					t.Fatal(err)
				}
				rec := r.stored(mig)
				if rec == nil {
					t.Fatal("the move completed: it was released unchecked")
				}
				if rec.Phase != shardmap.PhaseVerifyFailed {
					t.Fatalf("phase %s, want verify_failed", rec.Phase)
				}
				if len(rec.Verify.Differ) != 1 || rec.Verify.Differ[0].Slot != slot {
					t.Fatalf("differing slots %+v, want slot %d", rec.Verify.Differ, slot)
				}
				// The stream's objects go at the flip (its part is over);
				// the release's drops and deletes must not run.
				if r.nodes.called("delete") || r.nodes.called("drop ") {
					t.Fatalf("the release ran: %v", r.nodes.calls)
				}
				if got := r.nodes.rows(mig.Source, mig.Slots); got == 0 {
					t.Fatal("the source lost its rows")
				}
				if m := r.mapNow(); !m.IsFrozen(slot) {
					t.Errorf("slot %d is not frozen while it differs", slot)
				}
				if !slices.Contains(r.nodes.eventNames(), EventMigrationVerifyFailed) {
					t.Errorf("no %s event: %v", EventMigrationVerifyFailed, r.nodes.eventNames())
				}
				// A run (the coordinator's next tick) does not go on.
				if _, err := r.run(r.runner(""), rec); err != nil || r.stored(mig).Phase != shardmap.PhaseVerifyFailed {
					t.Fatalf("a new run moved the migration on: %v", err)
				}
				msg, err := r.runner("").Repair(r.ctx, rec)
				if err != nil {
					t.Fatal(err)
				}
				t.Log(msg)
				if _, err := r.run(r.runner(""), r.stored(mig)); err != nil {
					t.Fatal(err)
				}
				r.checkMoved(mig)
				if v, _ := r.nodes.get(mig.Target, slot, keyOf(slot, 0)); v != "v" {
					t.Errorf("repaired row holds %q", v)
				}
			})
		}
	}
}

// TestRepairKeepsClientWrites: a row of a differing slot that a client
// wrote on the target after the flip (before the slot was frozen) is newer
// than the source's and survives the repair.
func TestRepairKeepsClientWrites(t *testing.T) {
	r := newRig(t)
	mig := r.start(shardmap.Split)
	r.nodes.target = mig.Target
	run := r.runner("")
	slot := r.corruptAtDrain(run, mig, func(f *fakeNodes, slot int) { f.put(f.target, slot, keyOf(slot, 0), "corrupt") })
	r.nodes.afterCompare = func(f *fakeNodes) {
		f.write(f.target, slot, keyOf(slot, 1), "client", false)
		f.write(f.target, slot, "new", "client", false)
	}
	if _, err := r.run(run, mig); err != nil {
		t.Fatal(err)
	}
	rec := r.stored(mig)
	if rec.Phase != shardmap.PhaseVerifyFailed || len(rec.Verify.Written) != 2 {
		t.Fatalf("phase %s, written since the flip %+v", rec.Phase, rec.Verify.Written)
	}
	if _, err := r.runner("").Repair(r.ctx, rec); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{keyOf(slot, 0): "v", keyOf(slot, 1): "client", "new": "client"} {
		if v, _ := r.nodes.get(mig.Target, slot, key); v != want {
			t.Errorf("row %s holds %q after the repair, want %q", key, v, want)
		}
	}
	if m := r.mapNow(); m.IsFrozen(slot) {
		t.Error("the repaired slot is still frozen")
	}
}

// TestRepairRefusesOtherPhases: only a migration in verify_failed is
// repaired.
func TestRepairRefusesOtherPhases(t *testing.T) {
	r := newRig(t)
	mig := r.start(shardmap.Split)
	if _, err := r.runner("").Repair(r.ctx, mig); err == nil {
		t.Fatal("a migration in prepare was repaired")
	}
}

func keyOf(slot, i int) string { return fmt.Sprintf("k%d-%d", slot, i) }

// TestReshardHoldsAtVerifyFailed: a coordinator tick starts no migration
// while one of the tree's moves waits in verify_failed, nor runs it.
func TestReshardHoldsAtVerifyFailed(t *testing.T) {
	r := newRig(t)
	mig := r.start(shardmap.Split)
	mig.Phase = shardmap.PhaseVerifyFailed
	if err := r.store.PutMigration(r.ctx, mig); err != nil {
		t.Fatal(err)
	}
	if other, err := r.store.StartReshard(r.ctx, &shardmap.Reshard{OpID: "op", Tenant: "app", Tree: "items", Target: 8, From: 4,
		Grow: true, Phase: ReshardMigrating, Started: time.Now()}); err != nil || other != nil {
		t.Fatal(other, err)
	}
	c := NewCoordinator("c1", r.runner(""), CoordinatorOptions{}, nil)
	if err := c.Tick(r.ctx, "app", "items"); err != nil {
		t.Fatal(err)
	}
	c.wg.Wait()
	migs, err := r.store.Migrations(r.ctx, "app", "items")
	if err != nil {
		t.Fatal(err)
	}
	if len(migs) != 1 || migs[0].Phase != shardmap.PhaseVerifyFailed {
		t.Fatalf("after the tick: %d migrations, first in %s", len(migs), migs[0].Phase)
	}
	// A split the tick started would have run to its end by now.
	if hw := r.mapNow().HighWater; hw != mig.Target+1 {
		t.Fatalf("the tick allocated shards up to %d: it started splits", hw-1)
	}
}

// TestVerifyUnreachableRetries: a comparison that fails because a node is
// out of reach (a socket error, SQLSTATE 08006) fails the run, not the
// move: the next run compares from the target's write log and releases.
// Held in verify_failed, the move waited for an operator (TestPartitions,
// lossy link: three folds at once).
func TestVerifyUnreachableRetries(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"socket error", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}},
		{"08006", &pgconn.PgError{Code: "08006", Message: "connection failure"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			mig := r.start(shardmap.Split)
			r.nodes.compareErr = tc.err
			if _, err := r.run(r.runner(""), mig); err == nil {
				t.Fatal("the run went on past a comparison that could not reach a node")
			}
			rec := r.stored(mig)
			if rec == nil || rec.Phase == shardmap.PhaseVerifyFailed || r.nodes.called("delete") {
				t.Fatalf("after a comparison that could not reach a node: %+v (released: %v)", rec, r.nodes.called("delete"))
			}
			r.nodes.compareErr = nil
			if _, err := r.run(r.runner(""), rec); err != nil {
				t.Fatal(err)
			}
			if rec := r.stored(mig); rec != nil && rec.Phase != shardmap.PhaseDone {
				t.Fatalf("after the network came back: %+v", rec)
			}
			r.checkMoved(mig)
		})
	}
}

// TestVerifyErrorHolds: a comparison that cannot run for a reason that
// would come again (a statement timeout) holds the move in verify_failed
// like a mismatch; the operator's repair lets it go on.
func TestVerifyErrorHolds(t *testing.T) {
	r := newRig(t)
	mig := r.start(shardmap.Split)
	r.nodes.compareErr = errors.New("canceling statement due to statement timeout")
	if _, err := r.run(r.runner(""), mig); err != nil {
		t.Fatal(err)
	}
	rec := r.stored(mig)
	if rec == nil || rec.Phase != shardmap.PhaseVerifyFailed || rec.LastError == "" {
		t.Fatalf("after a comparison that failed: %+v", rec)
	}
	if r.nodes.called("delete") {
		t.Fatal("the release ran")
	}
	if _, err := r.runner("").Repair(r.ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := r.run(r.runner(""), r.stored(mig)); err != nil {
		t.Fatal(err)
	}
	r.checkMoved(mig)
}
