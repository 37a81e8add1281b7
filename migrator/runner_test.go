package migrator

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// checkMoved checks a finished move: the map routes its slots to the
// target, unfrozen; the target holds every moved row once, the source none;
// no fence is left; the record is gone.
func (r *testRig) checkMoved(mig *shardmap.Migration) {
	r.t.Helper()
	m := r.mapNow()
	for _, rg := range mig.Slots {
		for s := rg[0]; s <= rg[1]; s++ {
			if m.Slots[s] != mig.Target {
				r.t.Fatalf("slot %d routes to %d, want %d", s, m.Slots[s], mig.Target)
			}
		}
	}
	if len(m.Frozen) != 0 {
		r.t.Errorf("frozen slots left: %v", m.Frozen)
	}
	slots := 0
	for _, rg := range mig.Slots {
		slots += rg[1] - rg[0] + 1
	}
	if got := r.nodes.rows(mig.Target, mig.Slots); got != 4*slots {
		r.t.Errorf("target holds %d rows of the moved slots, want %d", got, 4*slots)
	}
	if got := r.nodes.rows(mig.Source, mig.Slots); got != 0 {
		r.t.Errorf("source still holds %d moved rows", got)
	}
	if len(r.nodes.fences) != 0 {
		r.t.Errorf("fences left: %v", r.nodes.fences)
	}
	if r.stored(mig) != nil {
		r.t.Errorf("migration record left")
	}
}

// TestRunPhases walks a split and a fold through the phase table, each
// phase recorded before its work.
func TestRunPhases(t *testing.T) {
	want := []shardmap.MigrationPhase{shardmap.PhasePrepare, shardmap.PhaseCopy, shardmap.PhaseDrain,
		shardmap.PhaseFreeze, shardmap.PhaseFlip, shardmap.PhaseRelease, shardmap.PhaseDone}
	for _, kind := range []shardmap.MigrationKind{shardmap.Split, shardmap.Fold} {
		t.Run(string(kind), func(t *testing.T) {
			r := newRig(t)
			mig := r.start(kind)
			if _, err := r.run(r.runner(""), mig); err != nil {
				t.Fatal(err)
			}
			r.checkMoved(mig)
			if got := r.store.recorded(); !slices.Equal(got, want) {
				t.Errorf("phases recorded %v, want %v", got, want)
			}
			if !r.nodes.called("take target "+mig.ID) || !r.nodes.called("take source "+mig.ID) {
				t.Error("the freeze took no snapshots")
			}
			if kind == shardmap.Fold && r.mapNow().Shards[mig.Source].State != shardmap.ShardRetired {
				t.Error("fold donor not retired")
			}
			want := []string{EventMigrationCommitted, EventMigrationRetired}
			if got := r.nodes.eventNames(); !slices.Equal(got, want) {
				t.Errorf("events %v, want %v", got, want)
			}
		})
	}
}

// TestPhaseTable holds the phase table whole: every phase is in it, every
// phase it names is, and done is the only end.
func TestPhaseTable(t *testing.T) {
	all := []shardmap.MigrationPhase{shardmap.PhasePrepare, shardmap.PhaseCopy, shardmap.PhaseDrain, shardmap.PhaseFreeze,
		shardmap.PhaseFlip, shardmap.PhaseVerifyFailed, shardmap.PhaseRelease, shardmap.PhaseDone}
	for _, p := range all {
		row, ok := phases[p]
		if !ok {
			t.Fatalf("phase %s is not in the table", p)
		}
		if row.does == "" || row.resume == "" {
			t.Errorf("phase %s does not say what it does and how it resumes", p)
		}
		for _, n := range row.next {
			if _, ok := phases[n]; !ok {
				t.Errorf("phase %s is followed by %s, which is not in the table", p, n)
			}
		}
		if (len(row.next) == 0) != (p == shardmap.PhaseDone) {
			t.Errorf("phase %s: next %v", p, row.next)
		}
	}
	if len(phases) != len(all) {
		t.Errorf("the table has %d phases, the test knows %d", len(phases), len(all))
	}
	mig := &shardmap.Migration{ID: "x", Phase: shardmap.PhaseVerifyFailed}
	if err := checkTransition(mig, shardmap.PhaseDone); err == nil {
		t.Error("verify_failed may skip the release")
	}
	mig.Phase = shardmap.PhaseFreeze
	if err := checkTransition(mig, shardmap.PhaseRelease); err == nil {
		t.Error("a freeze may skip the flip's verification")
	}
}

