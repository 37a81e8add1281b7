package migrator

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// VerifyNodes is what the verification of a move asks of the nodes.
type VerifyNodes interface {
	// OpenSnapshots connects to mig's source and target, before the pause,
	// for the snapshots the freeze takes, which cover the tables of ts;
	// timeout bounds each statement of the comparison.
	OpenSnapshots(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration, timeout time.Duration) (Snapshots, error)
	// DiffNow lists the keys of slots whose rows differ on source and
	// target now, leaving out ignore.
	DiffNow(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, slots []int, ignore []shardmap.RowDiff, timeout time.Duration) ([]shardmap.RowDiff, error)
	// RepairRows makes the target's row of each key the source's.
	RepairRows(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, diffs []shardmap.RowDiff) error
	// MarkVerifyFailed records on the source's node that the migration
	// failed its verification in slots, for `lattice recover-map` should
	// Redis lose the phase; ClearVerifyFailed removes the record.
	MarkVerifyFailed(ctx context.Context, t *shardmap.Tree, node string, idx int, migration string, slots [][2]int) error
	ClearVerifyFailed(ctx context.Context, t *shardmap.Tree, node string, idx int, migration string) error
	// PrepareWriteLog makes mig's target log, for each key of the moving
	// slots that a client writes there, its row before the first such
	// write (writelog_pg.go); made before the pause, dropped by
	// DropWriteLog at the release.
	PrepareWriteLog(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration) error
	DropWriteLog(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration) error
	// OpenWriteLog compares mig's slots as of the flip without the
	// freeze's snapshots: the source's fenced rows against the target's
	// rebuilt from its write log.
	OpenWriteLog(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration, timeout time.Duration) (Comparison, error)
}

// Snapshots are a move's exported snapshots, one a side.
type Snapshots interface {
	// TakeTarget exports the target's snapshot, in one round trip; called
	// again, it ends the one before and exports another.
	TakeTarget(ctx context.Context) error
	// TakeSource exports the source's snapshot, in one round trip, once
	// its fence is armed.
	TakeSource(ctx context.Context) error
	Comparison
}

// Comparison compares a move's slots as of its flip, under the freeze's
// snapshots or from the target's write log.
type Comparison interface {
	// Compare compares the moving slots: per slot, the rows and the sum of
	// the rows' 64-bit hashes, and the differing keys of the slots that
	// differ.
	Compare(ctx context.Context) (*shardmap.Verification, error)
	// WrittenSince lists the keys of slots whose target rows clients
	// wrote since the flip; the slots must be frozen.
	WrittenSince(ctx context.Context, slots []int) ([]shardmap.RowDiff, error)
	Close()
}

// Verification outcomes, the label of the verification metric.
const (
	VerifyPassed   = "passed"
	VerifyFailed   = "failed"
	VerifyRepaired = "repaired"
)

// EventMigrationVerifyFailed: a move's target did not hold the source's
// rows; the event names the slots.
const EventMigrationVerifyFailed = "migration_verify_failed"

// holdSnapshots keeps a move's snapshots from its freeze to its comparison,
// in the run that took them.
func (r *Runner) holdSnapshots(id string, s Snapshots) {
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	if r.snaps == nil {
		r.snaps = map[string]Snapshots{}
	}
	if old := r.snaps[id]; old != nil {
		old.Close()
	}
	r.snaps[id] = s
}

// takeSnapshots hands the held snapshots of id over, nil when none.
func (r *Runner) takeSnapshots(id string) Snapshots {
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	s := r.snaps[id]
	delete(r.snaps, id)
	return s
}

