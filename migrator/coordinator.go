package migrator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/lattice-db/lattice/autonomic"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// CoordinatorOptions tune the reshard coordinator (docs/DESIGN.md section 6). Zero
// values take the defaults.
type CoordinatorOptions struct {
	Tick                    time.Duration // 2 s
	LeaseTTL                time.Duration // 1 min: the keepalive
	MaxConcurrentMigrations int           // 4
	EmptyTreeProbeBudget    time.Duration // 10 s
}

func (o CoordinatorOptions) withDefaults() CoordinatorOptions {
	if o.Tick <= 0 {
		o.Tick = 2 * time.Second
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = time.Minute
	}
	if o.MaxConcurrentMigrations <= 0 {
		o.MaxConcurrentMigrations = 4
	}
	if o.EmptyTreeProbeBudget <= 0 {
		o.EmptyTreeProbeBudget = 10 * time.Second
	}
	return o
}

// Interlocks are the hooks for the tree operations that share a tree with
// its reshards (online resize, snapshot, merge). The coordinator and the
// fold path ask them the specification's questions; TreeOpInterlocks
// answers from the recorded operations, NoInterlocks no to all.
type Interlocks interface {
	// ResizeInFlight: a resize runs on the tree, so a reshard that needs a
	// migration is refused.
	ResizeInFlight(ctx context.Context, tenant, tree string) bool
	// SnapshotOrMergeRunning: a shrink starts no fold while one runs.
	SnapshotOrMergeRunning(ctx context.Context, tenant, tree string) bool
	// HoldFold: a fold's final step (its freeze and flip) and the release
	// of its donor wait while it answers yes.
	HoldFold(ctx context.Context, tenant, tree string) bool
	// HoldMoveRelease: a move's release, which drops the shard on its old
	// node, waits while it answers yes.
	HoldMoveRelease(ctx context.Context, tenant, tree string) bool
}

// NoInterlocks answers no to every interlock (tests without tree operations).
type NoInterlocks struct{}

func (NoInterlocks) ResizeInFlight(context.Context, string, string) bool         { return false }
func (NoInterlocks) SnapshotOrMergeRunning(context.Context, string, string) bool { return false }
func (NoInterlocks) HoldFold(context.Context, string, string) bool               { return false }
func (NoInterlocks) HoldMoveRelease(context.Context, string, string) bool        { return false }

// Reshard phases as stored in the intent.
const (
	ReshardMigrating = "migrating"
	ReshardRepin     = "repin" // the empty-tree path holds the intent as a lock
)

// Coordinator runs the reshards whose tree lease this process holds.
type Coordinator struct {
	id         string
	runner     *Runner
	cluster    Nodes
	store      Store
	opts       CoordinatorOptions
	metrics    *Metrics
	interlocks Interlocks
	log        *slog.Logger
	// load, when set, makes a grow split the hottest shards first, at
	// their load midpoints (loadaware.go).
	load autonomic.LoadSource
	// seen keeps each unit's writes per slot for writesFresh.
	seenMu sync.Mutex
	seen   map[string]seenWrites

	mu      sync.Mutex
	running map[string]bool // migration ids running in this process
	wg      sync.WaitGroup
	// wake asks Run for a tick now (Nudge); one pending wake is enough.
	wake chan struct{}
}

// NewCoordinator returns a coordinator that takes leases as owner id.
// interlocks, metrics and log may be nil.
func NewCoordinator(id string, runner *Runner, opts CoordinatorOptions, interlocks Interlocks) *Coordinator {
	if interlocks == nil {
		interlocks = NoInterlocks{}
	}
	runner.interlocks = interlocks
	return &Coordinator{id: id, runner: runner, cluster: runner.cluster, store: runner.store, opts: opts.withDefaults(),
		metrics: runner.metrics, interlocks: interlocks, log: runner.log, running: map[string]bool{},
		wake: make(chan struct{}, 1)}
}

// Run ticks until ctx ends, then waits for the migrations it started. It
// ticks every Tick, and at once after a Nudge, which any proxy's stored
// intent sends (followIntents).
func (c *Coordinator) Run(ctx context.Context) {
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		c.followIntents(ctx)
	}()
	t := time.NewTicker(c.opts.Tick)
	defer t.Stop()
	for {
		c.tickAll(ctx)
		select {
		case <-ctx.Done():
			c.wg.Wait()
			<-followed
			return
		case <-t.C:
		case <-c.wake:
		}
	}
}