// TestRunCrashResume stops a run at each LATTICE_TEST_CRASH_AT point and
// resumes it in a fresh runner, which holds no snapshots: the move
// completes with every row once, verified. A crash after the flip loses
// the snapshots, so that move is compared from the target's write log;
// before it, the resumed freeze takes new ones.
func TestRunCrashResume(t *testing.T) {
	tests := []struct {
		point   string
		phase   shardmap.MigrationPhase // recorded at the crash
		fromLog bool
	}{
		{"copy", shardmap.PhaseCopy, false},
		{"drain", shardmap.PhaseDrain, false},
		{"freeze", shardmap.PhaseFreeze, false},
		{"flip", shardmap.PhaseFreeze, true},
		{"release", shardmap.PhaseRelease, false},
	}
	for _, kind := range []shardmap.MigrationKind{shardmap.Split, shardmap.Fold} {
		for _, tc := range tests {
			t.Run(string(kind)+"/"+tc.point, func(t *testing.T) {
				r := newRig(t)
				mig := r.start(kind)
				point, err := r.run(r.runner(tc.point), mig)
				if err != nil || point != tc.point {
					t.Fatalf("run stopped at %q (%v), want the crash at %q", point, err, tc.point)
				}
				rec := r.stored(mig)
				if rec.Phase != tc.phase {
					t.Fatalf("phase recorded at the crash: %s, want %s", rec.Phase, tc.phase)
				}
				if _, err := r.run(r.runner(""), rec); err != nil {
					t.Fatal(err)
				}
				r.checkMoved(mig)
				if rec.Verify == nil || !rec.Verify.Exact {
					t.Fatalf("the move was not verified: %+v", rec.Verify)
				}
				if rec.Verify.FromLog != tc.fromLog {
					t.Errorf("compared from the write log %v, want %v", rec.Verify.FromLog, tc.fromLog)
				}
				if r.nodes.logs[mig.ID] != nil {
					t.Error("the release left the target's write log")
				}
			})
		}
	}
}

// TestFreezeRollback: a final drain that does not fit the budget rolls the
// freeze back (fence dropped, slots thawed, back to drain), and the next
// freeze flips.
func TestFreezeRollback(t *testing.T) {
	r := newRig(t)
	mig := r.start(shardmap.Split)
	r.nodes.stall = true
	run := r.runner("")
	// Stop at the second drain: the freeze rolled back into it.
	drains := 0
	run.crash = func(p string) {
		if p == "drain" {
			if drains++; drains == 2 {
				panic(crashed{p})
			}
		}
	}
	if point, err := r.run(run, mig); point != "drain" || err != nil {
		t.Fatalf("run stopped at %q (%v), want the second drain", point, err)
	}
	rec := r.stored(mig)
	if rec.Phase != shardmap.PhaseDrain || rec.Freezes != 1 || rec.LastError == "" {
		t.Fatalf("after the rollback: phase %s, freezes %d, last error %q", rec.Phase, rec.Freezes, rec.LastError)
	}
	if m := r.mapNow(); len(m.Frozen) != 0 || m.Slots[mig.Slots[0][0]] != mig.Source {
		t.Fatalf("rollback left frozen %v, slot routed to %d", m.Frozen, m.Slots[mig.Slots[0][0]])
	}
	if len(r.nodes.fences) != 0 {
		t.Fatalf("rollback left fences %v", r.nodes.fences)
	}
	r.nodes.stall = false
	if _, err := r.run(r.runner(""), rec); err != nil {
		t.Fatal(err)
	}
	r.checkMoved(mig)
}

// TestFreezePutOffWhileSourceHeld: while a transaction older than the
// freeze budget holds the source table, a freeze would only pause writes
// and roll back, so none is tried (the map is never frozen, no fence is
// armed), and the record names the transaction. Once it is gone, the
// migration freezes and finishes.
func TestFreezePutOffWhileSourceHeld(t *testing.T) {
	r := newRig(t)
	mig := r.start(shardmap.Split)
	r.nodes.held = 2
	run := r.runner("")
	drains := 0
	run.crash = func(p string) {
		if p == "drain" {
			if drains++; drains == 3 {
				panic(crashed{p})
			}
		}
	}
	if point, err := r.run(run, mig); point != "drain" || err != nil {
		t.Fatalf("run stopped at %q (%v), want the third drain", point, err)
	}
	rec := r.stored(mig)
	if rec.Phase != shardmap.PhaseDrain || rec.Freezes != 0 || !strings.HasPrefix(rec.LastError, heldPrefix) || !strings.Contains(rec.LastError, "pid 42") {
		t.Fatalf("after two looks that found the source held: phase %s, freezes %d, last error %q", rec.Phase, rec.Freezes, rec.LastError)
	}
	if r.nodes.called("fence " + mig.ID) {
		t.Fatal("a fence was armed while the source was held")
	}
	if m := r.mapNow(); len(m.Frozen) != 0 || len(m.Freezing) != 0 {
		t.Fatalf("the map was left frozen %v, freezing %v while the source was held", m.Frozen, m.Freezing)
	}
	if _, err := r.run(r.runner(""), rec); err != nil {
		t.Fatal(err)
	}
	r.checkMoved(mig)
}

