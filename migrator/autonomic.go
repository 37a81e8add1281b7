package migrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lattice-db/lattice/autonomic"
	"github.com/lattice-db/lattice/shardmap"
)

// AutonomicOptions configure the split monitor and the healer of a proxy
// (docs/DESIGN.md section 6.1). Zero values take the defaults.
type AutonomicOptions struct {
	Tick time.Duration // 5 s between passes
	// Split and Heal are the deployment's switches (--autosplit,
	// --autoheal); a tree's own (lattice_set_tree_option) can only turn
	// them off.
	Split, Heal bool
	Policy      autonomic.Config
	Clock       autonomic.Clock // nil: the wall clock
	// Tenants lists the tenants that have trees.
	Tenants func(ctx context.Context) ([]string, error)
	// Statuses keeps what each tree's monitor and healer do, for every
	// proxy's lattice_reshard_status (nil: not kept).
	Statuses shardmap.AutonomicStatuses
}

// AutonomicMetrics count what the monitor and the healer start.
type AutonomicMetrics struct {
	Splits       *prometheus.CounterVec // tree, tenant
	Folds        *prometheus.CounterVec // tree, tenant
	HotKeyRanges *prometheus.CounterVec // tree, tenant: slots hot alone, once an episode
}

func newAutonomicMetrics(reg prometheus.Registerer) *AutonomicMetrics {
	tt := []string{"tree", "tenant"}
	m := &AutonomicMetrics{
		Splits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_autonomic_splits_total", Help: "Splits the hot-shard split monitor started.",
		}, tt),
		Folds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_autonomic_folds_total", Help: "Folds over-split healing started (committed ones also count on lattice_shard_consolidations_committed_total).",
		}, tt),
		HotKeyRanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_autonomic_hot_key_ranges_total", Help: "Slots found hot alone, which no split can cool (once per episode).",
		}, tt),
	}
	if reg != nil {
		reg.MustRegister(m.Splits, m.Folds, m.HotKeyRanges)
	}
	return m
}

// Autonomic runs the split monitor and the healer over every tree whose
// coordinator lease this proxy holds or can take, with the coordinator's
// split and fold. It runs in a proxy that runs the coordinator, so that a
// reshard asked of a tree whose lease it holds is ticked here too.
type Autonomic struct {
	coord   *Coordinator
	load    autonomic.LoadSource
	policy  *autonomic.Policy
	opts    AutonomicOptions
	metrics *AutonomicMetrics
	log     *slog.Logger

	// held are the leases this monitor took ("tenant/map" -> a tree of the
	// map), given up when Run ends so that a proxy that stops cleanly does
	// not hold its trees' reshards back for a lease.
	mu   sync.Mutex
	held map[string]*shardmap.Tree
}

// NewAutonomic wires the policy to coord and load. reg may be nil.
func NewAutonomic(coord *Coordinator, load autonomic.LoadSource, opts AutonomicOptions, reg prometheus.Registerer) *Autonomic {
	if opts.Tick <= 0 {
		opts.Tick = 5 * time.Second
	}
	cfg := opts.Policy
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = coord.opts.MaxConcurrentMigrations
	}
	return &Autonomic{coord: coord, load: load, policy: autonomic.NewPolicy(cfg, opts.Clock), opts: opts,
		metrics: newAutonomicMetrics(reg), log: coord.log, held: map[string]*shardmap.Tree{}}
}

// Run passes every Tick until ctx ends, then gives its leases up.
func (a *Autonomic) Run(ctx context.Context) {
	t := time.NewTicker(a.opts.Tick)
	defer t.Stop()
	for {
		a.Pass(ctx)
		select {
		case <-ctx.Done():
			a.releaseLeases(context.WithoutCancel(ctx))
			return
		case <-t.C:
		}
	}
}

// releaseLeases gives up the leases of trees no reshard of this process
// runs; the coordinator gives up its own when it completes.
func (a *Autonomic) releaseLeases(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	a.mu.Lock()
	defer a.mu.Unlock()
	for key, t := range a.held {
		if err := a.coord.store.ReleaseLease(ctx, t.Tenant, t.MapName(), a.coord.id); err != nil {
			a.log.Warn("autonomic: release lease", "tree", t.MapName(), "tenant", t.Tenant, "err", err)
		}
		delete(a.held, key)
	}
}