// Nudge asks for a tick now rather than at the next Tick: an intent was
// stored, or a migration ended and the next may start. Without it every
// reshard waited up to a tick to begin and a tick between each wave of
// migrations. It never blocks; nudges that arrive during a tick make one
// more tick. A proxy started without a coordinator leaves it to the others'
// ticks.
func (c *Coordinator) Nudge() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Coordinator) tickAll(ctx context.Context) {
	rs, err := c.store.Reshards(ctx)
	if err != nil {
		c.log.Warn("coordinator: list reshards", "err", err)
		return
	}
	for _, r := range rs {
		if r.Phase == ReshardRepin {
			if time.Since(r.Started) > c.opts.LeaseTTL+c.opts.EmptyTreeProbeBudget {
				c.abandonRepin(ctx, r)
			}
			continue
		}
		ok, err := c.store.AcquireLease(ctx, r.Tenant, r.Tree, c.id, c.opts.LeaseTTL)
		if err != nil || !ok {
			continue
		}
		if err := c.tick(ctx, r); err != nil && ctx.Err() == nil {
			c.log.Warn("coordinator: tick", "tree", r.Tree, "tenant", r.Tenant, "err", err)
		}
	}
}

// Tick is one step of one tree's coordinator, for tests that drive it.
func (c *Coordinator) Tick(ctx context.Context, tenant, tree string) error {
	r, err := c.store.Reshard(ctx, tenant, tree)
	if err != nil {
		return err
	}
	ok, err := c.store.AcquireLease(ctx, tenant, tree, c.id, c.opts.LeaseTTL)
	if err != nil || !ok {
		return err
	}
	return c.tick(ctx, r)
}

func inFlight(migs []*shardmap.Migration) []*shardmap.Migration {
	var out []*shardmap.Migration
	for _, m := range migs {
		if m.Phase != shardmap.PhaseDone {
			out = append(out, m)
		}
	}
	return out
}

// unflipped counts in-flight migrations of kind whose flip is still ahead.
func unflipped(migs []*shardmap.Migration, kind shardmap.MigrationKind) int {
	n := 0
	for _, m := range migs {
		if m.Kind == kind && !phaseFlipped(m.Phase) {
			n++
		}
	}
	return n
}

// tickBudget bounds a tick's own reads and writes (Redis, and the nodes'
// row counts and sizes). tickAll ticks one tree after another, so a call
// that never returns (a node's answer lost on a dead TCP connection, a
// catalog read queued behind a lock) would stall every tree's reshard and
// outlive the lease; past the budget the tick fails, is logged, and the
// next one tries again on a fresh connection. Half the lease, so that the
// coordinator still renews it in time. The migrations a tick starts run
// under the coordinator's own context, not this one.
func (c *Coordinator) tickBudget() time.Duration { return c.opts.LeaseTTL / 2 }