// TestFenceRemovalWaitNamed: while the release's removal of the fence waits
// for transactions on the source table, the record names them; once they
// end, the migration finishes.
func TestFenceRemovalWaitNamed(t *testing.T) {
	r := newRig(t)
	mig := r.start(shardmap.Split)
	r.nodes.dropBlocked = make(chan struct{})
	run := r.runner("")
	run.watchPoll = 10 * time.Millisecond
	ran := make(chan error, 1)
	go func() {
		_, err := r.run(run, mig)
		ran <- err
	}()
	deadline := time.After(30 * time.Second)
	for {
		if rec := r.stored(mig); rec != nil && strings.HasPrefix(rec.LastError, "fence removal waits") && strings.Contains(rec.LastError, "pid 43") {
			if rec.Phase != shardmap.PhaseRelease {
				t.Fatalf("the wait was named in phase %s, want release", rec.Phase)
			}
			break
		}
		select {
		case err := <-ran:
			t.Fatalf("the run ended (%v) before the wait was named", err)
		case <-deadline:
			t.Fatal("the fence removal's wait was never named")
		case <-time.After(5 * time.Millisecond):
		}
	}
	close(r.nodes.dropBlocked)
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	r.checkMoved(mig)
}

// TestSnapshotsAfterFlip: no snapshot is exported inside the write pause,
// so the pause runs the same steps with the verification on as off; both
// are exported once after the flip, and the comparison sees what the
// stream applied in the final drain, so the move is verified.
func TestSnapshotsAfterFlip(t *testing.T) {
	r := newRig(t)
	r.nodes.lateApply = true
	mig := r.start(shardmap.Split)
	run := r.runner("")
	run.crash = func(p string) {
		if p == "flip" && (r.nodes.called("take target "+mig.ID) || r.nodes.called("take source "+mig.ID)) {
			t.Error("a snapshot was exported before the flip was written")
		}
	}
	if _, err := r.run(run, mig); err != nil {
		t.Fatal(err)
	}
	r.checkMoved(mig)
	if v := r.stored(mig); v != nil {
		t.Fatalf("migration left in phase %s: %s", v.Phase, v.LastError)
	}
	takes := 0
	for _, c := range r.nodes.calls {
		if c == "take target "+mig.ID {
			takes++
		}
	}
	if takes != 1 {
		t.Errorf("target snapshot exported %d times, want 1", takes)
	}
}

// TestTargetSnapshotAfterClientWrite: the target's snapshot is exported
// after the flip, out of the pause, once a client has written a moved row
// on the target; the comparison reads the row as of the flip through the
// write log, so the move passes, and the client's row stays.
func TestTargetSnapshotAfterClientWrite(t *testing.T) {
	r := newRig(t)
	r.nodes.lateApply = true
	mig := r.start(shardmap.Split)
	slot := mig.Slots[0][0] + 1
	run := r.runner("")
	run.crash = func(p string) {
		if p == "flip" {
			r.nodes.write(mig.Target, slot, keyOf(slot, 1), "client", false)
		}
	}
	if _, err := r.run(run, mig); err != nil {
		t.Fatal(err)
	}
	if v := r.stored(mig); v != nil {
		t.Fatalf("migration left in phase %s: %s", v.Phase, v.LastError)
	}
	if v, _ := r.nodes.get(mig.Target, slot, keyOf(slot, 1)); v != "client" {
		t.Errorf("the client's row holds %q", v)
	}
	if mig.Verify == nil || !mig.Verify.Exact || mig.Verify.FromLog {
		t.Errorf("verification %+v, want one under the snapshots", mig.Verify)
	}
}

// TestVerifyOff: without verification no snapshot is taken, and the move
// completes.
func TestVerifyOff(t *testing.T) {
	r := newRig(t)
	r.opts.SkipVerify = true
	mig := r.start(shardmap.Split)
	if _, err := r.run(r.runner(""), mig); err != nil {
		t.Fatal(err)
	}
	r.checkMoved(mig)
	if r.nodes.called("opensnapshots") {
		t.Error("snapshots opened with verification off")
	}
}

// TestSnapshotExportFails: a move whose snapshots cannot be exported after
// the flip is still proven, from the target's write log, and released; it
// does not wait in verify_failed for an operator.
func TestSnapshotExportFails(t *testing.T) {
	r := newRig(t)
	r.nodes.exportErr = errors.New("fake: export failed")
	mig := r.start(shardmap.Split)
	if _, err := r.run(r.runner(""), mig); err != nil {
		t.Fatal(err)
	}
	r.checkMoved(mig)
	if v := r.stored(mig); v != nil {
		t.Fatalf("migration left in phase %s: %s", v.Phase, v.LastError)
	}
	if mig.Verify == nil || !mig.Verify.FromLog {
		t.Errorf("verification %+v, want one from the write log", mig.Verify)
	}
}

// TestSnapshotsUnavailable: a freeze whose snapshot connections cannot be
// opened does not start; the run fails and freezes nothing.
func TestSnapshotsUnavailable(t *testing.T) {
	r := newRig(t)
	r.nodes.noSnaps = true
	mig := r.start(shardmap.Split)
	if _, err := r.run(r.runner(""), mig); err == nil {
		t.Fatal("run succeeded without its snapshots")
	}
	if m := r.mapNow(); len(m.Frozen) != 0 || m.Slots[mig.Slots[0][0]] != mig.Source {
		t.Fatalf("frozen %v, slot routed to %d", m.Frozen, m.Slots[mig.Slots[0][0]])
	}
}
