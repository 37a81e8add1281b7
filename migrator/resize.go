package migrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// A resize of one shard (kind resize) is a migration through the split's
// pipeline into a fresh shard on the same node: the target is a new index,
// created from the tree's DDL log, which holds the new layout
// (pgshard.SetLayout), so the copy writes every row into pages of the new
// layout. The copy reads the source whole (it is unmixed and moves every
// slot it owns); the flip retires the source as a fold retires its donor,
// and the release drops its table. The index changes, the node and the
// slots do not.
//
// The specification's interlock with folds: a resize is not waited for. A
// fold may take as its donor a shard a resize is still forwarding (the
// resize's copy or drain, before its freeze); the fold's release then
// keeps the donor's storage (the fold completes routing-only), and the
// resize, finding its source retired, gives up that shard: it drops what
// it made and, once no other migration reads the donor, the donor's table.
// The two never freeze the same slots: a fold does not start on a donor
// whose slots are frozen, and a resize does not freeze while a fold of its
// source is in flight. Both checks run inside the map write that would
// start the one (a fold's survivor marked mixed, a resize's freeze), and a
// fold's record is stored before that write, so whichever writes second
// sees the other.

// errResizeYields: a fold of the resize's source is in flight, so the
// resize does not freeze; it drains and tries again.
var errResizeYields = errors.New("migrator: a fold of the shard is in flight; the resize waits for it before it freezes")

// errSourceGone: the resize's source no longer owns its slots (a fold
// retired it, an empty tree's re-pin gave them out anew), so the resize of
// that shard is given up.
var errSourceGone = errors.New("migrator: the resized shard no longer owns its slots")

// errFoldYields: a fold's donor has slots frozen by a resize (or lost
// them), so the fold is dropped before it changes anything; the
// coordinator plans again.
var errFoldYields = errors.New("migrator: the fold's donor is being frozen by a resize")