func (c *Coordinator) tick(ctx context.Context, r *shardmap.Reshard) error {
	run := ctx
	ctx, cancel := context.WithTimeout(ctx, c.tickBudget())
	defer cancel()
	if r.Kind != shardmap.IntentReshard {
		return c.tickRebalance(ctx, run, r)
	}
	u, err := c.runner.unitOf(ctx, r.Tenant, r.Tree) // r.Tree names the map: a colocation group reshards as one
	if err != nil {
		return err
	}
	t := u.lead
	// The migrations are read before the map: a migration that flips
	// between the two reads is then counted both as flipped (in the map)
	// and as still to flip, which only delays the plan by a tick. In the
	// other order it counted as neither, and a shrink folded one shard too
	// many (TestReshardSemantics, 7 -> 3 gave 2).
	migs, err := c.store.Migrations(ctx, r.Tenant, r.Tree)
	if err != nil {
		return err
	}
	m, err := c.store.Map(ctx, r.Tenant, r.Tree)
	if err != nil {
		return err
	}
	flying := inFlight(migs)
	held := false
	for _, mig := range flying {
		if phaseOperator(mig.Phase) {
			held = true // lattice_repair_migration moves it on
			continue
		}
		c.ensureRunning(run, mig)
	}
	if held {
		// The reshard does not go on past a move that failed its
		// verification until an operator repairs it.
		return nil
	}
	distinct := m.DistinctShards()
	free := c.opts.MaxConcurrentMigrations - len(flying)
	if r.Grow {
		if distinct >= r.Target && len(withoutResizes(flying)) == 0 {
			return c.complete(ctx, u, r)
		}
		need := min(r.Target-distinct-unflipped(flying, shardmap.Split), free)
		if need <= 0 {
			return nil
		}
		writes := c.slotWrites(ctx, u)
		for _, src := range splitSourcesByLoad(m, flying, writes) {
			if need <= 0 {
				break
			}
			mig, err := c.growSplit(ctx, t, m, src, writes)
			if err != nil {
				return err
			}
			c.ensureRunning(run, mig)
			need--
		}
		return nil
	}
	if distinct <= r.Target && len(withoutResizes(flying)) == 0 {
		return c.complete(ctx, u, r)
	}
	if c.interlocks.SnapshotOrMergeRunning(ctx, r.Tenant, r.Tree) {
		c.log.Info("shrink starts no fold: a snapshot of the tree or a merge into it runs", "tree", r.Tree, "tenant", r.Tenant)
		return nil
	}
	if healing(flying) {
		// A shrink plans against the map healing's folds leave: it waits
		// for every one healing had started.
		c.log.Info("shrink waits for healing's folds", "tree", r.Tree, "tenant", r.Tenant, "target", r.Target)
		return nil
	}
	need := min(distinct-r.Target-unflipped(flying, shardmap.Fold), free)
	if need <= 0 {
		return nil
	}
	rows, err := c.runner.rowCounts(ctx, u, m)
	if err != nil {
		return err
	}
	for _, p := range foldPairs(m, flying, rows) {
		if need <= 0 {
			break
		}
		mig, err := c.runner.StartFold(ctx, t, p.donor, p.survivor)
		if errors.Is(err, ErrBusy) {
			continue
		}
		if err != nil {
			return err
		}
		c.ensureRunning(run, mig)
		need--
	}
	return nil
}

// busy is every shard an in-flight migration touches.
func busy(flying []*shardmap.Migration) map[int]bool {
	b := map[int]bool{}
	for _, m := range flying {
		b[m.Source], b[m.Target] = true, true
	}
	return b
}

