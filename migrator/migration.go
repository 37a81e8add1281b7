package migrator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// Options tune the migration pipeline. Zero values take the defaults.
type Options struct {
	// FreezeBudget bounds the write pause of one freeze: acknowledgements,
	// fence and final drain. A freeze that does not fit is rolled back.
	FreezeBudget time.Duration
	// FreezeLag is the replication lag in bytes under which drain freezes.
	FreezeLag int64
	// ReleaseBatch is about how many rows of the source one release
	// transaction scans (a block range of that many rows; release_pg.go).
	ReleaseBatch int
	// CopyWorkers is how many connection pairs a copy of whole tables (a
	// move, a resize) uses at once (copychunks.go).
	CopyWorkers int
	// AckPoll is how often acknowledgements are polled.
	AckPoll time.Duration
	// SkipVerify turns off the verification of each move (verify.go).
	SkipVerify bool
	// VerifyTimeout bounds each statement of a verification.
	VerifyTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.FreezeBudget <= 0 {
		o.FreezeBudget = 2 * time.Second
	}
	if o.FreezeLag <= 0 {
		o.FreezeLag = 256 << 10
	}
	if o.ReleaseBatch <= 0 {
		o.ReleaseBatch = 10000
	}
	if o.CopyWorkers <= 0 {
		o.CopyWorkers = 1
	}
	if o.AckPoll <= 0 {
		o.AckPoll = 5 * time.Millisecond
	}
	if o.VerifyTimeout <= 0 {
		o.VerifyTimeout = time.Minute
	}
	return o
}

// ErrBusy refuses a fold of a shard that an in-flight migration holds.
var ErrBusy = errors.New("migrator: shard busy")

// Store is what the migrator keeps in Redis.
type Store interface {
	shardmap.Store
	shardmap.Coordination
	shardmap.Intents
	shardmap.Draining
	shardmap.TreeOps
}

// Runner drives migrations through docs/DESIGN.md section 5's pipeline. Every phase
// change is recorded before the phase's work, and every step can run again,
// so a migration resumes from its record after a crash.
type Runner struct {
	cluster Nodes
	store   Store
	log     *slog.Logger
	opts    Options
	metrics *Metrics
	// clusterID names the presence sessions this deployment's proxies hold.
	clusterID clusterID
	reserved  reservations
	// interlocks hold a fold's final step (NewCoordinator sets them).
	interlocks Interlocks
	// crash is called at each LATTICE_TEST_CRASH_AT point (crashPoint);
	// the unit tests stop a run there instead of killing the process.
	crash func(point string)
	// watchPoll is watchPoll, shorter in the unit tests.
	watchPoll time.Duration

	// snaps are the snapshots of the moves this process flipped, from
	// the freeze until their comparison (verify.go).
	snapMu sync.Mutex
	snaps  map[string]Snapshots
}

// NewRunner returns a runner. metrics and log may be nil.
func NewRunner(cluster *pgshard.Cluster, store Store, opts Options, metrics *Metrics, log *slog.Logger) *Runner {
	return newRunner(clusterNodes{Cluster: cluster, copyWorkers: opts.CopyWorkers}, store, opts, metrics, log)
}

// newRunner is NewRunner on any Nodes.
func newRunner(nodes Nodes, store Store, opts Options, metrics *Metrics, log *slog.Logger) *Runner {
	if log == nil {
		log = slog.Default()
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	return &Runner{cluster: nodes, store: store, log: log, opts: opts.withDefaults(), metrics: metrics, crash: crashPoint,
		interlocks: NoInterlocks{}, watchPoll: watchPoll}
}

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand does not fail on supported platforms
	return hex.EncodeToString(b)
}

// updateMap applies change to the tree's current map and stores it,
// retrying when another writer (a concurrent migration) won the race.
// change returns false when there is nothing to do.
func (r *Runner) updateMap(ctx context.Context, tenant, tree string, change func(m *shardmap.Map) (bool, error)) (*shardmap.Map, error) {
	return r.updateMapFrom(ctx, tenant, tree, nil, change)
}

// updateMapFrom is updateMap that first tries cur, a map this runner wrote
// (nil: none), as the stored one, saving a read inside the write pause; a
// conflict reads the stored map as updateMap does.
func (r *Runner) updateMapFrom(ctx context.Context, tenant, tree string, cur *shardmap.Map, change func(m *shardmap.Map) (bool, error)) (*shardmap.Map, error) {
	for {
		if cur == nil {
			var err error
			if cur, err = r.store.Map(ctx, tenant, tree); err != nil {
				return nil, err
			}
		}
		next := cur.Clone()
		ok, err := change(next)
		if err != nil || !ok {
			return cur, err
		}
		if err := r.reserve(ctx, next, cur.Epoch+1); err != nil {
			return nil, err
		}
		err = r.store.SwapMap(ctx, next, cur.Epoch)
		if errors.Is(err, shardmap.ErrConflict) {
			cur = nil
			continue
		}
		if err != nil {
			return nil, err
		}
		return next, nil
	}
}

// StartSplit records a split of the upper half of source's slots into a new
// shard and returns the record; Run carries it out.
func (r *Runner) StartSplit(ctx context.Context, t *shardmap.Tree, source int) (*shardmap.Migration, error) {
	return r.startSplit(ctx, t, source, splitAt{from: -1})
}

