package migrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Merge events (tree events, EventsChannel), published for the target tree.
const (
	EventMergeStarted   = "merge_started"
	EventMergeRedrained = "merge_redrained" // a recorded source shard moved or retired: the source's current shards are drained again
	EventMergeCompleted = "merge_completed"
	EventMergeAbandoned = "merge_abandoned" // a tree of the merge was dropped
	EventMergeFailed    = "merge_failed"    // the target refused rows for good (Merger.fail)
)

// Merge phases after shardmap.OpIntent.
const (
	MergeCopying = "copy" // Sources are recorded; each is drained in turn
)

// MergeState is a merge's own part of its record (shardmap.TreeOp.State).
type MergeState struct {
	OnConflict string `json:"on_conflict"`
	// Sources are the source shards this pass reads, as the source's map
	// routed them when the pass began.
	Sources []MergeSource `json:"sources,omitempty"`
	Done    []int         `json:"done,omitempty"` // shards of Sources drained in this pass
	// Gone: a shard of Sources was dropped under this pass.
	Gone     bool `json:"gone,omitempty"`
	Redrains int  `json:"redrains,omitempty"`
}

// MergeStore is what a Merger keeps its records in.
type MergeStore interface {
	shardmap.TreeOps
	Tree(ctx context.Context, tenant, name string) (*shardmap.Tree, error)
	Map(ctx context.Context, tenant, tree string) (*shardmap.Map, error)
}

// MergeMetrics are a merge's instruments, tagged tree (the target) and tenant.
type MergeMetrics struct {
	Started   *prometheus.CounterVec
	Completed *prometheus.CounterVec
	Redrains  *prometheus.CounterVec
	Rows      *prometheus.CounterVec
	Seconds   *prometheus.HistogramVec
	Failed    *prometheus.CounterVec
}

// NewMergeMetrics creates the instruments and registers them with reg (nil:
// not registered).
func NewMergeMetrics(reg prometheus.Registerer) *MergeMetrics {
	tt := []string{"tree", "tenant"}
	m := &MergeMetrics{
		Started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_merge_started_total", Help: "Merges into the tree started.",
		}, tt),
		Completed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_merge_completed_total", Help: "Merges into the tree completed.",
		}, tt),
		Redrains: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_merge_redrains_total", Help: "Passes a merge drained the source again because a recorded source shard moved or retired.",
		}, tt),
		Rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_merge_rows_total", Help: "Rows merges inserted or updated in the tree.",
		}, tt),
		Failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_merge_failed_total", Help: "Merges into the tree that failed for good: the tree refused rows.",
		}, tt),
		Seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lattice_merge_seconds", Help: "Duration of each merge, from its record to its completion.",
			Buckets: []float64{1, 5, 10, 30, 60, 300, 900, 3600, 14400},
		}, tt),
	}
	if reg != nil {
		reg.MustRegister(m.Started, m.Completed, m.Redrains, m.Rows, m.Seconds, m.Failed)
	}
	return m
}

// Merger runs lattice_merge as a tree operation (shardmap.OpMerge): the
// TreeOpRunner records it before it acts and resumes it in whichever proxy
// holds the source tree's lease; the merge drains the source shard by
// shard into the target (docs/DESIGN.md section 5.6).
type Merger struct {
	copy    *MergeCopy
	store   MergeStore
	ops     *TreeOpRunner
	notify  func(ctx context.Context, tenant, payload string) error
	metrics *MergeMetrics
	log     *slog.Logger
}

// NewMerger returns a merger over the cluster and store that records its
// merges with ops and handles them there; metrics and log may be nil.
func NewMerger(cluster *pgshard.Cluster, store MergeStore, ops *TreeOpRunner, metrics *MergeMetrics, log *slog.Logger) *Merger {
	if log == nil {
		log = slog.Default()
	}
	if metrics == nil {
		metrics = NewMergeMetrics(nil)
	}
	mg := &Merger{copy: &MergeCopy{Cluster: cluster, Maps: store, Log: log}, store: store, ops: ops, notify: clusterNodes{Cluster: cluster}.Notify,
		metrics: metrics, log: log}
	ops.Handle(shardmap.OpMerge, mg.run)
	return mg
}

