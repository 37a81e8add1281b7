package migrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// TreeOpRun is one run of a recorded tree operation: the handler of its
// kind carries Op from its recorded phase to the end, saving progress as
// it goes.
type TreeOpRun struct {
	Op *shardmap.TreeOp
	// Resumed: an earlier run of the operation ended without finishing it
	// (a crash, a lost lease, an error), so the handler finds whatever that
	// run created and removes or reuses it.
	Resumed bool
	store   shardmap.TreeOps
}

// Save writes Op: progress, a phase change (recorded before the phase's
// work). It fails with shardmap.ErrAttempt once another run claimed the
// operation; the handler then stops at once.
func (run *TreeOpRun) Save(ctx context.Context) error {
	return run.store.UpdateTreeOp(ctx, run.Op)
}

// Fail records Op as failed for good (shardmap.OpFailed) with cause, and
// returns the error the handler returns then: no run takes the operation
// again, and its record stays to report cause until the operation is
// started again.
func (run *TreeOpRun) Fail(ctx context.Context, cause error) error {
	run.Op.Phase, run.Op.LastError = shardmap.OpFailed, cause.Error()
	if err := run.Save(ctx); err != nil {
		return err
	}
	return fmt.Errorf("%w: %w", errFailedForGood, cause)
}

// errFailedForGood marks what a handler returns after Fail.
var errFailedForGood = errors.New("failed for good")

// TreeOpHandler carries one kind of tree operation to its end and returns
// nil when it is finished (the record is removed then), an error to have
// the next tick run it again, or what TreeOpRun.Fail returns.
type TreeOpHandler func(ctx context.Context, run *TreeOpRun) error

// TreeOpRunner resumes recorded tree operations (snapshot, merge, resize)
// in whichever proxy holds the coordinator lease of the operation's tree,
// as the reshard coordinator resumes reshards (docs/DESIGN.md section 6a).
// Each kind registers its handler with Handle.
type TreeOpRunner struct {
	id    string
	store Store
	opts  CoordinatorOptions
	log   *slog.Logger

	mu       sync.Mutex
	handlers map[shardmap.TreeOpKind]TreeOpHandler
	running  map[string]bool // operation ids running in this process
	fresh    map[string]bool // operation ids Start recorded here and no run has taken yet
	wg       sync.WaitGroup
	wake     chan struct{}
}

