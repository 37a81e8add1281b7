package migrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Snapshot phases, after shardmap.OpIntent; each is recorded before its work.
const (
	SnapshotPause    = "pause"    // the tree's writes held, fences armed, snapshots exported on every node
	SnapshotCopy     = "copy"     // each shard copied on its node under that node's snapshot
	SnapshotRegister = "register" // the copy is whole: the new tree's template, record and registry entry
)

// Tree events of snapshots.
const (
	EventSnapshotStarted   = "snapshot_started"
	EventSnapshotCompleted = "snapshot_completed"
)

// snapshotPauses bounds the pauses one run tries before it fails (the
// next tick runs it again).
const snapshotPauses = 5

// snapshotState is a snapshot's own part of its record.
type snapshotState struct {
	// Map is the new tree's map: the source's at the pause (epoch Epoch),
	// owning shards only.
	Map   *shardmap.Map `json:"map,omitempty"`
	Epoch uint64        `json:"epoch,omitempty"`
	// Pauses counts the pauses tried, rolled back ones included;
	// PauseSeconds is the last one that held.
	Pauses       int     `json:"pauses"`
	PauseSeconds float64 `json:"pause_seconds"`
	// Copied lists the shards whose copy committed.
	Copied []int `json:"copied,omitempty"`
	// DDL is the new tree's DDL log: the tree's, with index and constraint
	// names chosen for the new name (pgshard.CopyDDL).
	DDL []string `json:"ddl,omitempty"`
}

// Snapshotter runs lattice_snapshot's operations (docs/DESIGN.md section
// 6b): a brief pause of the tree's writes in which every node exports a
// snapshot, then a copy of each shard on its own node under it.
type Snapshotter struct {
	runner  *Runner
	cluster *pgshard.Cluster
	store   Store
	metrics *SnapshotMetrics
	log     *slog.Logger
}

// NewSnapshotter returns the handler of snapshot operations; register it
// with TreeOpRunner.Handle(shardmap.OpSnapshot, s.Run).
func NewSnapshotter(runner *Runner, cluster *pgshard.Cluster, metrics *SnapshotMetrics) *Snapshotter {
	if metrics == nil {
		metrics = NewSnapshotMetrics(nil)
	}
	return &Snapshotter{runner: runner, cluster: cluster, store: runner.store, metrics: metrics, log: runner.log}
}

func snapshotFence(t *shardmap.Tree, op string, idx int, epoch uint64) pgshard.SlotFence {
	return pgshard.SlotFence{Migration: "snap_" + op, Tree: t, Shard: idx, Slots: [][2]int{{0, t.SlotCount - 1}}, Target: -1, Epoch: epoch}
}

// newTree is the registry entry of the snapshot of src.
func newTree(src *shardmap.Tree, name string) *shardmap.Tree {
	t := *src
	t.Name, t.Group, t.Created = name, "", time.Time{}
	t.DDL, t.Columns = nil, slices.Clone(src.Columns)
	return &t
}

func decodeSnapshotState(op *shardmap.TreeOp) (*snapshotState, error) {
	st := &snapshotState{}
	if len(op.State) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(op.State, st); err != nil {
		return nil, fmt.Errorf("migrator: snapshot %s: decode state: %w", op.ID, err)
	}
	return st, nil
}

func saveSnapshot(ctx context.Context, run *TreeOpRun, st *snapshotState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	run.Op.State = b
	return run.Save(ctx)
}