// StartResize records the resize of shard source of t: a pending target on
// the source's node, every slot of the source. Run carries it out.
func (r *Runner) StartResize(ctx context.Context, t *shardmap.Tree, source int) (*shardmap.Migration, error) {
	r.forgetReserved(t)
	migs, err := r.store.Migrations(ctx, t.Tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	for _, o := range inFlight(migs) {
		if o.Source == source || o.Target == source {
			return nil, fmt.Errorf("%w: shard %d is part of migration %s", ErrBusy, source, o.ID)
		}
	}
	mig := &shardmap.Migration{ID: newID(), Tenant: t.Tenant, Tree: t.MapName(), Kind: shardmap.Resize,
		Source: source, Phase: shardmap.PhasePrepare, Created: time.Now().UTC()}
	return r.startWithTarget(ctx, t, mig, func(m *shardmap.Map) error {
		src, ok := m.Shards[source]
		if !ok || src.State != shardmap.ShardActive || src.Mixed {
			return fmt.Errorf("%w: shard %d of %s is not an unmixed active shard", ErrBusy, source, t.Name)
		}
		mig.Slots = m.SlotRanges(source)
		if len(mig.Slots) == 0 {
			return fmt.Errorf("%w: shard %d of %s owns no slots", ErrBusy, source, t.Name)
		}
		mig.TargetNode, mig.SourceNode = src.Node, src.Node
		return nil
	})
}

// ownsAll reports whether shard idx is active in m and owns every slot of
// ranges.
func ownsAll(m *shardmap.Map, idx int, ranges [][2]int) bool {
	if m.Shards[idx].State != shardmap.ShardActive {
		return false
	}
	for _, rg := range ranges {
		for s := rg[0]; s <= rg[1]; s++ {
			if m.Slots[s] != idx {
				return false
			}
		}
	}
	return true
}

// resizeIntact reports whether the resize mig can still flip in m: its
// source is active and owns exactly the slots it recorded, and its target
// is still pending. A fold retires the source; an empty tree's re-pin gives
// the slots out anew and retires the target.
func resizeIntact(m *shardmap.Map, mig *shardmap.Migration) bool {
	return m.Shards[mig.Source].State == shardmap.ShardActive && slices.Equal(m.SlotRanges(mig.Source), mig.Slots) &&
		m.Shards[mig.Target].State == shardmap.ShardPending
}

// mayFreeze is asked inside the map write that freezes mig's slots, on
// the map that write would replace: a resize whose source a fold retired
// is given up (errSourceGone), and one whose source a fold in flight is
// taking waits (errResizeYields). Other kinds always may.
func (r *Runner) mayFreeze(ctx context.Context, m *shardmap.Map, mig *shardmap.Migration) error {
	if mig.Kind != shardmap.Resize {
		return nil
	}
	if !resizeIntact(m, mig) {
		return errSourceGone
	}
	migs, err := r.store.Migrations(ctx, mig.Tenant, mig.Tree)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(migs, func(o *shardmap.Migration) bool {
		return o.Kind == shardmap.Fold && o.Source == mig.Source && o.Phase != shardmap.PhaseDone
	}) {
		return errResizeYields
	}
	return nil
}

// foldMayStart is asked inside the map write that marks a fold's survivor
// mixed: a donor whose slots a resize froze, or that lost them, is not
// folded.
func foldMayStart(m *shardmap.Map, mig *shardmap.Migration) error {
	if !ownsAll(m, mig.Source, mig.Slots) {
		return errFoldYields
	}
	for _, rg := range mig.Slots {
		if slices.ContainsFunc(m.Frozen, func(f [2]int) bool { return f[0] <= rg[1] && rg[0] <= f[1] }) {
			return errFoldYields
		}
	}
	return nil
}

// forwardingResize is the resize still forwarding shard idx other than
// mig, if any: its stream reads the shard's table, so a fold's release
// keeps that table.
func (r *Runner) forwardingResize(ctx context.Context, mig *shardmap.Migration, idx int) (*shardmap.Migration, error) {
	migs, err := r.store.Migrations(ctx, mig.Tenant, mig.Tree)
	if err != nil {
		return nil, err
	}
	for _, o := range migs {
		if o.ID != mig.ID && o.Kind == shardmap.Resize && o.Source == idx && o.Phase != shardmap.PhaseDone {
			return o, nil
		}
	}
	return nil, nil
}

// resizeSourceGone reports whether mig is a resize, not flipped, whose
// source no longer owns its slots.
func (r *Runner) resizeSourceGone(ctx context.Context, mig *shardmap.Migration) (bool, error) {
	if mig.Kind != shardmap.Resize || phaseFlipped(mig.Phase) {
		return false, nil
	}
	m, err := r.store.Map(ctx, mig.Tenant, mig.Tree)
	if err != nil {
		return false, err
	}
	return !resizeIntact(m, mig), nil
}

// abandonPoll is how often an abandoned resize looks whether the fold that
// retired its source has ended.
const abandonPoll = 200 * time.Millisecond

// abandonResize gives up the resize of a shard a fold retired: its stream's
// objects, its target table and the target's pending map entry go; then,
// once no other migration reads the retired source (the fold has ended),
// the source's table, which the fold kept for this resize; the record last,
// so that a crash anywhere before resumes here. Every step can run again.
func (r *Runner) abandonResize(ctx context.Context, u unit, mig *shardmap.Migration) error {
	t := u.lead
	r.log.Info("resize of a shard a fold retired given up", "migration", mig.ID, "tree", mig.Tree, "shard", mig.Source, "target", mig.Target)
	if err := r.cluster.DropShadow(ctx, u.trees, mig); err != nil {
		return err
	}
	if err := r.cluster.DropWriteLog(ctx, u.trees, mig); err != nil {
		return err
	}
	if err := r.dropMembers(ctx, u, mig.Target, mig.TargetNode); err != nil {
		return err
	}
	if _, err := r.updateMap(ctx, t.Tenant, t.MapName(), func(m *shardmap.Map) (bool, error) {
		s, ok := m.Shards[mig.Target]
		if !ok || s.State != shardmap.ShardPending {
			return false, nil
		}
		// The high-water mark stays past it: the index is not handed out again.
		delete(m.Shards, mig.Target)
		return true, nil
	}); err != nil {
		return err
	}
	for {
		migs, err := r.store.Migrations(ctx, mig.Tenant, mig.Tree)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(inFlight(migs), func(o *shardmap.Migration) bool {
			return o.ID != mig.ID && (o.Source == mig.Source || o.Target == mig.Source)
		}) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(abandonPoll):
		}
	}
	m, err := r.store.Map(ctx, t.Tenant, t.MapName())
	if err != nil {
		return err
	}
	if m.Shards[mig.Source].State == shardmap.ShardRetired && m.SlotCounts()[mig.Source] == 0 {
		if err := r.dropMembers(ctx, u, mig.Source, mig.SourceNode); err != nil {
			return err
		}
	}
	if err := r.dropFences(ctx, u, mig, false); err != nil {
		return err
	}
	r.metrics.ResizeShards.WithLabelValues(mig.Tree, mig.Tenant, "abandoned").Inc()
	return r.store.DeleteMigration(ctx, mig.Tenant, mig.Tree, mig.ID)
}

// forwarding reports whether o is a resize of shard idx that has not
// frozen yet: it only forwards the shard's rows, and a fold may take the
// shard as its donor without waiting for it.
func forwarding(o *shardmap.Migration, idx int) bool {
	return o.Kind == shardmap.Resize && o.Source == idx &&
		(o.Phase == shardmap.PhasePrepare || o.Phase == shardmap.PhaseCopy || o.Phase == shardmap.PhaseDrain)
}

// foldBusy is busy for a shrink's plan: every shard an in-flight migration
// touches, except the sources of resizes that only forward them, which are
// in fwd instead: those may be a fold's donor, not its survivor.
func foldBusy(flying []*shardmap.Migration) (b, fwd map[int]bool) {
	var rest []*shardmap.Migration
	fwd = map[int]bool{}
	for _, m := range flying {
		if forwarding(m, m.Source) {
			fwd[m.Source] = true // its target is pending: in no fold plan
			continue
		}
		rest = append(rest, m)
	}
	return busy(rest), fwd
}

// withoutResizes leaves out the resize migrations: a reshard completes
// once its own migrations are done, without waiting for a resize.
func withoutResizes(migs []*shardmap.Migration) []*shardmap.Migration {
	var out []*shardmap.Migration
	for _, m := range migs {
		if m.Kind != shardmap.Resize {
			out = append(out, m)
		}
	}
	return out
}