// NewTreeOpRunner returns a runner that takes leases as owner id (the
// coordinator's id, so that one proxy holds a tree's reshard and its
// operations alike).
func NewTreeOpRunner(id string, store Store, opts CoordinatorOptions, log *slog.Logger) *TreeOpRunner {
	if log == nil {
		log = slog.Default()
	}
	return &TreeOpRunner{id: id, store: store, opts: opts.withDefaults(), log: log,
		handlers: map[shardmap.TreeOpKind]TreeOpHandler{}, running: map[string]bool{}, fresh: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// Handle registers the handler of kind.
func (r *TreeOpRunner) Handle(kind shardmap.TreeOpKind, h TreeOpHandler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.handlers[kind] = h
}

// Start records op (its intent, before anything acts) and asks for a tick,
// which runs it here. It returns the running operation op conflicts with
// instead, if there is one (shardmap.TreeOps.StartTreeOp).
func (r *TreeOpRunner) Start(ctx context.Context, op *shardmap.TreeOp) (*shardmap.TreeOp, error) {
	op.ID, op.Attempt, op.Phase = newID(), newID(), shardmap.OpIntent
	op.Started = time.Now().UTC()
	op.Updated = op.Started
	other, err := r.store.StartTreeOp(ctx, op)
	if err != nil || other != nil {
		return other, err
	}
	r.mu.Lock()
	r.fresh[op.ID] = true
	r.mu.Unlock()
	r.Nudge()
	return nil, nil
}

// Nudge asks for a tick now; it never blocks.
func (r *TreeOpRunner) Nudge() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run ticks until ctx ends, then waits for the runs it started.
func (r *TreeOpRunner) Run(ctx context.Context) {
	t := time.NewTicker(r.opts.Tick)
	defer t.Stop()
	for {
		r.Tick(ctx)
		select {
		case <-ctx.Done():
			r.wg.Wait()
			return
		case <-t.C:
		case <-r.wake:
		}
	}
}

// Tick starts every recorded operation that does not run here and whose
// tree's lease this process takes: the lease of the tree's map, a
// colocation group's for its members, which is the one the group's
// coordinator holds, so that the operation and the group's reshard run
// their migrations in one process (Coordinator.ensureRunning).
func (r *TreeOpRunner) Tick(ctx context.Context) {
	ops, err := r.store.AllTreeOps(ctx)
	if err != nil {
		r.log.Warn("tree operations: list", "err", err)
		return
	}
	for _, op := range ops {
		r.mu.Lock()
		h, busy := r.handlers[op.Kind], r.running[op.ID]
		r.mu.Unlock()
		if op.Phase == shardmap.OpFailed {
			r.forgetFailed(ctx, op)
			continue
		}
		if busy || h == nil {
			continue
		}
		ok, err := r.store.AcquireLease(ctx, op.Tenant, op.TreeMap(), r.id, r.opts.LeaseTTL)
		if err != nil || !ok {
			continue
		}
		r.start(ctx, op, h)
	}
}

// forgetFailed removes the record of a failed operation once its tree or
// its target was dropped: nothing can start it again then, and its error
// concerns no tree.
func (r *TreeOpRunner) forgetFailed(ctx context.Context, op *shardmap.TreeOp) {
	for _, name := range []string{op.Tree, op.Target} {
		if name == "" {
			continue
		}
		if _, err := r.store.Tree(ctx, op.Tenant, name); errors.Is(err, shardmap.ErrNotFound) {
			if err := r.store.FinishTreeOp(ctx, op.Tenant, op.ID); err != nil {
				r.log.Warn("tree operation: forget a failed one whose tree is gone", "op", op.ID, "err", err)
			}
			return
		}
	}
}

// Wait waits for the runs this process started (tests).
func (r *TreeOpRunner) Wait() { r.wg.Wait() }

func (r *TreeOpRunner) start(ctx context.Context, op *shardmap.TreeOp, h TreeOpHandler) {
	// A record this process did not just start, or one whose earlier run
	// here ended, is resumed: a new attempt takes it over, and the writes
	// of any run before are refused from then on.
	prev := op.Attempt
	op.Attempt = newID()
	r.mu.Lock()
	resumed := !r.fresh[op.ID]
	delete(r.fresh, op.ID)
	r.mu.Unlock()
	if err := r.store.ClaimTreeOp(ctx, op, prev); err != nil {
		if !errors.Is(err, shardmap.ErrNotFound) {
			r.log.Warn("tree operation: claim", "op", op.ID, "err", err)
		}
		return
	}
	r.mu.Lock()
	if r.running[op.ID] {
		r.mu.Unlock()
		return
	}
	r.running[op.ID] = true
	r.mu.Unlock()
	runCtx, cancel := context.WithCancel(ctx)
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		r.keepLease(runCtx, cancel, op)
	}()
	go func() {
		defer r.wg.Done()
		defer cancel()
		log := r.log.With("op", op.ID, "kind", op.Kind, "tree", op.Tree, "tenant", op.Tenant)
		log.Info("tree operation run", "phase", op.Phase, "resumed", resumed)
		err := h(runCtx, &TreeOpRun{Op: op, Resumed: resumed, store: r.store})
		if err == nil {
			err = r.store.FinishTreeOp(ctx, op.Tenant, op.ID)
		}
		switch {
		case errors.Is(err, errFailedForGood):
			log.Error("tree operation failed; it runs no more", "err", err)
		case err != nil && ctx.Err() == nil:
			log.Warn("tree operation failed; the next tick resumes it", "phase", op.Phase, "err", err)
			if !errors.Is(err, shardmap.ErrAttempt) && !errors.Is(err, shardmap.ErrNotFound) {
				op.LastError = fmt.Sprint(err)
				if uerr := r.store.UpdateTreeOp(context.WithoutCancel(ctx), op); uerr != nil {
					log.Warn("tree operation: record the error", "err", uerr)
				}
			}
		}
		r.mu.Lock()
		delete(r.running, op.ID)
		r.mu.Unlock()
	}()
}

// keepLease renews the tree's lease while the run lasts, and cancels the
// run when another process holds it: that one resumes the operation.
func (r *TreeOpRunner) keepLease(ctx context.Context, cancel context.CancelFunc, op *shardmap.TreeOp) {
	every := min(r.opts.LeaseTTL/3, r.opts.Tick)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ok, err := r.store.AcquireLease(ctx, op.Tenant, op.TreeMap(), r.id, r.opts.LeaseTTL)
		if err == nil && !ok {
			r.log.Warn("tree operation: the tree's lease went to another proxy; it resumes the operation", "op", op.ID, "tree", op.Tree)
			cancel()
			return
		}
	}
}

// SetTreeOps gives the functions the runner of tree operations, which
// lattice_snapshot, lattice_merge and lattice_resize record theirs with
// and register their handlers on.
func (f *Functions) SetTreeOps(r *TreeOpRunner) {
	f.ops = r
	r.Handle(shardmap.OpResize, f.runResize)
}