// Run implements TreeOpHandler for snapshots. The exported snapshots die
// with the run that took them, so a run that resumes one drops what the
// run before created and starts again from a new pause, unless the copy
// was whole already (phase register).
func (s *Snapshotter) Run(ctx context.Context, run *TreeOpRun) error {
	op := run.Op
	log := s.log.With("snapshot", op.ID, "tree", op.Tree, "new_tree", op.Target, "tenant", op.Tenant)
	st, err := decodeSnapshotState(op)
	if err != nil {
		return err
	}
	src, err := s.store.Tree(ctx, op.Tenant, op.Tree)
	if errors.Is(err, shardmap.ErrNotFound) {
		log.Warn("snapshot abandoned: its tree is gone")
		gone := &shardmap.Tree{Tenant: op.Tenant, Name: op.Tree}
		if op.TreeMap() != op.Tree {
			gone.Group = op.TreeMap()
		}
		return s.cleanup(ctx, op, gone, st)
	}
	if err != nil {
		return err
	}
	dst := newTree(src, op.Target)
	if op.Phase == SnapshotRegister {
		return s.register(ctx, run, src, dst, st, log)
	}
	if op.Phase == shardmap.OpIntent {
		// Recorded, not yet acted on (by this run or one before).
		s.runner.publish(ctx, Event{Event: EventSnapshotStarted, Tenant: op.Tenant, Tree: op.Tree, Operation: op.ID, TargetTree: op.Target,
			Epoch: s.runner.mapEpoch(ctx, op.Tenant, op.TreeMap())})
	}
	if run.Resumed || op.Phase != shardmap.OpIntent {
		log.Info("snapshot resumed: dropping what the run before made, then a new pause", "phase", op.Phase)
		if err := s.cleanup(ctx, op, src, st); err != nil {
			return err
		}
		st = &snapshotState{Pauses: st.Pauses}
		op.RowsDone = 0
	}
	var held map[string]*pgshard.HeldSnapshot
	defer func() { closeHeld(held) }()
	for {
		held, err = s.pause(ctx, run, src, st, log)
		if err == nil {
			break
		}
		if ctx.Err() != nil || errors.Is(err, shardmap.ErrAttempt) || errors.Is(err, shardmap.ErrNotFound) || st.Pauses%snapshotPauses == 0 {
			return err
		}
		log.Warn("snapshot pause rolled back; trying again", "pauses", st.Pauses, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(s.runner.opts.FreezeBudget):
		}
	}
	if err := s.copy(ctx, run, src, dst, st, held, log); err != nil {
		return err
	}
	closeHeld(held)
	held = nil
	return s.register(ctx, run, src, dst, st, log)
}

func closeHeld(held map[string]*pgshard.HeldSnapshot) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, h := range held {
		h.Close(ctx)
	}
}