// splitSources lists the shards a grow may split, largest owners first:
// active, at least two slots, and not part of an in-flight migration.
func splitSources(m *shardmap.Map, flying []*shardmap.Migration) []int {
	counts := m.SlotCounts()
	b := busy(flying)
	var out []int
	for idx, n := range counts {
		if n >= 2 && !b[idx] && m.Shards[idx].State == shardmap.ShardActive {
			out = append(out, idx)
		}
	}
	slices.SortFunc(out, func(a, b int) int {
		if c := cmp.Compare(counts[b], counts[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return out
}

type foldPair struct {
	donor, survivor int
	cost            int64
}

// foldPairs lists disjoint adjacent pairs of owning shards, cheapest first
// (fewest rows together), leaving out every shard of an in-flight
// migration, so that the plan holds against the map the running folds
// leave. The smaller side of a pair is the donor: it is the one copied.
func foldPairs(m *shardmap.Map, flying []*shardmap.Migration, rows map[int]int64) []foldPair {
	type span struct{ idx, lo, hi int }
	var spans []span
	for _, idx := range m.OwningShards() {
		rg := m.SlotRanges(idx)
		spans = append(spans, span{idx, rg[0][0], rg[len(rg)-1][1]})
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	b, fwd := foldBusy(flying)
	var pairs []foldPair
	for i := 0; i+1 < len(spans); i++ {
		x, y := spans[i], spans[i+1]
		if x.hi+1 != y.lo || b[x.idx] || b[y.idx] || fwd[x.idx] && fwd[y.idx] {
			continue
		}
		d, s := x.idx, y.idx
		if rows[d] > rows[s] || rows[d] == rows[s] && d < s {
			d, s = s, d
		}
		if fwd[s] {
			d, s = s, d // a shard a resize forwards may only be the donor
		}
		pairs = append(pairs, foldPair{donor: d, survivor: s, cost: rows[x.idx] + rows[y.idx]})
	}
	slices.SortStableFunc(pairs, func(a, b foldPair) int { return cmp.Compare(a.cost, b.cost) })
	used := map[int]bool{}
	out := pairs[:0]
	for _, p := range pairs {
		if used[p.donor] || used[p.survivor] {
			continue
		}
		used[p.donor], used[p.survivor] = true, true
		out = append(out, p)
	}
	return out
}

func (c *Coordinator) ensureRunning(ctx context.Context, mig *shardmap.Migration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running[mig.ID] {
		return
	}
	c.running[mig.ID] = true
	c.wg.Add(1)
	gauge := c.metrics.MigrationsInFlight.WithLabelValues(mig.Tree, mig.Tenant)
	gauge.Inc()
	go func() {
		defer c.wg.Done()
		defer gauge.Dec()
		// The caller's record may predate a run of this migration that
		// ended between the tick's read and now; running it from that older
		// phase would redo (or undo) finished work, so start from the
		// stored record. It is also the runner's own copy: the tick that
		// started it still reads the caller's (unflipped).
		own, err := c.storedMigration(ctx, mig)
		if err == nil && own != nil && own.Phase != shardmap.PhaseDone {
			err = c.runner.Run(ctx, own)
		}
		if err != nil && ctx.Err() == nil {
			c.log.Warn("coordinator: migration failed; the next tick retries it", "migration", mig.ID, "err", err)
		}
		c.mu.Lock()
		delete(c.running, mig.ID)
		c.mu.Unlock()
		if err == nil {
			// The next migration, or the completion, need not wait for a
			// tick. A failed run waits for one, so a lasting fault does
			// not spin.
			c.Nudge()
		}
	}()
}

// storedMigration is mig as Redis holds it now, or nil once it is gone.
func (c *Coordinator) storedMigration(ctx context.Context, mig *shardmap.Migration) (*shardmap.Migration, error) {
	migs, err := c.store.Migrations(ctx, mig.Tenant, mig.Tree)
	if err != nil {
		return nil, err
	}
	for _, m := range migs {
		if m.ID == mig.ID {
			return m, nil
		}
	}
	return nil, nil
}

// complete re-pins the registry's shard count, clears the intent, counts
// the completion and gives the lease up.
func (c *Coordinator) complete(ctx context.Context, u unit, r *shardmap.Reshard) error {
	t := u.lead
	m, err := c.store.Map(ctx, t.Tenant, t.MapName())
	if err != nil {
		return err
	}
	shards := m.DistinctShards()
	for _, t := range u.trees {
		if err := setShardCount(ctx, c.store, t.Tenant, t.Name, shards); err != nil {
			return err
		}
	}
	if err := c.store.FinishReshard(ctx, t.Tenant, r.Tree, r.OpID); err != nil {
		return err
	}
	c.metrics.ReshardCompleted.WithLabelValues(r.Tree, t.Tenant).Inc()
	c.metrics.CoordinatorCompleted.WithLabelValues(r.Tree, t.Tenant, "reshard").Inc()
	c.runner.publish(ctx, Event{Event: EventReshardCompleted, Tenant: t.Tenant, Tree: r.Tree, Epoch: m.Epoch,
		Reshard: r.OpID, From: r.From, To: r.Target, Shards: shards})
	c.log.Info("reshard completed", "tree", r.Tree, "tables", u.names(), "tenant", t.Tenant, "shards", shards, "took", time.Since(r.Started))
	return c.store.ReleaseLease(ctx, t.Tenant, r.Tree, c.id)
}

// setShardCount records n as the registry shard count of tree name. The
// count is all the coordinator owns of the entry, so it is set by
// compare-and-set on the entry as stored now, read again on a conflict:
// writing back an entry read earlier lost the DDL, colocation join or
// tree option another writer stored in between.
func setShardCount(ctx context.Context, store Store, tenant, name string, n int) error {
	for {
		cur, err := store.Tree(ctx, tenant, name)
		if err != nil {
			return err
		}
		if cur.ShardCount == n {
			return nil
		}
		next := *cur
		next.ShardCount = n
		if err := store.SwapTree(ctx, &next, cur); !errors.Is(err, shardmap.ErrConflict) {
			return err
		}
	}
}

// Rejected is a reshard refused before a coordinator starts: the client
// gets Err, and Reason labels the rejected counter.
type Rejected struct {
	Reason string
	Err    *sqlstate.Error
}

func (r *Rejected) Error() string { return r.Err.Error() }
func (r *Rejected) Unwrap() error { return r.Err }

// Reshard is lattice_reshard: it validates n, takes the empty-tree path or
// persists the intent for a coordinator, and returns what it did.
func (c *Coordinator) Reshard(ctx context.Context, tenant, tree string, n int) (string, error) {
	t, err := c.store.Tree(ctx, tenant, tree)
	if errors.Is(err, shardmap.ErrNotFound) {
		return "", sqlstate.New(sqlstate.UndefinedTable, "tree %q does not exist", tree)
	}
	if err != nil {
		return "", err
	}
	tree = t.MapName() // a colocation group reshards as one, under its name (group.go)
	cur, err := c.store.Reshard(ctx, tenant, tree)
	if err != nil && !errors.Is(err, shardmap.ErrNotFound) {
		return "", err
	}
	running := cur != nil
	c.metrics.ReshardInFlight.WithLabelValues(tree, tenant).Observe(map[bool]float64{false: 0, true: 1}[running])
	reject := func(code, reason, format string, args ...any) (string, error) {
		c.metrics.ReshardRejected.WithLabelValues(tree, tenant, reason).Inc()
		return "", &Rejected{Reason: reason, Err: sqlstate.New(code, format, args...)}
	}
	limit := min(4096, t.SlotCount)
	switch {
	case n < 2:
		return reject(sqlstate.InvalidParameterValue, ReasonMin, "shard count %d is out of range: it must be at least 2", n)
	case n > limit:
		return reject(sqlstate.InvalidParameterValue, ReasonMax, "shard count %d is out of range: tree %s allows at most %d (the smaller of 4096 and its %d slots)", n, tree, limit, t.SlotCount)
	}
	if running && cur.Kind != shardmap.IntentReshard {
		return reject(sqlstate.ObjectNotInPrerequisiteState, ReasonRebalanceInFlight, "%s; reshard it afterwards", intentRunning(cur))
	}
	if running {
		if cur.Target == n {
			return fmt.Sprintf("reshard of %s to %d shards is already running", tree, n), nil
		}
		return reject(sqlstate.ObjectNotInPrerequisiteState, ReasonInProgress, "a reshard of %s to %d shards is in progress; wait for it before asking for %d", tree, cur.Target, n)
	}
	m, err := c.store.Map(ctx, tenant, tree)
	if err != nil {
		return "", err
	}
	distinct := m.DistinctShards()
	if distinct == n {
		return fmt.Sprintf("tree %s already has %d shards", tree, n), nil
	}
	op := &shardmap.Reshard{OpID: newID(), Tenant: tenant, Tree: tree, Target: n, From: distinct, Grow: n > distinct, Phase: ReshardRepin, Started: time.Now().UTC()}
	repinned, err := c.tryRepin(ctx, t, op)
	if err != nil {
		return "", err
	}
	if repinned {
		return fmt.Sprintf("tree %s was empty and is re-pinned to %d shards", tree, n), nil
	}
	if c.interlocks.ResizeInFlight(ctx, tenant, tree) {
		return reject(sqlstate.ObjectNotInPrerequisiteState, ReasonResizeInFlight, "a resize of %s is in flight; reshard it afterwards", tree)
	}
	op.Phase = ReshardMigrating
	other, err := c.store.StartReshard(ctx, op)
	if err != nil {
		return reject(sqlstate.SystemError, ReasonStateWrite, "could not persist the reshard of %s: %v", tree, err)
	}
	if other != nil && other.Kind != shardmap.IntentReshard {
		return reject(sqlstate.ObjectNotInPrerequisiteState, ReasonRebalanceInFlight, "%s; reshard it afterwards", intentRunning(other))
	}
	if other != nil {
		if other.Target == n {
			return fmt.Sprintf("reshard of %s to %d shards is already running", tree, n), nil
		}
		return reject(sqlstate.ObjectNotInPrerequisiteState, ReasonInProgress, "a reshard of %s to %d shards is in progress; wait for it before asking for %d", tree, other.Target, n)
	}
	c.metrics.ReshardInitiated.WithLabelValues(tree, tenant).Inc()
	c.runner.publish(ctx, Event{Event: EventReshardStarted, Tenant: tenant, Tree: tree, Epoch: m.Epoch,
		Reshard: op.OpID, From: distinct, To: n})
	c.Nudge()
	verb := "splitting"
	if !op.Grow {
		verb = "folding"
	}
	return fmt.Sprintf("resharding %s from %d to %d shards (%s)", tree, distinct, n, verb), nil
}

// ReshardComplete is lattice_reshard_complete: no reshard is running.
func (c *Coordinator) ReshardComplete(ctx context.Context, tenant, tree string) (bool, error) {
	t, err := c.store.Tree(ctx, tenant, tree)
	if errors.Is(err, shardmap.ErrNotFound) {
		return false, sqlstate.New(sqlstate.UndefinedTable, "tree %q does not exist", tree)
	} else if err != nil {
		return false, err
	}
	r, err := c.store.Reshard(ctx, tenant, t.MapName())
	if errors.Is(err, shardmap.ErrNotFound) {
		return true, nil
	}
	return err == nil && r.Kind != shardmap.IntentReshard, err
}

// repinFence names the fences of an empty-tree re-pin.
func repinFence(t *shardmap.Tree, op string, idx int) pgshard.SlotFence {
	return pgshard.SlotFence{Migration: "repin_" + op, Tree: t, Shard: idx, Slots: [][2]int{{0, t.SlotCount - 1}}, Target: -1}
}

// tryRepin is the empty-tree path. The intent, stored in phase repin, is
// the lock against a concurrent reshard. Emptiness is probed within the
// budget (an inconclusive probe reads as not empty), then every slot is
// frozen, every shard fenced, and the probe repeated under the fence: only
// then can no write slip in between. The map becomes an identity map over
// shards 0..n-1, reviving retired indices as empty shards.
//
// The new shards are built from the registry entry read again once every
// proxy acknowledged the frozen map, not from t: DDL that passed its
// reshard check before the intent was stored has run to its end by then
// (an acknowledgement waits for the statement), and DDL from then on is
// refused, so that entry carries every change the new shards must replay.
// A colocation join is refused once the intent is stored; one made before
// sends the tree to the migrations.
func (c *Coordinator) tryRepin(ctx context.Context, t *shardmap.Tree, op *shardmap.Reshard) (bool, error) {
	if t.Group != "" {
		return false, nil // a colocation group is resharded by migrations, empty or not
	}
	c.runner.forgetReserved(t)
	pctx, cancel := context.WithTimeout(ctx, c.opts.EmptyTreeProbeBudget)
	defer cancel()
	m, err := c.store.Map(pctx, t.Tenant, t.Name)
	if err != nil {
		return false, err
	}
	if empty, err := c.cluster.TreeEmpty(pctx, t, m); err != nil || !empty {
		return false, nil
	}
	other, err := c.store.StartReshard(ctx, op)
	if err != nil || other != nil {
		return false, err
	}
	done := false
	defer func() {
		if !done {
			c.abandonRepin(context.WithoutCancel(ctx), op)
		}
	}()
	frozen, err := c.runner.updateMap(pctx, t.Tenant, t.Name, func(m *shardmap.Map) (bool, error) {
		m.Frozen = [][2]int{{0, t.SlotCount - 1}}
		return true, nil
	})
	if err != nil {
		return false, nil
	}
	if err := c.runner.waitAcks(pctx, t, frozen); err != nil {
		return false, nil
	}
	t, err = c.store.Tree(pctx, t.Tenant, t.Name)
	if err != nil {
		return false, err
	}
	if t.Group != "" {
		return false, nil // it joined a colocation group before the intent was stored
	}
	for idx, sh := range frozen.Shards {
		if sh.State == shardmap.ShardRetired {
			continue
		}
		if err := c.cluster.InstallSlotFence(pctx, sh.Node, repinFence(t, op.OpID, idx)); err != nil {
			return false, nil
		}
	}
	if empty, err := c.cluster.TreeEmpty(pctx, t, frozen); err != nil || !empty {
		return false, nil
	}
	n := op.Target
	next := shardmap.NewIdentityMap(t.Tenant, t.Name, t.SlotCount, n, c.cluster.NodeNames())
	for i := 0; i < n; i++ {
		if old, ok := frozen.Shards[i]; ok {
			next.Shards[i] = shardmap.Shard{Index: i, Node: old.Node, State: shardmap.ShardActive}
		}
	}
	for idx, sh := range frozen.Shards {
		if idx >= n {
			next.Shards[idx] = shardmap.Shard{Index: idx, Node: sh.Node, State: shardmap.ShardRetired}
		}
	}
	next.HighWater = max(frozen.HighWater, n)
	for i := 0; i < n; i++ {
		if err := c.cluster.CreateShard(ctx, t, i, next.Shards[i].Node, next.SlotRanges(i), frozen.Epoch+1); err != nil {
			return false, err
		}
	}
	next.Epoch = frozen.Epoch
	if err := c.runner.reserve(ctx, next, frozen.Epoch+1); err != nil {
		return false, err
	}
	if err := c.store.SwapMap(ctx, next, frozen.Epoch); err != nil {
		return false, err
	}
	done = true
	for idx, sh := range frozen.Shards {
		if sh.State == shardmap.ShardRetired {
			continue
		}
		if idx >= n {
			if err := c.cluster.DropShard(ctx, t, idx, sh.Node); err != nil {
				c.log.Warn("re-pin: drop retired shard", "shard", idx, "err", err)
			}
		}
		if err := c.cluster.DropSlotFence(ctx, sh.Node, repinFence(t, op.OpID, idx)); err != nil {
			c.log.Warn("re-pin: drop fence", "shard", idx, "err", err)
		}
	}
	if err := setShardCount(ctx, c.store, t.Tenant, t.Name, n); err != nil {
		return true, err
	}
	if err := c.store.FinishReshard(ctx, t.Tenant, t.Name, op.OpID); err != nil {
		return true, err
	}
	c.metrics.ReshardInitiated.WithLabelValues(t.Name, t.Tenant).Inc()
	c.metrics.ReshardCompleted.WithLabelValues(t.Name, t.Tenant).Inc()
	epoch := c.runner.mapEpoch(ctx, t.Tenant, t.Name)
	started := Event{Event: EventReshardStarted, Tenant: t.Tenant, Tree: t.Name, Epoch: epoch, Reshard: op.OpID, From: op.From, To: n, Repin: true}
	c.runner.publish(ctx, started)
	completed := started
	completed.Event, completed.Shards = EventReshardCompleted, n
	c.runner.publish(ctx, completed)
	c.log.Info("empty tree re-pinned", "tree", t.Name, "tenant", t.Tenant, "shards", n)
	return true, nil
}

// abandonRepin undoes a re-pin that did not finish: fences dropped, slots
// thawed, intent removed.
func (c *Coordinator) abandonRepin(ctx context.Context, op *shardmap.Reshard) {
	t, err := c.store.Tree(ctx, op.Tenant, op.Tree)
	if err == nil {
		if m, err := c.store.Map(ctx, op.Tenant, op.Tree); err == nil {
			for idx, sh := range m.Shards {
				if err := c.cluster.DropSlotFence(ctx, sh.Node, repinFence(t, op.OpID, idx)); err != nil {
					c.log.Warn("re-pin: drop fence", "shard", idx, "err", err)
				}
			}
		}
		if _, err := c.runner.updateMap(ctx, op.Tenant, op.Tree, func(m *shardmap.Map) (bool, error) {
			if len(m.Frozen) != 1 || m.Frozen[0] != [2]int{0, t.SlotCount - 1} {
				return false, nil
			}
			m.Frozen = nil
			return true, nil
		}); err != nil {
			c.log.Warn("re-pin: thaw", "err", err)
		}
	}
	if err := c.store.FinishReshard(ctx, op.Tenant, op.Tree, op.OpID); err != nil {
		c.log.Warn("re-pin: clear intent", "err", err)
	}
}