// Start records a merge of source into target and starts it here. A merge
// of the same trees already running is returned as it is; any other tree
// operation that conflicts refuses it with 55000.
func (mg *Merger) Start(ctx context.Context, tenant, source, target, onConflict string) (string, error) {
	st, err := mg.tree(ctx, tenant, source)
	if err != nil {
		return "", err
	}
	tt, err := mg.tree(ctx, tenant, target)
	if err != nil {
		return "", err
	}
	if err := CheckMerge(st, tt, onConflict); err != nil {
		return "", err
	}
	state, err := json.Marshal(MergeState{OnConflict: onConflict})
	if err != nil {
		return "", err
	}
	op := &shardmap.TreeOp{Tenant: tenant, Kind: shardmap.OpMerge, Tree: st.Name, Target: tt.Name,
		Map: st.MapName(), TargetMap: tt.MapName(), State: state}
	// A merge into target that failed for good is replaced: it would
	// report its error after this one completed.
	failed, err := mg.merges(ctx, tenant, tt.Name)
	if err != nil {
		return "", err
	}
	for _, f := range failed {
		if f.Phase != shardmap.OpFailed {
			continue
		}
		if err := mg.store.FinishTreeOp(ctx, tenant, f.ID); err != nil {
			return "", err
		}
	}
	cur, err := mg.ops.Start(ctx, op)
	if err != nil {
		return "", err
	}
	if cur != nil {
		if cur.Kind == shardmap.OpMerge && cur.Tree == op.Tree && cur.Target == op.Target {
			return cur.ID, nil
		}
		return "", sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "lattice_merge: a %s of tree %s (operation %s) runs", cur.Kind, cur.Tree, cur.ID).
			WithHint("Wait until it completes (lattice_merge_complete, lattice_snapshot_complete or lattice_resize_complete), then merge.")
	}
	mg.metrics.Started.WithLabelValues(tt.Name, tenant).Inc()
	mg.publish(ctx, Event{Event: EventMergeStarted, Tenant: tenant, Tree: tt.Name, Operation: op.ID, SourceTree: st.Name})
	return op.ID, nil
}

func (mg *Merger) tree(ctx context.Context, tenant, name string) (*shardmap.Tree, error) {
	t, err := mg.store.Tree(ctx, tenant, name)
	if errors.Is(err, shardmap.ErrNotFound) {
		return nil, sqlstate.New(sqlstate.UndefinedTable, "tree %q does not exist", name).
			WithHint("SELECT * FROM lattice_trees() lists the trees; an ordinary table becomes one with lattice_create_tree.")
	}
	return t, err
}

// Complete reports whether no merge into target runs. A merge into it that
// failed for good is its error, so that a script waiting for the merge
// stops.
func (mg *Merger) Complete(ctx context.Context, tenant, target string) (bool, error) {
	if _, err := mg.tree(ctx, tenant, target); err != nil {
		return false, err
	}
	ops, err := mg.merges(ctx, tenant, target)
	if err != nil {
		return false, err
	}
	running := false
	for _, op := range ops {
		if op.Phase != shardmap.OpFailed {
			running = true
			continue
		}
		// One from a source dropped since is forgotten at the next tick.
		if _, err := mg.store.Tree(ctx, tenant, op.Tree); errors.Is(err, shardmap.ErrNotFound) {
			continue
		}
		return false, sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "merge %s of tree %s into %s failed: %s", op.ID, op.Tree, op.Target, op.LastError).
			WithHint(fmt.Sprintf("Fix the rows or the target's definition, then run SELECT lattice_merge(%s, %s) again: it merges every row again, an upsert.", quoteLiteral(op.Tree), quoteLiteral(op.Target)))
	}
	return !running, nil
}

// merges lists the running merges into target.
func (mg *Merger) merges(ctx context.Context, tenant, target string) ([]*shardmap.TreeOp, error) {
	ops, err := mg.store.TreeOps(ctx, tenant, target)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(ops, func(op *shardmap.TreeOp) bool { return op.Kind != shardmap.OpMerge || op.Target != target }), nil
}

// mergeRun is one run of a merge: its record and its own state.
type mergeRun struct {
	mg    *Merger
	run   *TreeOpRun
	state MergeState
}

// save writes the record with the run's state; it fails once another run
// claimed the merge.
func (r *mergeRun) save(ctx context.Context) error {
	b, err := json.Marshal(r.state)
	if err != nil {
		return err
	}
	r.run.Op.State = b
	return r.run.Save(ctx)
}

// run is the TreeOpHandler of merges: it takes the merge from its recorded
// phase to its completion. Every step can run again, since the copy is an
// upsert, and a resumed run has nothing to clean: the staging tables died
// with the transactions of the run before.
func (mg *Merger) run(ctx context.Context, run *TreeOpRun) error {
	op := run.Op
	r := &mergeRun{mg: mg, run: run}
	if err := json.Unmarshal(op.State, &r.state); err != nil {
		return fmt.Errorf("migrator: merge %s: decode its state: %w", op.ID, err)
	}
	src, err := mg.store.Tree(ctx, op.Tenant, op.Tree)
	if err == nil {
		var tgt *shardmap.Tree
		if tgt, err = mg.store.Tree(ctx, op.Tenant, op.Target); err == nil {
			return r.drain(ctx, MergeSpec{Source: src, Target: tgt, OnConflict: r.state.OnConflict})
		}
	}
	if !errors.Is(err, shardmap.ErrNotFound) {
		return err
	}
	mg.log.Error("merge: a tree of the merge was dropped; the merge is abandoned", "merge", op.ID, "source", op.Tree, "target", op.Target, "tenant", op.Tenant)
	mg.publish(ctx, Event{Event: EventMergeAbandoned, Tenant: op.Tenant, Tree: op.Target, Operation: op.ID, SourceTree: op.Tree})
	return nil
}