// splitAt says where a split cuts and where its target goes: the source's
// slots from slot from on (-1: the upper half of its slots), onto node (""
// : the node with the fewest bytes of the tree); origin is the
// migration's (shardmap.Migration.Origin).
type splitAt struct {
	from         int
	node, origin string
}

func (r *Runner) startSplit(ctx context.Context, t *shardmap.Tree, source int, at splitAt) (*shardmap.Migration, error) {
	r.forgetReserved(t)
	mig := &shardmap.Migration{ID: newID(), Tenant: t.Tenant, Tree: t.MapName(), Kind: shardmap.Split,
		Source: source, Phase: shardmap.PhasePrepare, Created: time.Now().UTC(), Origin: at.origin}
	place, err := r.placement(ctx, t)
	if err != nil {
		return nil, err
	}
	if at.node != "" {
		place = func(*shardmap.Map) string { return at.node }
	}
	return r.startWithTarget(ctx, t, mig, func(m *shardmap.Map) error {
		src, ok := m.Shards[source]
		if !ok || src.State != shardmap.ShardActive {
			return fmt.Errorf("migrator: shard %d of %s cannot be split: it is not an active shard", source, t.Name)
		}
		var slots []int
		for s, idx := range m.Slots {
			if idx == source {
				slots = append(slots, s)
			}
		}
		if len(slots) < 2 {
			return fmt.Errorf("migrator: shard %d of %s owns %d slots; a split needs at least 2", source, t.Name, len(slots))
		}
		cut := len(slots) / 2
		if at.from >= 0 {
			// Both sides keep a slot, whatever the map became since the
			// cut was chosen.
			cut = min(max(sort.SearchInts(slots, at.from), 1), len(slots)-1)
		}
		mig.TargetNode, mig.SourceNode = place(m), src.Node
		mig.Slots = ranges(slots[cut:])
		return nil
	})
}