// Pass is one pass over every map of every tenant: a tree alone, or a
// colocation group's members together, since they share one map.
func (a *Autonomic) Pass(ctx context.Context) {
	tenants, err := a.opts.Tenants(ctx)
	if err != nil {
		a.log.Warn("autonomic: list tenants", "err", err)
		return
	}
	seen := map[string]bool{}
	for _, tenant := range tenants {
		trees, err := a.coord.store.Trees(ctx, tenant)
		if err != nil {
			a.log.Warn("autonomic: list trees", "tenant", tenant, "err", err)
			for key, t := range a.heldTrees() {
				seen[key] = seen[key] || t.Tenant == tenant // not known to be gone
			}
			continue
		}
		for _, u := range unitsOf(trees) {
			seen[tenant+"/"+u.name()] = true
			if err := a.passUnit(ctx, u); err != nil && ctx.Err() == nil {
				a.log.Warn("autonomic: pass", "tree", u.name(), "trees", u.names(), "tenant", tenant, "err", err)
			}
		}
	}
	// A dropped tree's lease went with it; its timers go too, so that
	// what the monitor keeps stays bounded by the trees there are.
	a.mu.Lock()
	defer a.mu.Unlock()
	for key, t := range a.held {
		if !seen[key] {
			delete(a.held, key)
			a.policy.Forget(t.Tenant, t.MapName())
		}
	}
}

// unitsOf groups trees by the map they share, members sorted by name and
// units by map name, each led by the tree its map is named after while it
// lives (unitFrom's choice).
func unitsOf(trees []*shardmap.Tree) []unit {
	by := map[string]*unit{}
	var names []string
	for _, t := range trees {
		u := by[t.MapName()]
		if u == nil {
			u = &unit{}
			by[t.MapName()] = u
			names = append(names, t.MapName())
		}
		u.trees = append(u.trees, t)
	}
	slices.Sort(names)
	out := make([]unit, 0, len(names))
	for _, name := range names {
		u := by[name]
		slices.SortFunc(u.trees, func(a, b *shardmap.Tree) int { return strings.Compare(a.Name, b.Name) })
		u.lead = u.trees[0]
		for _, t := range u.trees {
			if t.Name == name {
				u.lead = t
			}
		}
		out = append(out, *u)
	}
	return out
}

// heldTrees is a copy of the leases this monitor took.
func (a *Autonomic) heldTrees() map[string]*shardmap.Tree {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.held)
}

// offReasons say why the monitor and the healer are off for u, "" when
// on. A group's members move together, so one member's option switches
// the mechanism off for the whole group.
func (a *Autonomic) offReasons(u unit) (split, heal string) {
	if !a.opts.Split {
		split = "--autosplit=false"
	}
	if !a.opts.Heal {
		heal = "--autoheal=false"
	}
	for _, t := range u.trees {
		if split == "" && t.AutosplitOff {
			split = fmt.Sprintf("lattice_set_tree_option('%s', 'autosplit', false)", t.Name)
		}
		if heal == "" && t.AutohealOff {
			heal = fmt.Sprintf("lattice_set_tree_option('%s', 'autoheal', false)", t.Name)
		}
	}
	return split, heal
}

// passUnit is one pass over one map: a tree's, or a colocation group's,
// whose members are split and healed together by the migrator's group
// migrations (one migration per shard carries every member table).
func (a *Autonomic) passUnit(ctx context.Context, u unit) error {
	t, name := u.lead, u.name()
	key := t.Tenant + "/" + name
	splitOff, healOff := a.offReasons(u)
	if splitOff != "" && healOff != "" {
		// No lease taken for nothing; one taken before expires.
		a.policy.Forget(t.Tenant, name)
		a.mu.Lock()
		delete(a.held, key)
		a.mu.Unlock()
		return nil
	}
	store := a.coord.store
	ok, err := store.AcquireLease(ctx, t.Tenant, name, a.coord.id, a.coord.opts.LeaseTTL)
	if err != nil || !ok {
		a.policy.Forget(t.Tenant, name) // another proxy's monitor watches it
		a.mu.Lock()
		delete(a.held, key)
		a.mu.Unlock()
		return err
	}
	a.mu.Lock()
	a.held[key] = t
	a.mu.Unlock()
	v := autonomic.View{SplitOff: splitOff, HealOff: healOff}
	for _, m := range u.trees {
		// Members share their reshards, so their counts agree; the
		// largest is the one healing must not go below.
		v.Registry = max(v.Registry, m.ShardCount)
		if v.HealOff == "" && a.coord.interlocks.SnapshotOrMergeRunning(ctx, m.Tenant, m.Name) {
			// As a shrink starts no fold while one runs, nor does healing.
			v.HealOff = fmt.Sprintf("a snapshot of tree %s or a merge into it runs", m.Name)
		}
	}
	switch r, err := store.Reshard(ctx, t.Tenant, name); {
	case errors.Is(err, shardmap.ErrNotFound):
	case err != nil:
		return err
	default:
		v.Intent = intentRunning(r)
	}
	migs, err := store.Migrations(ctx, t.Tenant, name)
	if err != nil {
		return err
	}
	if v.Map, err = store.Map(ctx, t.Tenant, name); err != nil {
		return err
	}
	v.Flying = inFlight(migs)
	for _, mig := range v.Flying {
		// Healing's and the monitor's own migrations resume under the
		// lease like a reshard's (an intent's tick runs the others).
		if mig.Origin != "" && !phaseOperator(mig.Phase) {
			a.coord.ensureRunning(ctx, mig)
		}
	}
	if a.load != nil {
		if v.Writes, err = unitWrites(ctx, a.load, u); err != nil {
			a.log.Warn("autonomic: load data", "tree", name, "tenant", t.Tenant, "err", err)
			v.Writes = nil
		}
	}
	d := a.policy.Decide(t.Tenant, name, v)
	a.act(ctx, t, v, d)
	if a.opts.Statuses != nil {
		st := &shardmap.AutonomicStatus{Monitor: d.Monitor, Healer: d.Healer, Proxy: a.coord.id, At: time.Now().UTC()}
		// Each member's lattice_reshard_status shows its group's. A status
		// outlives a few passes, not the proxy that wrote it.
		for _, m := range u.trees {
			if err := a.opts.Statuses.PutAutonomic(ctx, m.Tenant, m.Name, st, max(3*a.opts.Tick, 15*time.Second)); err != nil {
				return err
			}
		}
	}
	return nil
}