// drain reads every recorded source shard into the target, then checks the
// source's map: if it no longer routes the recorded shards as they were
// recorded (a fold retired one, a split or move took slots), it records the
// current shards and drains them all again.
func (r *mergeRun) drain(ctx context.Context, spec MergeSpec) error {
	mg, op := r.mg, r.run.Op
	for {
		if len(r.state.Sources) == 0 {
			m, err := mg.store.Map(ctx, op.Tenant, spec.Source.MapName())
			if err != nil {
				return err
			}
			r.state.Sources, r.state.Done, r.state.Gone = MergeSources(m), nil, false
			op.Phase = MergeCopying
			if err := r.save(ctx); err != nil {
				return err
			}
		}
		for _, s := range r.state.Sources {
			if slices.Contains(r.state.Done, s.Shard) {
				continue
			}
			n, err := mg.copy.DrainShard(ctx, spec, s)
			mg.metrics.Rows.WithLabelValues(op.Target, op.Tenant).Add(float64(n))
			gone := errors.Is(err, ErrSourceGone)
			if refused(err) {
				return r.fail(ctx, err)
			}
			if err != nil && !gone {
				return err // the runner records it
			}
			if gone {
				mg.log.Info("merge: a source shard was dropped under the merge; the source is drained again at the end", "merge", op.ID, "shard", s.Shard)
			}
			r.state.Done = append(r.state.Done, s.Shard)
			r.state.Gone = r.state.Gone || gone
			op.RowsDone += n
			if err := r.save(ctx); err != nil {
				return err
			}
			crashPoint("merge_shard_done")
		}
		m, err := mg.store.Map(ctx, op.Tenant, spec.Source.MapName())
		if err != nil {
			return err
		}
		if !r.state.Gone && !SourcesChanged(r.state.Sources, m) {
			break
		}
		mg.log.Info("merge: a recorded source shard moved or retired; draining the source's current shards again", "merge", op.ID,
			"source", op.Tree, "recorded", len(r.state.Sources), "now", m.DistinctShards())
		r.state.Sources, r.state.Done, r.state.Gone = MergeSources(m), nil, false
		r.state.Redrains++
		if err := r.save(ctx); err != nil {
			return err
		}
		mg.metrics.Redrains.WithLabelValues(op.Target, op.Tenant).Inc()
		mg.publish(ctx, Event{Event: EventMergeRedrained, Tenant: op.Tenant, Tree: op.Target, Epoch: m.Epoch, Operation: op.ID, SourceTree: op.Tree,
			Shards: m.DistinctShards()})
	}
	mg.metrics.Completed.WithLabelValues(op.Target, op.Tenant).Inc()
	mg.metrics.Seconds.WithLabelValues(op.Target, op.Tenant).Observe(time.Since(op.Started).Seconds())
	mg.publish(ctx, Event{Event: EventMergeCompleted, Tenant: op.Tenant, Tree: op.Target, Operation: op.ID, SourceTree: op.Tree})
	mg.log.Info("merge completed", "merge", op.ID, "source", op.Tree, "target", op.Target, "tenant", op.Tenant,
		"rows", op.RowsDone, "redrains", r.state.Redrains)
	return nil
}

// refused reports an error of the target's that no retry gets past: a
// value it cannot take (class 22), a constraint (class 23), a column or
// key the target no longer has.
func refused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23":
		return true
	}
	switch pgErr.Code {
	case sqlstate.UndefinedColumn, sqlstate.DatatypeMismatch, sqlstate.InvalidColumnReference:
		return true
	}
	return false
}

// fail ends a merge the target refuses, keeping what it merged so far: it
// holds nothing from then on, lattice_merge_complete reports the error,
// and a lattice_merge of the trees replaces it once the rows or the target
// are fixed (merging again is an upsert).
func (r *mergeRun) fail(ctx context.Context, cause error) error {
	mg, op := r.mg, r.run.Op
	mg.metrics.Failed.WithLabelValues(op.Target, op.Tenant).Inc()
	mg.publish(ctx, Event{Event: EventMergeFailed, Tenant: op.Tenant, Tree: op.Target, Operation: op.ID, SourceTree: op.Tree, Error: cause.Error()})
	return r.run.Fail(ctx, cause)
}

// publish sends a merge event; a failure is logged and the merge goes on.
func (mg *Merger) publish(ctx context.Context, ev Event) {
	ev.At = time.Now().UTC()
	payload, err := json.Marshal(ev)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), eventTimeout)
	defer cancel()
	if err := mg.notify(ctx, ev.Tenant, string(payload)); err != nil {
		mg.log.Warn("tree event not published", "event", ev.Event, "tree", ev.Tree, "tenant", ev.Tenant, "err", err)
	}
}