// startWithTarget gives mig a new pending shard as its target, in the map
// write in which choose (reading the map being written) sets its slots and
// nodes, then records mig.
func (r *Runner) startWithTarget(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, choose func(m *shardmap.Map) error) (*shardmap.Migration, error) {
	_, err := r.updateMap(ctx, t.Tenant, t.MapName(), func(m *shardmap.Map) (bool, error) {
		if err := choose(m); err != nil {
			return false, err
		}
		mig.Target = m.HighWater
		m.HighWater++
		m.Shards[mig.Target] = shardmap.Shard{Index: mig.Target, Node: mig.TargetNode, State: shardmap.ShardPending}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if err := r.store.PutMigration(ctx, mig); err != nil {
		return nil, err
	}
	return mig, nil
}

// StartFold records a fold of every slot of donor into survivor.
func (r *Runner) StartFold(ctx context.Context, t *shardmap.Tree, donor, survivor int) (*shardmap.Migration, error) {
	return r.startFold(ctx, t, donor, survivor, "")
}

// startFold is StartFold for a migration of origin.
func (r *Runner) startFold(ctx context.Context, t *shardmap.Tree, donor, survivor int, origin string) (*shardmap.Migration, error) {
	m, err := r.store.Map(ctx, t.Tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	d, ok1 := m.Shards[donor]
	s, ok2 := m.Shards[survivor]
	if !ok1 || !ok2 || d.State != shardmap.ShardActive || s.State != shardmap.ShardActive || donor == survivor {
		return nil, fmt.Errorf("migrator: shards %d and %d of %s cannot be folded", donor, survivor, t.Name)
	}
	mig := &shardmap.Migration{ID: newID(), Tenant: t.Tenant, Tree: t.MapName(), Kind: shardmap.Fold,
		Source: donor, SourceNode: d.Node, Target: survivor, TargetNode: s.Node,
		Slots: m.SlotRanges(donor), Phase: shardmap.PhasePrepare, Created: time.Now().UTC(), Origin: origin}
	if len(mig.Slots) == 0 {
		return nil, fmt.Errorf("migrator: shard %d of %s owns no slots", donor, t.Name)
	}
	// A shard another migration still owes writes to is not folded.
	migs, err := r.store.Migrations(ctx, t.Tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	for _, o := range migs {
		if forwarding(o, donor) {
			continue // a resize is not waited for (resize.go)
		}
		if o.Phase != shardmap.PhaseDone && (o.Target == donor || o.Target == survivor || o.Source == donor || o.Source == survivor) {
			return nil, fmt.Errorf("%w: shard %d or %d is part of migration %s", ErrBusy, donor, survivor, o.ID)
		}
	}
	if err := r.store.PutMigration(ctx, mig); err != nil {
		return nil, err
	}
	return mig, nil
}

func ranges(slots []int) [][2]int {
	var out [][2]int
	for _, s := range slots {
		if n := len(out); n > 0 && out[n-1][1] == s-1 {
			out[n-1][1] = s
		} else {
			out = append(out, [2]int{s, s})
		}
	}
	return out
}

func (r *Runner) setPhase(ctx context.Context, mig *shardmap.Migration, p shardmap.MigrationPhase) error {
	if err := checkTransition(mig, p); err != nil {
		return err
	}
	mig.Phase, mig.Updated = p, time.Now().UTC()
	if err := r.store.PutMigration(ctx, mig); err != nil {
		return err
	}
	// One line per phase: the time each phase takes, end to end, is read
	// from these (make bench's pipeline breakdown).
	r.log.Info("migration phase", "migration", mig.ID, "tree", mig.Tree, "kind", mig.Kind, "phase", p)
	return nil
}

func (r *Runner) fence(t *shardmap.Tree, mig *shardmap.Migration, epoch uint64) pgshard.SlotFence {
	return pgshard.SlotFence{Migration: mig.ID, Tree: t, Shard: mig.Source, Slots: mig.Slots, Target: mig.Target, Epoch: epoch,
		Handover: &pgshard.Handover{Kind: string(mig.Kind), TargetNode: mig.TargetNode}}
}

// Run carries a recorded migration from its phase to the end.
func (r *Runner) Run(ctx context.Context, mig *shardmap.Migration) error {
	log := r.log.With("migration", mig.ID, "tree", mig.Tree, "kind", mig.Kind, "source", mig.Source, "target", mig.Target)
	u, err := r.unitOf(ctx, mig.Tenant, mig.Tree)
	if err != nil {
		return err
	}
	log.Info("migration run", "phase", mig.Phase, "tables", u.names())
	t := u.lead
	r.forgetReserved(t)
	if gone, err := r.resizeSourceGone(ctx, mig); err != nil || gone {
		if err != nil {
			return err
		}
		return r.abandonResize(ctx, u, mig)
	}
	var sh Stream
	// dropping reports the drop of the shadow copy's objects that this run
	// started after its flip (nil: none); dropped waits for it and says
	// whether it succeeded.
	var dropping chan error
	dropped := func() bool {
		if dropping == nil {
			return false
		}
		err := <-dropping
		dropping = nil
		if err != nil {
			log.Warn("shadow copy not dropped after the flip; the release drops it", "err", err)
		}
		return err == nil
	}
	defer func() {
		dropped()
		if sh != nil {
			_ = sh.Stop()
		}
		// Done, failed or stopped: it is not streaming here any more.
		r.metrics.setLag(mig.Tenant, mig.Tree, mig.ID, -1)
	}()
	for {
		switch mig.Phase {
		case shardmap.PhasePrepare:
			if err := r.prepare(ctx, u, mig); errors.Is(err, errFoldYields) {
				log.Info("fold dropped before it began: a resize froze its donor", "err", err)
				return r.store.DeleteMigration(ctx, mig.Tenant, mig.Tree, mig.ID)
			} else if err != nil {
				return err
			}
			if err := r.setPhase(ctx, mig, shardmap.PhaseCopy); err != nil {
				return err
			}
		case shardmap.PhaseCopy, shardmap.PhaseDrain:
			if sh == nil {
				if sh, err = r.startShadow(ctx, u, mig, log); err != nil {
					return err
				}
				if mig.Phase == shardmap.PhaseCopy {
					r.metrics.RowsCopied.WithLabelValues(mig.Tree, mig.Tenant).Add(float64(sh.Stats().RowsCopied))
					r.metrics.BytesCopied.WithLabelValues(mig.Tree, mig.Tenant).Add(float64(sh.Stats().BytesCopied))
				}
				mig.RowsCopied = sh.Stats().RowsCopied
			}
			if mig.Phase == shardmap.PhaseCopy {
				if err := r.setPhase(ctx, mig, shardmap.PhaseDrain); err != nil {
					return err
				}
			}
			r.crash("drain")
			if err := r.holdRetirement(ctx, t, mig, sh, false); err != nil {
				return err
			}
			if err := r.drainQuiet(ctx, t, mig, sh); err != nil {
				return err
			}
			if mig.Kind == shardmap.Resize {
				r.crash("resize")
			}
			if err := r.setPhase(ctx, mig, shardmap.PhaseFreeze); err != nil {
				return err
			}
		case shardmap.PhaseFreeze:
			flipped, err := r.flipped(ctx, mig)
			if err != nil {
				return err
			}
			if flipped {
				// The flip happened but its phase change was lost (a crash):
				// its event may have been lost too.
				r.publish(ctx, migrationEvent(EventMigrationCommitted, mig, r.mapEpoch(ctx, mig.Tenant, mig.Tree)))
				if err := r.setPhase(ctx, mig, shardmap.PhaseFlip); err != nil {
					return err
				}
				continue
			}
			if sh == nil {
				// A crash during a freeze: undo it and drain again.
				if err := r.unfreeze(ctx, u, mig); err != nil {
					return err
				}
				if err := r.setPhase(ctx, mig, shardmap.PhaseDrain); err != nil {
					return err
				}
				continue
			}
			ok, err := r.freezeAndFlip(ctx, u, mig, sh, log)
			if errors.Is(err, errSourceGone) {
				_ = sh.Stop()
				sh = nil
				return r.abandonResize(ctx, u, mig)
			}
			if err != nil {
				return err
			}
			next := shardmap.PhaseFlip
			if !ok {
				next = shardmap.PhaseDrain
			}
			if err := r.setPhase(ctx, mig, next); err != nil {
				return err
			}
			if !ok {
				// Let the held statements and the lagging proxies catch up
				// before the next attempt.
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(r.opts.FreezeBudget):
				}
			}
		case shardmap.PhaseFlip:
			// Recorded, so that a crash from here on resumes after the flip.
			// The stream's part ended with the final drain (the fence holds
			// back every later write to the moving slots), so this run,
			// which flipped, drops its slot and publication while the move
			// is compared, off the release's path.
			if sh != nil {
				_ = sh.Stop()
				sh = nil
				dropping = make(chan error, 1)
				go func() { dropping <- r.dropShadowAfterFlip(ctx, u, mig) }()
			}
			if err := r.verifyMove(ctx, u, mig, log); err != nil {
				return err
			}
		case shardmap.PhaseVerifyFailed:
			log.Warn("migration waits for lattice_repair_migration: its verification failed", "error", mig.LastError)
			return nil
		case shardmap.PhaseRelease:
			if err := r.holdRetirement(ctx, t, mig, nil, true); err != nil {
				return err
			}
			if err := r.thawSlots(ctx, t, repairedSlots(mig)); err != nil {
				return err
			}
			if sh != nil {
				_ = sh.Stop()
				sh = nil
			}
			if err := r.release(ctx, u, mig, dropped()); err != nil {
				return err
			}
			// Before the phase change: the coordinator completes the
			// reshard once no migration is short of done, and its event
			// must come after this one.
			r.publish(ctx, migrationEvent(EventMigrationRetired, mig, r.mapEpoch(ctx, mig.Tenant, mig.Tree)))
			if err := r.setPhase(ctx, mig, shardmap.PhaseDone); err != nil {
				return err
			}
		case shardmap.PhaseDone:
			log.Info("migration done", "rows_copied", mig.RowsCopied, "freezes", mig.Freezes)
			return r.store.DeleteMigration(ctx, mig.Tenant, mig.Tree, mig.ID)
		default:
			return fmt.Errorf("migrator: migration %s has unknown phase %q", mig.ID, mig.Phase)
		}
	}
}

// prepare creates the target table of a split; for a fold it marks the
// survivor as mixed and waits until every proxy scans it that way, before a
// single donor row is copied into it.
func (r *Runner) prepare(ctx context.Context, u unit, mig *shardmap.Migration) error {
	t := u.lead
	if mig.Kind == shardmap.Move {
		return r.prepareMove(ctx, u, mig)
	}
	if mig.Kind == shardmap.Split || mig.Kind == shardmap.Resize {
		m, err := r.store.Map(ctx, t.Tenant, t.MapName())
		if err != nil {
			return err
		}
		u, err := r.afterTreeDDL(ctx, u)
		if err != nil {
			return err
		}
		return r.createMembers(ctx, u, mig.Target, mig.TargetNode, m.Epoch)
	}
	m, err := r.updateMap(ctx, t.Tenant, t.MapName(), func(m *shardmap.Map) (bool, error) {
		s := m.Shards[mig.Target]
		if s.Mixed {
			return false, nil
		}
		if err := foldMayStart(m, mig); err != nil {
			return false, err
		}
		s.Mixed = true
		m.Shards[mig.Target] = s
		return true, nil
	})
	if err != nil {
		return err
	}
	return r.waitAcks(ctx, t, m)
}

// afterTreeDDL waits, once the migration is recorded, for the DDL
// statements on u's trees that passed their reshard check before the
// record, and reads the trees' entries again: a target built from the DDL
// log read at the run's start would lack what such a statement adds (a
// column, or a unique index, whose absence lets duplicates in) while the
// statement reached only the shards of the map it read. A statement that
// takes the lock after the wait finds the record in its check and is
// refused. The wait counts only DDL statements (pgshard ddllock.go), not
// reads or proxies.
func (r *Runner) afterTreeDDL(ctx context.Context, u unit) (unit, error) {
	names := make([]string, len(u.trees))
	for i, t := range u.trees {
		names[i] = t.Name
	}
	if err := r.cluster.WaitTreeDDL(ctx, u.lead.Tenant, names); err != nil {
		return unit{}, err
	}
	return r.unitOf(ctx, u.lead.Tenant, u.name())
}

// sourceLSN is the source node's current WAL position.
func (r *Runner) sourceLSN(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration) (pglogrepl.LSN, error) {
	return r.cluster.WALPosition(ctx, mig.SourceNode, t.Tenant)
}

// drain waits until the stream is within FreezeLag of the source.
func (r *Runner) drain(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, sh Stream) error {
	for {
		cur, err := r.sourceLSN(ctx, t, mig)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		err = sh.WaitApplied(wctx, cur)
		cancel()
		applied := sh.Stats().Applied
		mig.LagBytes = max(int64(cur)-int64(applied), 0)
		r.metrics.setLag(mig.Tenant, mig.Tree, mig.ID, mig.LagBytes)
		if err == nil || mig.LagBytes <= r.opts.FreezeLag {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if err := r.store.PutMigration(ctx, mig); err != nil {
			return err
		}
	}
}

// quietWait bounds how long a drained migration waits for the bulk writes
// on its source node to end before it freezes anyway.
const quietWait = 10 * time.Second

// drainQuiet drains, and before that waits (at most quietWait, draining
// meanwhile) until no other migration of the tree writes in bulk to mig's
// source node: a shadow copy into it, or a release deleting moved rows from
// it. Logical decoding replays a transaction only at its commit, all of it,
// even when none of it is published: a final drain whose WAL position lies
// past such a commit waits for the whole replay, and so does the write
// pause (70 to 220 ms per such freeze in the 500,000-row grow and shrink
// benchmark, none once freezes waited). The last drain comes after the
// last look, so a bulk transaction that committed before it is decoded
// before the freeze. It waits as well while another move of the tree is
// compared on mig's nodes (phase flip): the comparison's scans would take
// the CPU and I/O of the fence and the final drain.
func (r *Runner) drainQuiet(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, sh Stream) error {
	deadline := time.Now().Add(quietWait)
	for {
		busy, err := r.busyBeforeFreeze(ctx, mig)
		if err != nil {
			return err
		}
		if !busy || time.Now().After(deadline) {
			return r.drain(ctx, t, mig, sh)
		}
		if err := r.drain(ctx, t, mig, sh); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// busyBeforeFreeze reports whether another migration of mig's tree is
// copying into mig's source node, deleting moved rows from it, or being
// compared on a node of mig's.
func (r *Runner) busyBeforeFreeze(ctx context.Context, mig *shardmap.Migration) (bool, error) {
	migs, err := r.store.Migrations(ctx, mig.Tenant, mig.Tree)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(migs, func(o *shardmap.Migration) bool { return o.ID != mig.ID && holdsFreeze(o, mig) }), nil
}

// holdsFreeze reports whether o's work makes mig wait before it freezes:
// a copy into mig's source node, a release deleting from it, or o's
// comparison on a node of mig's.
func holdsFreeze(o, mig *shardmap.Migration) bool {
	return o.Phase == shardmap.PhaseCopy && o.TargetNode == mig.SourceNode ||
		o.Phase == shardmap.PhaseRelease && o.SourceNode == mig.SourceNode ||
		o.Phase == shardmap.PhaseFlip && sharesNode(o, mig)
}

// sharesNode reports whether migrations a and b touch a node in common.
func sharesNode(a, b *shardmap.Migration) bool {
	return a.SourceNode == b.SourceNode || a.SourceNode == b.TargetNode ||
		a.TargetNode == b.SourceNode || a.TargetNode == b.TargetNode
}

// waitAcks waits until every live proxy that serves the tree's tenant
// routes the tree by m's epoch or later. A proxy that never served the
// tenant has no map of it to acknowledge, and reads a current one before its
// first statement (shardmap.Registration). A proxy cut off from Redis that
// still holds its sessions on the nodes may serve from its cached maps, so
// it is waited for too.
func (r *Runner) waitAcks(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) error {
	live, err := r.waitLagging(ctx, t, m, nil)
	if err != nil {
		return err
	}
	return r.waitCutOff(ctx, t, m, live)
}

// WaitKnown waits until every live proxy that serves t's tenant routes by
// t, a tree just registered, and no proxy cut off from Redis is seen on
// its nodes (as waitAcks). A proxy acknowledges a tree under its own name
// once its view holds it, also for a member of a colocation group, whose
// map and freezes are acknowledged under the group's name.
func (r *Runner) WaitKnown(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) error {
	own := *t
	own.Group = "" // the acknowledgements under the tree's own name
	return r.waitAcks(ctx, &own, m)
}

// waitLagging waits until no proxy registered for the tree's tenant lags
// behind m's epoch, and returns the live proxies of the last read. It reads
// again every AckPoll, and at once on a signal from acked (WatchAcks; nil
// for none).
func (r *Runner) waitLagging(ctx context.Context, t *shardmap.Tree, m *shardmap.Map, acked <-chan struct{}) ([]string, error) {
	for {
		lag, err := r.store.Lagging(ctx, t.Tenant, t.MapName(), m.Epoch)
		if err != nil {
			return nil, err
		}
		if len(lag.Lagging) == 0 {
			return lag.Live, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-acked:
		case <-time.After(r.opts.AckPoll):
		}
	}
}

// waitCutOff completes waitAcks once waitLagging found live: it waits while
// proxies cut off from Redis are present on the catalog node, reading the
// registry and then the node again.
func (r *Runner) waitCutOff(ctx context.Context, t *shardmap.Tree, m *shardmap.Map, live []string) error {
	reported := false
	for {
		cut, err := r.cutOff(ctx, live)
		if err != nil || len(cut) == 0 {
			return err
		}
		if !reported {
			r.log.Warn("migrator: waiting for proxies cut off from Redis: they hold their sessions on the nodes and may serve from their cached maps",
				"tree", t.Name, "epoch", m.Epoch, "application_names", cut)
			reported = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(cutOffPoll):
		}
		if live, err = r.waitLagging(ctx, t, m, nil); err != nil {
			return err
		}
	}
}

// freezeAndFlip freezes the moving slots, fences the source, waits for the
// final drain and flips the map, all within the freeze budget. It returns
// false after rolling back a freeze that did not fit.
func (r *Runner) freezeAndFlip(ctx context.Context, u unit, mig *shardmap.Migration, sh Stream, log *slog.Logger) (bool, error) {
	t := u.lead
	// Everything that does not need the slots frozen happens before the
	// pause starts.
	fences := r.fences(u, mig, 0)
	for _, f := range fences {
		if err := r.cluster.PrepareSlotFence(ctx, mig.SourceNode, f); err != nil {
			return false, err
		}
	}
	// Without the id the look fails too, and says why.
	if cluster, err := r.clusterID.get(ctx, r.store); err == nil {
		r.cluster.WarmPresence(ctx, cluster)
	}
	var snaps Snapshots
	if !r.opts.SkipVerify || mig.Compare {
		// Recorded before the write log is made: whatever run flips or
		// resumes the move compares it.
		if !mig.Compare {
			mig.Compare = true
			if err := r.store.PutMigration(ctx, mig); err != nil {
				return false, err
			}
		}
		// The write log proves the move should this run die after the flip.
		// Attaching its trigger waits for the target's writers, so a
		// long transaction there would hold the move here: bounded like a
		// freeze, it goes back to the drain and tries again.
		lctx, cancel := context.WithTimeout(ctx, r.opts.FreezeBudget)
		err := r.cluster.PrepareWriteLog(lctx, u.trees, mig)
		overBudget := lctx.Err() != nil && ctx.Err() == nil
		cancel()
		if err != nil && overBudget {
			log.Warn("freeze put off: the write log's trigger waited for the target's writers past the freeze budget", "budget", r.opts.FreezeBudget)
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if snaps, err = r.cluster.OpenSnapshots(ctx, u.trees, mig, r.opts.VerifyTimeout); err != nil {
			return false, err
		}
	}
	defer func() {
		if snaps != nil {
			snaps.Close()
		}
	}()
	// Watched from before the pause, so no acknowledgement of the frozen
	// map goes unseen; without the watch the freeze polls.
	wctx, unwatch := context.WithCancel(ctx)
	defer unwatch()
	acked, err := r.store.WatchAcks(wctx, t.Tenant, t.MapName())
	if err != nil {
		log.Warn("acknowledgements not watched; the freeze polls for them", "err", err)
	}
	if err := r.settleFreeze(ctx, t, mig, acked, log); err != nil {
		return false, err
	}
	// Looked for after the settling, which can wait for long statements.
	if r.sourceHeld(ctx, mig, fences, log) {
		return false, r.clearFreezing(ctx, t, mig)
	}
	begin := time.Now()
	var start time.Time
	mig.Freezes++
	frozen, err := r.updateMap(ctx, t.Tenant, t.MapName(), func(m *shardmap.Map) (bool, error) {
		// The pause starts with the write of the frozen map that succeeds:
		// from then on the proxies hold statements for the slots. Earlier
		// attempts (a concurrent migration changed the map) froze nothing.
		start = time.Now()
		if err := r.mayFreeze(ctx, m, mig); err != nil {
			return false, err
		}
		m.Frozen = append(m.Frozen, mig.Slots...)
		return true, nil
	})
	if errors.Is(err, errResizeYields) {
		mig.LastError = err.Error()
		return false, nil
	}
	if err != nil {
		return false, err
	}
	steps := freezeSteps{freeze: start.Sub(begin), last: start}
	steps.mark(&steps.write)
	bctx, cancel := context.WithTimeout(ctx, r.opts.FreezeBudget)
	defer cancel()
	live, err := r.waitLagging(bctx, t, frozen, acked)
	steps.mark(&steps.acks)
	var lsn string
	if err == nil {
		for i := range fences {
			fences[i].Epoch = frozen.Epoch
		}
		// The look for proxies cut off from Redis (waitAcks) runs beside
		// the fence: it must hold up the flip, and the fence only rejects
		// writes that the freeze holds back anyway.
		cutOff := make(chan error, 1)
		go func() {
			begin := time.Now()
			err := r.waitCutOff(bctx, t, frozen, live)
			steps.look = time.Since(begin) // read after the receive below
			cutOff <- err
		}()
		// One transaction fences every member table: one barrier, one
		// WAL position past every write to the moving slots.
		armed := time.Now()
		lsn, err = r.cluster.ArmSlotFences(bctx, mig.SourceNode, fences)
		steps.arm = time.Since(armed)
		if cerr := <-cutOff; err == nil {
			err = cerr
		}
		steps.mark(&steps.fence)
	}
	var final pglogrepl.LSN
	if err == nil {
		if final, err = pglogrepl.ParseLSN(lsn); err == nil {
			err = sh.WaitApplied(bctx, final)
		}
		steps.mark(&steps.drain)
	}
	if err == nil {
		r.crash("freeze")
	}
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		log.Warn("freeze rolled back", append(steps.attrs(), "after", time.Since(start), "err", err)...)
		r.metrics.FreezeSeconds.WithLabelValues(mig.Tree, mig.Tenant, "rolled_back").Observe(time.Since(start).Seconds())
		mig.LastError = err.Error()
		return false, r.unfreeze(ctx, u, mig)
	}
	flipped, err := r.updateMapFrom(ctx, t.Tenant, t.MapName(), frozen, func(m *shardmap.Map) (bool, error) {
		for _, rg := range mig.Slots {
			for s := rg[0]; s <= rg[1]; s++ {
				m.Slots[s] = mig.Target
			}
		}
		m.Frozen = removeRanges(m.Frozen, mig.Slots)
		m.Freezing = removeRanges(m.Freezing, mig.Slots)
		if mig.Kind == shardmap.Move {
			flipMove(m, mig)
			return true, nil
		}
		tgt := m.Shards[mig.Target]
		tgt.State = shardmap.ShardActive
		src := m.Shards[mig.Source]
		if mig.Kind == shardmap.Split {
			src.Mixed = true // holds the moved rows until the release
		} else {
			tgt.Mixed = false // owns every row it holds now
			src.State = shardmap.ShardRetired
			// A retired index is never handed out again.
			m.HighWater = max(m.HighWater, mig.Source+1)
		}
		m.Shards[mig.Target], m.Shards[mig.Source] = tgt, src
		return true, nil
	})
	if err != nil {
		return false, err
	}
	r.crash("flip")
	steps.mark(&steps.flip)
	pause := time.Since(start)
	if snaps != nil {
		if err := exportAfterFlip(ctx, snaps); err != nil {
			// The write log proves the move without them, as after a crash.
			log.Warn("a snapshot export failed after the flip; the move is compared from the target's write log", "err", err)
			snaps.Close()
			snaps = nil
		}
		steps.mark(&steps.snapshots)
	}
	log.Info("flipped", append(steps.attrs(), "pause", pause, "epoch", flipped.Epoch, "final_lsn", final)...)
	mig.LastError = "" // what held earlier freezes back is past
	r.metrics.FreezeSeconds.WithLabelValues(mig.Tree, mig.Tenant, "flipped").Observe(pause.Seconds())
	if mig.Kind == shardmap.Fold {
		r.metrics.ConsolidationsCommitted.WithLabelValues(mig.Tree, mig.Tenant, strconv.Itoa(mig.Source)).Inc()
	}
	if snaps != nil {
		r.holdSnapshots(mig.ID, snaps)
		snaps = nil
	}
	if err := r.recordOwnership(ctx, u, flipped, mig); err != nil {
		r.log.Warn("ownership record not updated; the release records it", "shard", mig.Target, "err", err)
	}
	r.publish(ctx, migrationEvent(EventMigrationCommitted, mig, flipped.Epoch))
	return true, nil
}

// freezeSteps times one freeze for its log line: the map reads and writes
// lost to concurrent migrations before the freeze, then the parts of the
// pause: the frozen map's write, the proxies' acknowledgements, the fence
// (with, beside it, the look for proxies cut off from Redis), the final
// drain and the flip; last, out of the pause, the snapshots' exports.
// The fence's two halves, which run side by side, are timed apart too
// (arm: the fence's transaction; look: the look for cut-off proxies), so
// a slow fence step says which of them held it.
type freezeSteps struct {
	last                                               time.Time
	freeze, write, acks, fence, drain, snapshots, flip time.Duration
	arm, look                                          time.Duration
}

// mark sets *d to the time since the previous mark.
func (s *freezeSteps) mark(d *time.Duration) {
	now := time.Now()
	*d, s.last = now.Sub(s.last), now
}

func (s *freezeSteps) attrs() []any {
	return []any{"freeze_wait", s.freeze, "map_write", s.write, "acks", s.acks, "fence", s.fence, "final_drain", s.drain, "flip", s.flip, "snapshots_after_flip", s.snapshots,
		"fence_arm", s.arm, "cut_off_look", s.look}
}

// recordOwnership adds the moved slots to the target's ownership record
// after the flip (the fence took them out of the source's record). The
// release does it again before it removes anything, so a recovery that
// finds the record knows the flip happened.
func (r *Runner) recordOwnership(ctx context.Context, u unit, m *shardmap.Map, mig *shardmap.Migration) error {
	return u.each(func(t *shardmap.Tree) error {
		return r.cluster.ClaimSlots(ctx, t, mig.Target, mig.TargetNode, mig.Slots, m.Epoch)
	})
}

// flipped reports whether the map already points the migration's slots at
// its target (a flip whose phase change was lost in a crash).
func (r *Runner) flipped(ctx context.Context, mig *shardmap.Migration) (bool, error) {
	m, err := r.store.Map(ctx, mig.Tenant, mig.Tree)
	if err != nil {
		return false, err
	}
	if mig.Kind == shardmap.Move {
		return movedFlipped(m, mig), nil
	}
	return m.Slots[mig.Slots[0][0]] == mig.Target, nil
}

// unfreeze rolls a freeze back: the fence goes, then the slots thaw, so the
// statements the proxies held run on the source again.
func (r *Runner) unfreeze(ctx context.Context, u unit, mig *shardmap.Migration) error {
	if err := r.dropFences(ctx, u, mig, true); err != nil {
		return err
	}
	_, err := r.updateMap(ctx, mig.Tenant, u.name(), func(m *shardmap.Map) (bool, error) {
		frozen, freezing := removeRanges(m.Frozen, mig.Slots), removeRanges(m.Freezing, mig.Slots)
		if len(frozen) == len(m.Frozen) && len(freezing) == len(m.Freezing) {
			return false, nil
		}
		m.Frozen, m.Freezing = frozen, freezing
		return true, nil
	})
	return err
}

// settleFreeze runs before a freeze, with writes still going on: it marks
// the moving slots about to freeze (shardmap.Map.Freezing) and waits until
// every proxy acknowledged that map, that is until no statement planned
// before the mark runs on those slots. A freeze tried while such a
// statement runs (a long read on a moving slot, any long read over the
// whole tree) waits for its acknowledgements past the budget, holding the
// slots' writes all that time, and is rolled back, again and again while
// the statement lasts: writes to a moving shard stalled for the budget,
// 2 s, every 4 s beside one 20 s point read. The freeze that follows the
// mark waits only for statements that began since. A mark left by an
// attempt that did not go on (a crash, a rollback that could not clear
// it) is taken away first, so that the statements planned under it are
// waited for too.
func (r *Runner) settleFreeze(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, acked <-chan struct{}, log *slog.Logger) error {
	if err := r.clearFreezing(ctx, t, mig); err != nil {
		return err
	}
	marked, err := r.updateMap(ctx, t.Tenant, t.MapName(), func(m *shardmap.Map) (bool, error) {
		m.Freezing = append(m.Freezing, mig.Slots...)
		return true, nil
	})
	if err != nil {
		return err
	}
	for start := time.Now(); ; {
		wctx, cancel := context.WithTimeout(ctx, r.opts.FreezeBudget)
		_, err := r.waitLagging(wctx, t, marked, acked)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		log.Info("freeze waits for statements planned before it on the moving slots; writes go on", "waited", time.Since(start).Round(time.Millisecond))
	}
}

// clearFreezing takes the migration's mark of slots about to freeze out of
// the map.
func (r *Runner) clearFreezing(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration) error {
	_, err := r.updateMap(ctx, t.Tenant, t.MapName(), func(m *shardmap.Map) (bool, error) {
		kept := removeRanges(m.Freezing, mig.Slots)
		if len(kept) == len(m.Freezing) {
			return false, nil
		}
		m.Freezing = kept
		return true, nil
	})
	return err
}

// removeRanges drops the ranges of rm from ranges (frozen or freezing
// slots; each was added whole).
func removeRanges(ranges, rm [][2]int) [][2]int {
	out := make([][2]int, 0, len(ranges))
	for _, f := range ranges {
		if !slices.Contains(rm, f) {
			out = append(out, f)
		}
	}
	return out
}

// dropShadowAfterFlip drops the slot, publication and progress row of a
// flipped migration, once the target's ownership record holds the moved
// slots: a recovery (section 17 of docs/DESIGN.md) drains the stream from
// the progress row only for a fenced migration whose target's record does
// not hold them.
func (r *Runner) dropShadowAfterFlip(ctx context.Context, u unit, mig *shardmap.Migration) error {
	m, err := r.store.Map(ctx, mig.Tenant, mig.Tree)
	if err != nil {
		return err
	}
	if err := r.recordOwnership(ctx, u, m, mig); err != nil {
		return err
	}
	return r.cluster.DropShadow(ctx, u.trees, mig)
}

// release runs once every live proxy routes by the flipped map (a proxy
// acknowledges an epoch only after its scans planned on older epochs end):
// the stream, slot, publication and fence go, and the moved rows are deleted
// from a split source in batches, or the donor table of a fold is dropped.
// shadowGone says this run dropped the slot and publication after the
// flip (a run that resumes here drops them again: every drop accepts
// missing pieces).
func (r *Runner) release(ctx context.Context, u unit, mig *shardmap.Migration, shadowGone bool) error {
	t := u.lead
	m, err := r.store.Map(ctx, t.Tenant, t.MapName())
	if err != nil {
		return err
	}
	if err := r.recordOwnership(ctx, u, m, mig); err != nil {
		return err
	}
	start := time.Now()
	if err := r.waitAcks(ctx, t, m); err != nil {
		return err
	}
	acked := time.Now()
	// The move is verified: no comparison needs the target's write log.
	if err := r.cluster.DropWriteLog(ctx, u.trees, mig); err != nil {
		return err
	}
	if !shadowGone {
		if err := r.cluster.DropShadow(ctx, u.trees, mig); err != nil {
			return err
		}
	}
	dropped := time.Now()
	r.crash("release")
	if mig.Kind == shardmap.Move {
		return r.releaseMove(ctx, u, m, mig)
	}
	if mig.Kind == shardmap.Fold || mig.Kind == shardmap.Resize {
		fwd, err := r.forwardingResize(ctx, mig, mig.Source)
		switch {
		case err != nil:
			return err
		case m.SlotCounts()[mig.Source] > 0:
			r.log.Warn("fold donor still owns slots; keeping its storage", "migration", mig.ID, "donor", mig.Source)
		case fwd != nil:
			// A resize is not waited for: the donor refuses retirement
			// and keeps its storage, which the resize drops once it has
			// given the shard up (abandonResize).
			r.log.Warn("fold donor is forwarded by a resize; it keeps its storage and the fold completes routing-only",
				"migration", mig.ID, "donor", mig.Source, "resize", fwd.ID)
			r.metrics.RoutingOnlyFolds.WithLabelValues(mig.Tree, mig.Tenant, ReasonResizeInFlight).Inc()
		default:
			if err := r.dropMembers(ctx, u, mig.Source, mig.SourceNode); err != nil {
				return err
			}
		}
		if mig.Kind == shardmap.Resize {
			r.metrics.ResizeShards.WithLabelValues(mig.Tree, mig.Tenant, "resized").Inc()
		}
		return r.dropFences(ctx, u, mig, false)
	}
	if err := u.each(func(t *shardmap.Tree) error { return r.deleteMoved(ctx, t, mig) }); err != nil {
		return err
	}
	r.log.Info("moved rows released", "migration", mig.ID, "acks", acked.Sub(start), "drops", dropped.Sub(acked), "delete", time.Since(dropped))
	if err := r.dropFences(ctx, u, mig, false); err != nil {
		return err
	}
	_, err = r.updateMap(ctx, t.Tenant, t.MapName(), func(m *shardmap.Map) (bool, error) {
		s := m.Shards[mig.Source]
		if !s.Mixed || r.otherMigrationOn(ctx, mig) {
			return false, nil
		}
		s.Mixed = false
		m.Shards[mig.Source] = s
		return true, nil
	})
	return err
}

// otherMigrationOn reports whether another split of the same source is
// still under way, which keeps the source mixed.
func (r *Runner) otherMigrationOn(ctx context.Context, mig *shardmap.Migration) bool {
	migs, err := r.store.Migrations(ctx, mig.Tenant, mig.Tree)
	if err != nil {
		return true
	}
	return slices.ContainsFunc(migs, func(o *shardmap.Migration) bool {
		return o.ID != mig.ID && o.Source == mig.Source && o.Phase != shardmap.PhaseDone
	})
}

// deleteMoved deletes a split's moved rows from its source in batches, each
// its own short transaction that passes the fence.
func (r *Runner) deleteMoved(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration) error {
	return r.cluster.DeleteSlots(ctx, t, mig.SourceNode, mig.Source, mig.Slots, r.opts.ReleaseBatch)
}