// act starts what d asks for.
func (a *Autonomic) act(ctx context.Context, t *shardmap.Tree, v autonomic.View, d autonomic.Decision) {
	log := a.log.With("tree", t.MapName(), "tenant", t.Tenant)
	for _, h := range d.HotSlots {
		if h.New {
			log.Warn("autonomic: hot key range: one slot carries the load alone, a split cannot spread it",
				"shard", h.Shard, "slot", h.Slot, "writes_per_second", h.Writes, "share", h.Share)
			a.metrics.HotKeyRanges.WithLabelValues(t.MapName(), t.Tenant).Inc()
		}
	}
	var place func(autonomic.Split) string
	if len(d.Splits) > 0 {
		// Placing reads the node registry: only for a pass that splits.
		place = a.placer(ctx, v)
	}
	for _, sp := range d.Splits {
		mig, err := a.coord.runner.startSplit(ctx, t, sp.Shard, splitAt{from: sp.From, node: place(sp), origin: shardmap.OriginAutosplit})
		if err != nil {
			log.Warn("autonomic: split", "shard", sp.Shard, "err", err)
			continue
		}
		log.Info("autonomic: split of a hot shard at its load midpoint", "shard", sp.Shard, "from_slot", sp.From,
			"writes_per_second", sp.Writes, "share", sp.Share, "target", mig.Target, "node", mig.TargetNode, "migration", mig.ID)
		a.metrics.Splits.WithLabelValues(t.MapName(), t.Tenant).Inc()
		a.coord.ensureRunning(ctx, mig)
	}
	for _, f := range d.Folds {
		mig, err := a.coord.runner.startFold(ctx, t, f.Donor, f.Survivor, shardmap.OriginAutoheal)
		if err != nil {
			log.Warn("autonomic: fold", "donor", f.Donor, "survivor", f.Survivor, "err", err)
			continue
		}
		log.Info("autonomic: healing folds a cold pair", "donor", f.Donor, "survivor", f.Survivor,
			"writes_per_second", f.Writes, "migration", mig.ID)
		a.metrics.Folds.WithLabelValues(t.MapName(), t.Tenant).Inc()
		a.coord.ensureRunning(ctx, mig)
	}
}

// placer returns where each split's new shard goes: the active node whose
// shards write least, each split of the pass moving half its source's
// writes there. "" (the node with the fewest bytes of the tree) without
// load or when the nodes are even.
func (a *Autonomic) placer(ctx context.Context, v autonomic.View) func(autonomic.Split) string {
	nodes, err := a.coord.runner.activeNodes(ctx)
	if err != nil || v.Writes == nil {
		return func(autonomic.Split) string { return "" }
	}
	load := map[string]float64{}
	for _, n := range nodes {
		load[n] = 0
	}
	for idx, w := range autonomic.ShardWrites(v.Map, v.Writes) {
		load[v.Map.Shards[idx].Node] += w
	}
	return func(sp autonomic.Split) string {
		best := ""
		for _, n := range nodes {
			if best == "" || load[n] < load[best] {
				best = n
			}
		}
		even := true
		for _, n := range nodes {
			even = even && load[n] == load[best]
		}
		load[best] += sp.Writes / 2
		load[v.Map.Shards[sp.Shard].Node] -= sp.Writes / 2
		if even {
			return ""
		}
		return best
	}
}