// verifyMove compares a flipped move's slots and records the outcome:
// release, or verify_failed with the differing slots frozen.
func (r *Runner) verifyMove(ctx context.Context, u unit, mig *shardmap.Migration, log *slog.Logger) error {
	t := u.lead
	var cmp Comparison
	if snaps := r.takeSnapshots(mig.ID); snaps != nil {
		cmp = snaps
	} else if !r.opts.SkipVerify || mig.Compare {
		// The snapshots died with the run that took them (a crash after
		// the flip), or their export failed: the target's write log still
		// shows its rows as of the flip, under the writes clients made
		// since. A move that froze with its write log is compared even by
		// a run started with --verify-moves=false: its source is released
		// only once proven.
		log.Info("move compared from the target's write log: the snapshots were lost with the run that took them, or not exported")
		var err error
		if cmp, err = r.cluster.OpenWriteLog(ctx, u.trees, mig, r.opts.VerifyTimeout); err != nil {
			return err
		}
	} else {
		return r.setPhase(ctx, mig, shardmap.PhaseRelease)
	}
	defer cmp.Close()
	if err := r.waitFreezes(ctx, mig); err != nil {
		return err
	}
	v, err := cmp.Compare(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		if connFailure(err) {
			// A node out of reach says nothing of the copy: the run
			// fails, and the next compares from the target's write log,
			// which holds the target's rows as of the flip until the
			// release (a lossy link failed three folds' comparisons here
			// at once, and held them for an operator).
			return fmt.Errorf("migrator: compare the move's rows: %w", err)
		}
		// Any other error (a statement timeout) would come again: the
		// move waits for an operator like one that differs.
		return r.failVerify(ctx, mig, &shardmap.Verification{At: time.Now().UTC()}, "verification could not run: "+err.Error(), log)
	}
	r.metrics.VerifySeconds.WithLabelValues(mig.Tree, mig.Tenant).Observe(v.Seconds)
	r.metrics.VerifyRows.WithLabelValues(mig.Tree, mig.Tenant).Add(float64(v.Rows))
	mig.Verify = v
	if len(v.Differ) == 0 {
		r.metrics.Verifications.WithLabelValues(mig.Tree, mig.Tenant, VerifyPassed).Inc()
		log.Info("move verified", "rows", v.Rows, "bytes_scanned", v.BytesScanned, "took", time.Duration(v.Seconds*float64(time.Second)), "from_write_log", v.FromLog)
		return r.setPhase(ctx, mig, shardmap.PhaseRelease)
	}
	// Recorded first, so that no later run releases the move. Then the
	// differing slots stop serving until the repair (their rows on the
	// target cannot be vouched for), which fixes the rows clients wrote
	// since the flip: the repair must keep those.
	if err := r.failVerify(ctx, mig, v, fmt.Sprintf("verification failed: slots %s differ", formatSlots(v.Differ)), log); err != nil {
		return err
	}
	slots := diffSlots(v)
	if err := r.freezeSlots(ctx, t, slotRanges(slots)); err != nil {
		return err
	}
	if v.Written, err = cmp.WrittenSince(ctx, slots); err != nil {
		return err
	}
	v.WrittenRead = true
	return r.store.PutMigration(ctx, mig)
}

// freezePoll is how often a comparison looks whether the freezes it waits
// for have ended.
const freezePoll = 20 * time.Millisecond

// waitFreezes waits, at most a freeze budget, while another migration of
// mig's tree freezes on a node of mig's, so that the comparison's scans do
// not take the CPU and I/O of its pause. A freeze that starts during the
// comparison is the rarer case: freezes wait for comparisons
// (busyBeforeFreeze).
func (r *Runner) waitFreezes(ctx context.Context, mig *shardmap.Migration) error {
	deadline := time.Now().Add(r.opts.FreezeBudget)
	for time.Now().Before(deadline) {
		migs, err := r.store.Migrations(ctx, mig.Tenant, mig.Tree)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(migs, func(o *shardmap.Migration) bool { return o.ID != mig.ID && holdsComparison(o, mig) }) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(freezePoll):
		}
	}
	return nil
}

// holdsComparison reports whether o freezes on a node of mig's, which
// mig's comparison waits for.
func holdsComparison(o, mig *shardmap.Migration) bool {
	return o.Phase == shardmap.PhaseFreeze && sharesNode(o, mig)
}

// failVerify records mig in verify_failed with v, counts it, logs it and
// sends its event.
func (r *Runner) failVerify(ctx context.Context, mig *shardmap.Migration, v *shardmap.Verification, why string, log *slog.Logger) error {
	mig.Verify, mig.LastError = v, why
	// On the source's node first: a recovery after Redis lost its data
	// must not release the move (migrator/recover.go).
	t := &shardmap.Tree{Tenant: mig.Tenant, Name: mig.Tree}
	if err := r.cluster.MarkVerifyFailed(ctx, t, mig.SourceNode, mig.Source, mig.ID, slotRanges(diffSlots(v))); err != nil {
		return err
	}
	if err := r.setPhase(ctx, mig, shardmap.PhaseVerifyFailed); err != nil {
		return err
	}
	r.metrics.Verifications.WithLabelValues(mig.Tree, mig.Tenant, VerifyFailed).Inc()
	log.Error("move verification failed; the source keeps its rows until lattice_repair_migration",
		"why", why, "differing_rows", len(v.DiffRows))
	ev := migrationEvent(EventMigrationVerifyFailed, mig, r.mapEpoch(ctx, mig.Tenant, mig.Tree))
	ev.Slots = diffSlots(v)
	r.publish(ctx, ev)
	return nil
}

func diffSlots(v *shardmap.Verification) []int {
	out := make([]int, len(v.Differ))
	for i, d := range v.Differ {
		out[i] = d.Slot
	}
	return out
}

// slotRanges is one range a slot, so each thaws alone.
func slotRanges(slots []int) [][2]int {
	out := make([][2]int, len(slots))
	for i, s := range slots {
		out[i] = [2]int{s, s}
	}
	return out
}

// freezeSlots adds rg to the frozen slots and waits until the proxies hold
// their statements.
func (r *Runner) freezeSlots(ctx context.Context, t *shardmap.Tree, rg [][2]int) error {
	m, err := r.updateMap(ctx, t.Tenant, t.MapName(), func(m *shardmap.Map) (bool, error) {
		changed := false
		for _, x := range rg {
			if !slices.Contains(m.Frozen, x) {
				m.Frozen = append(m.Frozen, x)
				changed = true
			}
		}
		return changed, nil
	})
	if err != nil {
		return err
	}
	return r.waitAcks(ctx, t, m)
}