// parallel runs fn for each item at once and returns the first error.
func parallel[T any](items []T, fn func(T) error) error {
	errs := make([]error, len(items))
	var wg sync.WaitGroup
	for i, it := range items {
		wg.Go(func() { errs[i] = fn(it) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// pause holds the tree's writes: every slot frozen and acknowledged by
// every proxy, then a fence on every owning shard as the barrier (it waits
// for the writers inside each table, a prepared transaction's locks
// included), then no prepared transaction left on the tables, then a
// snapshot exported on every node; the fences go and the slots thaw. A map
// written meanwhile (another migration's freeze or flip) rolls it back:
// the snapshots must match one map.
func (s *Snapshotter) pause(ctx context.Context, run *TreeOpRun, t *shardmap.Tree, st *snapshotState, log *slog.Logger) (map[string]*pgshard.HeldSnapshot, error) {
	op := run.Op
	m0, err := s.store.Map(ctx, t.Tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	owning := m0.OwningShards()
	var nodes []string
	for _, idx := range owning {
		if n := m0.Shards[idx].Node; !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	// Everything that takes no lock on the tree's tables happens first.
	for _, idx := range owning {
		if err := s.runner.cluster.PrepareSlotFence(ctx, m0.Shards[idx].Node, snapshotFence(t, op.ID, idx, 0)); err != nil {
			return nil, err
		}
	}
	held := map[string]*pgshard.HeldSnapshot{}
	ok := false
	defer func() {
		if !ok {
			closeHeld(held)
		}
	}()
	for _, n := range nodes {
		h, err := s.cluster.OpenSnapshotConn(ctx, n, t.Tenant)
		if err != nil {
			return nil, err
		}
		held[n] = h
	}
	op.Phase = SnapshotPause
	st.Pauses++
	if err := saveSnapshot(ctx, run, st); err != nil {
		return nil, err
	}
	// Watched from before the pause, as a freeze does (Runner.freezeAndFlip).
	wctx, unwatch := context.WithCancel(ctx)
	defer unwatch()
	acked, err := s.store.WatchAcks(wctx, t.Tenant, t.MapName())
	if err != nil {
		log.Warn("acknowledgements not watched; the pause polls for them", "err", err)
	}
	var start time.Time
	frozen, err := s.runner.updateMap(ctx, t.Tenant, t.MapName(), func(m *shardmap.Map) (bool, error) {
		start = time.Now()
		m.Frozen = append(m.Frozen, [2]int{0, t.SlotCount - 1})
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	bctx, cancel := context.WithTimeout(ctx, s.runner.opts.FreezeBudget)
	defer cancel()
	live, err := s.runner.waitLagging(bctx, t, frozen, acked)
	if err == nil {
		// The look for proxies cut off from Redis runs beside the fences,
		// as in a freeze: the fences only reject writes the pause holds.
		cutOff := make(chan error, 1)
		go func() { cutOff <- s.runner.waitCutOff(bctx, t, frozen, live) }()
		// One transaction per node arms the fences of its shards.
		err = parallel(nodes, func(n string) error {
			var fs []pgshard.SlotFence
			for _, idx := range owning {
				if frozen.Shards[idx].Node == n {
					fs = append(fs, snapshotFence(t, op.ID, idx, frozen.Epoch))
				}
			}
			_, err := s.runner.cluster.ArmSlotFences(bctx, n, fs)
			return err
		})
		if cerr := <-cutOff; err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = parallel(nodes, func(n string) error {
			var idxs []int
			for _, idx := range owning {
				if frozen.Shards[idx].Node == n {
					idxs = append(idxs, idx)
				}
			}
			c, err := s.cluster.PreparedWriters(bctx, n, t, idxs)
			if err == nil && c > 0 {
				err = fmt.Errorf("migrator: %d locks of prepared transactions on the shards of %s on %s", c, t.Name, n)
			}
			return err
		})
	}
	if err == nil {
		err = parallel(nodes, func(n string) error { return held[n].Export(bctx) })
	}
	var at *shardmap.Map
	if err == nil {
		if at, err = s.store.Map(bctx, t.Tenant, t.MapName()); err == nil && at.Epoch != frozen.Epoch {
			err = fmt.Errorf("migrator: the map of %s changed during the pause (epoch %d to %d)", t.Name, frozen.Epoch, at.Epoch)
		}
	}
	s.runner.crash("snapshot_pause")
	// The fences go before the slots thaw, so that no held statement
	// meets one.
	uctx := context.WithoutCancel(ctx)
	derr := parallel(owning, func(idx int) error {
		return s.runner.cluster.DropSlotFence(uctx, m0.Shards[idx].Node, snapshotFence(t, op.ID, idx, 0))
	})
	terr := s.runner.thawSlots(uctx, t, [][2]int{{0, t.SlotCount - 1}})
	pause := time.Since(start)
	if err == nil {
		err = errors.Join(derr, terr)
	}
	if err != nil {
		s.metrics.PauseSeconds.WithLabelValues(t.Name, t.Tenant, "rolled_back").Observe(pause.Seconds())
		return nil, err
	}
	s.metrics.PauseSeconds.WithLabelValues(t.Name, t.Tenant, "held").Observe(pause.Seconds())
	log.Info("snapshot pause", "pause", pause, "epoch", at.Epoch, "nodes", len(nodes), "shards", len(owning))
	st.Map = snapshotMap(at, op.Target)
	st.Epoch, st.PauseSeconds = at.Epoch, pause.Seconds()
	ok = true
	return held, nil
}

// snapshotMap is the new tree's map: the source's slots, its owning shards
// on their nodes, its high-water mark.
func snapshotMap(m *shardmap.Map, name string) *shardmap.Map {
	out := &shardmap.Map{Tenant: m.Tenant, Tree: name, Epoch: 1, Slots: slices.Clone(m.Slots),
		Shards: map[int]shardmap.Shard{}, HighWater: m.HighWater}
	for _, idx := range m.OwningShards() {
		out.Shards[idx] = shardmap.Shard{Index: idx, Node: m.Shards[idx].Node, State: shardmap.ShardActive}
	}
	return out
}

// copy creates the new tree's shards and copies each shard's rows into
// them on its node, under that node's snapshot; the nodes in parallel,
// shard by shard on each.
func (s *Snapshotter) copy(ctx context.Context, run *TreeOpRun, src, dst *shardmap.Tree, st *snapshotState, held map[string]*pgshard.HeldSnapshot, log *slog.Logger) error {
	op := run.Op
	m := st.Map
	rows, err := s.runner.cluster.TreeRowCount(ctx, src, m)
	if err != nil {
		log.Warn("snapshot: no row estimate; its ETA waits for progress", "err", err)
	}
	op.RowsTotal = 0
	for _, n := range rows {
		op.RowsTotal += max(n, 0)
	}
	if dst.DDL, err = s.cluster.CopyDDL(ctx, src.Tenant, src.Name, dst.Name); err != nil {
		return err
	}
	st.DDL = dst.DDL
	op.Phase = SnapshotCopy
	if err := saveSnapshot(ctx, run, st); err != nil {
		return err
	}
	for _, idx := range m.OwningShards() {
		if err := s.runner.cluster.CreateShard(ctx, dst, idx, m.Shards[idx].Node, m.SlotRanges(idx), m.Epoch); err != nil {
			return err
		}
	}
	byNode := map[string][]int{}
	var nodes []string
	for _, idx := range m.OwningShards() {
		n := m.Shards[idx].Node
		if byNode[n] == nil {
			nodes = append(nodes, n)
		}
		byNode[n] = append(byNode[n], idx)
	}
	var mu sync.Mutex
	return parallel(nodes, func(n string) error {
		for _, idx := range byNode[n] {
			c, err := s.cluster.CopyShardUnder(ctx, n, held[n].ID, src, dst, idx, m.SlotRanges(idx))
			if err != nil {
				return err
			}
			s.metrics.Rows.WithLabelValues(src.Name, src.Tenant).Add(float64(c))
			mu.Lock()
			op.RowsDone += c
			op.RowsTotal = max(op.RowsTotal, op.RowsDone)
			st.Copied = append(st.Copied, idx)
			err = saveSnapshot(ctx, run, st)
			mu.Unlock()
			if err != nil {
				return err
			}
			s.runner.crash("snapshot_copy")
		}
		return nil
	})
}

// register makes the copy a tree: its template and record on the catalog
// node and its registry entry. A name taken meanwhile by another table or
// tree can never be registered: the copy is dropped, and the operation ends.
func (s *Snapshotter) register(ctx context.Context, run *TreeOpRun, src, dst *shardmap.Tree, st *snapshotState, log *slog.Logger) error {
	op := run.Op
	if op.Phase != SnapshotRegister {
		op.Phase = SnapshotRegister
		if err := saveSnapshot(ctx, run, st); err != nil {
			return err
		}
	}
	if _, err := s.store.Tree(ctx, op.Tenant, op.Target); err != nil {
		if !errors.Is(err, shardmap.ErrNotFound) {
			return err
		}
		s.runner.crash("snapshot_register")
		// In microseconds, as the catalog record keeps it.
		dst.DDL, dst.Created = st.DDL, time.Now().UTC().Truncate(time.Microsecond)
		dst.ShardCount = st.Map.DistinctShards()
		if err := s.cluster.RegisterTreeCopy(ctx, s.store, dst, st.Map, s.runner.WaitKnown); err != nil {
			var se *sqlstate.Error
			if errors.As(err, &se) {
				log.Error("snapshot dropped: its name was taken before it could be registered", "err", err)
				return s.cleanup(ctx, op, src, st)
			}
			return err
		}
	}
	took := time.Since(op.Started)
	s.metrics.Completed.WithLabelValues(src.Name, src.Tenant).Inc()
	s.metrics.Seconds.WithLabelValues(src.Name, src.Tenant).Observe(took.Seconds())
	s.runner.publish(ctx, Event{Event: EventSnapshotCompleted, Tenant: op.Tenant, Tree: op.Tree, Operation: op.ID, TargetTree: op.Target,
		Epoch: st.Epoch, Rows: &op.RowsDone})
	log.Info("snapshot completed", "rows", op.RowsDone, "pause", time.Duration(st.PauseSeconds*float64(time.Second)), "took", took)
	return nil
}

// cleanup removes what an unfinished run made: the fences of its pause
// (and the frozen slots, if it died in the pause) and the new tree's shard
// tables, on every shard the record or the current map names.
func (s *Snapshotter) cleanup(ctx context.Context, op *shardmap.TreeOp, src *shardmap.Tree, st *snapshotState) error {
	shards := map[int]string{}
	if st.Map != nil {
		for idx, sh := range st.Map.Shards {
			shards[idx] = sh.Node
		}
	}
	m, err := s.store.Map(ctx, op.Tenant, op.TreeMap())
	if err != nil && !errors.Is(err, shardmap.ErrNotFound) {
		return err
	}
	if m != nil {
		for idx, sh := range m.Shards {
			if sh.State != shardmap.ShardRetired {
				if err := s.runner.cluster.DropSlotFence(ctx, sh.Node, snapshotFence(src, op.ID, idx, 0)); err != nil {
					return err
				}
			}
			if _, ok := shards[idx]; !ok {
				shards[idx] = sh.Node
			}
		}
		if op.Phase == SnapshotPause && src.SlotCount > 0 {
			if err := s.runner.thawSlots(ctx, src, [][2]int{{0, src.SlotCount - 1}}); err != nil {
				return err
			}
		}
	}
	dst := &shardmap.Tree{Tenant: op.Tenant, Name: op.Target}
	for idx, node := range shards {
		if err := s.runner.cluster.DropShard(ctx, dst, idx, node); err != nil {
			return err
		}
	}
	return nil
}
