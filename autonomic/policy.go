package autonomic

import (
	"fmt"
	"sync"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// View is what the policy reads of one tree in one pass.
type View struct {
	Map *shardmap.Map
	// Flying are the tree's migrations that are not done.
	Flying []*shardmap.Migration
	// Registry is the registry's shard count: the tree's creation count,
	// or what the last reshard set. Healing never folds below it.
	Registry int
	// Writes are rows written per second per slot; nil without load data.
	Writes []float64
	// Intent names what runs on the tree ("a reshard of t to 32 shards is
	// in progress"), "" when nothing does: while one runs the monitor and
	// the healer start nothing.
	Intent string
	// SplitOff and HealOff say why the monitor or the healer is off for
	// this tree ("" when on).
	SplitOff, HealOff string
}

// Split asks for shard Shard to be split, its slots from From on going to
// the new shard.
type Split struct {
	Shard, From int
	Writes      float64 // the shard's writes per second
	Share       float64 // of the tree's writes
}

// Fold asks for Donor to be folded into the adjacent Survivor.
type Fold struct {
	Donor, Survivor int
	Writes          float64 // of the pair, per second
}

// HotSlot is a slot hot on its own: no split can cool it, so it is
// reported as a hot key range instead.
type HotSlot struct {
	Shard, Slot int
	Writes      float64
	Share       float64 // of the tree's writes
	New         bool    // first pass it is seen hot: log and count it once
}

// Decision is what one pass does for one tree, and why.
type Decision struct {
	Splits   []Split
	Folds    []Fold
	HotSlots []HotSlot
	// Monitor and Healer say what each is doing and why, for
	// lattice_reshard_status and the page.
	Monitor, Healer string
}

// Policy holds each tree's hot and quiet timers between passes. It is
// safe for concurrent use.
type Policy struct {
	cfg   Config
	clock Clock

	mu    sync.Mutex
	trees map[string]*treeState
}

// treeState is what the policy remembers of one tree.
type treeState struct {
	hotSince map[int]time.Time // shard -> first pass it was hot, this episode
	// slots are each shard's slot count at the last pass: a shard a
	// migration changed is watched afresh.
	slots      map[int]int
	hotSlots   map[int]bool // slots reported hot, this episode
	quietSince time.Time    // zero while not quiet and uniform
	lastSplit  time.Time
}

// NewPolicy returns a policy on cfg (defaults filled) and clock.
func NewPolicy(cfg Config, clock Clock) *Policy {
	if clock == nil {
		clock = SystemClock{}
	}
	return &Policy{cfg: cfg.WithDefaults(), clock: clock, trees: map[string]*treeState{}}
}

// Config is the policy's configuration, defaults filled.
func (p *Policy) Config() Config { return p.cfg }

// Forget drops a tree's timers (the tree was dropped, or another proxy
// took its lease).
func (p *Policy) Forget(tenant, tree string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.trees, tenant+"/"+tree)
}

// Decide is one pass over one tree. The caller starts the splits and
// folds it returns; the timers assume it did.
func (p *Policy) Decide(tenant, tree string, v View) Decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := tenant + "/" + tree
	st := p.trees[key]
	if st == nil {
		st = &treeState{hotSince: map[int]time.Time{}, slots: map[int]int{}, hotSlots: map[int]bool{}}
		p.trees[key] = st
	}
	now := p.clock.Now()
	counts := v.Map.SlotCounts()
	for idx, n := range counts {
		if st.slots[idx] != n {
			delete(st.hotSince, idx)
		}
		st.slots[idx] = n
	}
	for idx := range st.slots {
		if _, ok := counts[idx]; !ok {
			delete(st.slots, idx)
			delete(st.hotSince, idx)
		}
	}
	var d Decision
	p.monitor(st, v, counts, now, &d)
	if len(d.Splits) > 0 {
		// A split means load: the healer's quiet window starts over, and
		// the split shards are watched afresh once the split is done.
		st.lastSplit, st.quietSince = now, time.Time{}
		d.Healer = "idle: the monitor is splitting"
		return d
	}
	p.heal(st, v, counts, now, &d)
	return d
}

// load is a tree's write rates in one pass.
type load struct {
	shard        map[int]float64
	total, mean  float64
	hottest      int // the owning shard writing most
	owning, busy map[int]bool
}

func newLoad(v View, counts map[int]int) load {
	l := load{shard: ShardWrites(v.Map, v.Writes), hottest: -1, owning: map[int]bool{}, busy: map[int]bool{}}
	for idx := range counts {
		l.owning[idx] = true
		l.total += l.shard[idx]
		if l.hottest < 0 || l.shard[idx] > l.shard[l.hottest] || l.shard[idx] == l.shard[l.hottest] && idx < l.hottest {
			l.hottest = idx
		}
	}
	if len(counts) > 0 {
		l.mean = l.total / float64(len(counts))
	}
	for _, m := range v.Flying {
		l.busy[m.Source], l.busy[m.Target] = true, true
	}
	return l
}

// share is w as a part of the tree's writes.
func (l load) share(w float64) float64 {
	if l.total <= 0 {
		return 0
	}
	return w / l.total
}

// unflipped counts migrations of kind whose flip is still ahead.
func unflipped(migs []*shardmap.Migration, kind shardmap.MigrationKind) int {
	n := 0
	for _, m := range migs {
		if m.Kind == kind && !flipped(m.Phase) {
			n++
		}
	}
	return n
}

func flipped(p shardmap.MigrationPhase) bool {
	switch p {
	case shardmap.PhaseFlip, shardmap.PhaseVerifyFailed, shardmap.PhaseRelease, shardmap.PhaseDone:
		return true
	}
	return false
}

func pct(x float64) string { return fmt.Sprintf("%.0f%%", 100*x) }

func rate(x float64) string { return fmt.Sprintf("%.1f writes/s", x) }