// thawSlots removes rg from the frozen slots.
func (r *Runner) thawSlots(ctx context.Context, t *shardmap.Tree, rg [][2]int) error {
	_, err := r.updateMap(ctx, t.Tenant, t.MapName(), func(m *shardmap.Map) (bool, error) {
		next := removeRanges(m.Frozen, rg)
		if len(next) == len(m.Frozen) {
			return false, nil
		}
		m.Frozen = next
		return true, nil
	})
	return err
}

// Repair is lattice_repair_migration for a migration in verify_failed: it
// makes the target's differing rows the source's, except rows clients
// wrote since the flip, compares the differing slots again with every
// other key, and on a match thaws them and lets the release go on. The
// slots stay frozen, and the migration verify_failed, while they differ.
func (r *Runner) Repair(ctx context.Context, mig *shardmap.Migration) (string, error) {
	if mig.Phase != shardmap.PhaseVerifyFailed || mig.Verify == nil {
		return "", sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "migration %s is in phase %s, not verify_failed", mig.ID, mig.Phase)
	}
	v := mig.Verify
	if len(v.Differ) > 0 && !v.WrittenRead {
		e := sqlstate.New(sqlstate.DataCorrupted, "migration %s: the rows clients wrote since the flip were not recorded (the verifying run ended early), so a copy from the source could overwrite them", mig.ID)
		e.Hint = "Compare the slots by hand (lattice_verify shows their counts); the source still holds its rows."
		return "", e
	}
	if v.DiffRowsCut {
		e := sqlstate.New(sqlstate.DataCorrupted, "migration %s: more than %d rows differ; lattice_repair_migration repairs at most that many", mig.ID, maxDiffRows)
		e.Hint = "Compare the slots by hand (lattice_verify shows their counts); the source still holds its rows."
		return "", e
	}
	u, err := r.unitOf(ctx, mig.Tenant, mig.Tree)
	if err != nil {
		return "", err
	}
	t := u.lead
	slots := diffSlots(v)
	if err := r.freezeSlots(ctx, t, slotRanges(slots)); err != nil {
		return "", err
	}
	written := map[shardmap.RowDiff]bool{}
	for _, w := range v.Written {
		written[w] = true
	}
	var fix []shardmap.RowDiff
	for _, d := range v.DiffRows {
		if !written[d] {
			fix = append(fix, d)
		}
	}
	// Table by table: a colocation group's rows name their table.
	var left []shardmap.RowDiff
	err = u.each(func(t *shardmap.Tree) error {
		if err := r.cluster.RepairRows(ctx, t, mig, rowsOf(fix, t)); err != nil {
			return err
		}
		got, err := r.cluster.DiffNow(ctx, t, mig, slots, v.Written, r.opts.VerifyTimeout)
		left = append(left, got...)
		return err
	})
	if err != nil {
		return "", err
	}
	if len(left) > 0 {
		e := sqlstate.New(sqlstate.DataCorrupted, "migration %s: after the repair %d rows of slots %s still differ from the source", mig.ID, len(left), formatSlots(v.Differ))
		e.Hint = "The source keeps its rows and the slots stay frozen; look at the rows by hand, then call lattice_repair_migration again."
		return "", e
	}
	v.Differ, v.DiffRows, v.Repaired = nil, nil, slots
	v.At = time.Now().UTC()
	mig.LastError = ""
	r.metrics.Verifications.WithLabelValues(mig.Tree, mig.Tenant, VerifyRepaired).Inc()
	if err := r.cluster.ClearVerifyFailed(ctx, t, mig.SourceNode, mig.Source, mig.ID); err != nil {
		return "", err
	}
	if err := r.setPhase(ctx, mig, shardmap.PhaseRelease); err != nil {
		return "", err
	}
	if err := r.thawSlots(ctx, t, slotRanges(slots)); err != nil {
		return "", err
	}
	msg := fmt.Sprintf("migration %s repaired: %d rows copied again from the source, %d rows written since the flip kept; slots %s verified",
		mig.ID, len(fix), len(v.Written), formatSlots(slotDiffs(slots)))
	r.log.Info(msg)
	return msg, nil
}

// rowsOf are the rows of diffs in t's table.
func rowsOf(diffs []shardmap.RowDiff, t *shardmap.Tree) []shardmap.RowDiff {
	var out []shardmap.RowDiff
	for _, d := range diffs {
		if d.Tree == rowTree(t) {
			out = append(out, d)
		}
	}
	return out
}

func slotDiffs(slots []int) []shardmap.SlotDiff {
	out := make([]shardmap.SlotDiff, len(slots))
	for i, s := range slots {
		out[i].Slot = s
	}
	return out
}

// repairedSlots are the slots a repair verified, frozen until the release
// thaws them (the repair thaws them too; this covers a crash in between).
func repairedSlots(mig *shardmap.Migration) [][2]int {
	if mig.Verify == nil {
		return nil
	}
	return slotRanges(mig.Verify.Repaired)
}
