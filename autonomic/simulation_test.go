package autonomic

import (
	"fmt"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// sim is a tree under the policy: passes every tick of a fake clock, and
// each split or fold the policy starts lands (flips) after it has run for
// took, as the migrator's would.
type sim struct {
	t             *testing.T
	clock         *fakeClock
	policy        *Policy
	m             *shardmap.Map
	reg           int
	flying        []*shardmap.Migration
	lands         map[string]time.Time
	from          map[string]int // a split's first moving slot
	splits, folds int
	tick, took    time.Duration
	n             int
}

func newSim(t *testing.T, cfg Config, shards int) *sim {
	c := newClock()
	return &sim{t: t, clock: c, policy: NewPolicy(cfg, c), m: identity(4096, shards), reg: shards,
		lands: map[string]time.Time{}, from: map[string]int{}, tick: 2 * time.Second, took: 10 * time.Second}
}

// run passes for d under the load that writes(now) gives.
func (s *sim) run(d time.Duration, writes func(elapsed time.Duration) []float64) {
	start := s.clock.now
	for s.clock.now.Sub(start) < d {
		s.clock.advance(s.tick)
		s.land()
		dec := s.policy.Decide("t", "tree", View{Map: s.m, Registry: s.reg, Flying: s.flying, Writes: writes(s.clock.now.Sub(start))})
		for _, sp := range dec.Splits {
			mig := &shardmap.Migration{Kind: shardmap.Split, Source: sp.Shard, Target: s.m.HighWater + s.n + 1000, Phase: shardmap.PhaseCopy}
			s.start(mig)
			s.from[mig.ID] = sp.From
			s.splits++
		}
		for _, f := range dec.Folds {
			s.start(&shardmap.Migration{Kind: shardmap.Fold, Source: f.Donor, Target: f.Survivor, Phase: shardmap.PhaseCopy})
			s.folds++
		}
	}
}

func (s *sim) start(mig *shardmap.Migration) {
	s.n++
	mig.ID = fmt.Sprint(s.n)
	s.flying = append(s.flying, mig)
	s.lands[mig.ID] = s.clock.now.Add(s.took)
}

// land flips the migrations whose time has come. A split's target index
// is a placeholder until then (the simulation allocates it at the flip).
func (s *sim) land() {
	var still []*shardmap.Migration
	for _, mig := range s.flying {
		if s.clock.now.Before(s.lands[mig.ID]) {
			still = append(still, mig)
			continue
		}
		if mig.Kind == shardmap.Split {
			applySplit(s.m, mig.Source, s.from[mig.ID])
		} else {
			applyFold(s.m, mig.Source, mig.Target)
		}
	}
	s.flying = still
}

// halves alternates 6,000 writes/s between the lower and the upper half
// of the slots every period.
func halves(period time.Duration) func(time.Duration) []float64 {
	return func(e time.Duration) []float64 {
		if int(e/period)%2 == 0 {
			return spread(4096, 0, 2047, 6000)
		}
		return spread(4096, 2048, 4095, 6000)
	}
}

func silence(time.Duration) []float64 { return make([]float64, 4096) }

// TestNoOscillation: 10 minutes of load that alternates between the two
// halves of the key space every minute splits a bounded number of times
// and folds nothing: the tree is never quiet, so healing waits, and no
// shard split for load is folded back while the load lasts. Once the
// load stops, healing folds back to the registry's count and stops.
func TestNoOscillation(t *testing.T) {
	cfg := Config{SplitWrites: 1000, SplitWindow: 20 * time.Second, HealWindow: 2 * time.Minute}
	s := newSim(t, cfg, 8)
	s.run(10*time.Minute, halves(time.Minute))
	t.Logf("after 10 min of alternating load: %d splits, %d folds, %d shards", s.splits, s.folds, s.m.DistinctShards())
	// Each half needs its 4 shards of 1,500 writes/s split once to bring
	// every shard under 1,000: 8 splits in all, at most.
	if s.splits > 8 || s.folds != 0 {
		t.Fatalf("%d splits and %d folds under alternating load; want at most 8 and none", s.splits, s.folds)
	}
	if s.splits < 8 {
		t.Fatalf("only %d splits: the monitor did not split both halves", s.splits)
	}
	splits := s.splits
	s.run(15*time.Minute, silence)
	t.Logf("after 15 quiet minutes: %d splits, %d folds, %d shards", s.splits, s.folds, s.m.DistinctShards())
	if s.splits != splits || s.m.DistinctShards() != s.reg || s.folds != splits {
		t.Fatalf("quiet tree: %d splits, %d folds, %d shards; want no split, %d folds, back to %d", s.splits-splits, s.folds, s.m.DistinctShards(), splits, s.reg)
	}
	s.run(10*time.Minute, silence)
	if s.folds != splits {
		t.Fatalf("healing went on below the registry's count: %d folds", s.folds)
	}
}

// TestNoOscillationUnderMeanMultiple: the same alternation on a tree hot
// by its proportions (a multiple of the mean, below the absolute
// threshold): splits stop once no shard passes the multiple.
func TestNoOscillationUnderMeanMultiple(t *testing.T) {
	cfg := Config{SplitWrites: 100000, SplitMeanMultiple: 3, SplitFloor: 10, ColdWrites: 10, SplitWindow: 20 * time.Second, HealWindow: 2 * time.Minute}
	s := newSim(t, cfg, 8)
	// One shard's slots take 80% of 800 writes/s, alternating with the
	// slots of another shard.
	a, b := onShard(s.m, 1, 800, 0.8), onShard(s.m, 6, 800, 0.8)
	s.run(10*time.Minute, func(e time.Duration) []float64 {
		if int(e/time.Minute)%2 == 0 {
			return a
		}
		return b
	})
	t.Logf("after 10 min: %d splits, %d folds, %d shards", s.splits, s.folds, s.m.DistinctShards())
	if s.splits == 0 || s.splits > 8 || s.folds != 0 {
		t.Fatalf("%d splits and %d folds; want 1 to 8 splits and no fold", s.splits, s.folds)
	}
}

// TestHealingAfterGrowth: a tree created with 16 shards, grown by the
// monitor to the cap of 64 under a uniform load above the threshold,
// heals back to 16 once quiet, and stops there.
func TestHealingAfterGrowth(t *testing.T) {
	cfg := Config{SplitWrites: 100, MaxShards: 64, SplitWindow: 10 * time.Second, HealWindow: time.Minute}
	s := newSim(t, cfg, 16)
	s.run(10*time.Minute, func(time.Duration) []float64 { return spread(4096, 0, 4095, 64*300) })
	if n := s.m.DistinctShards(); n != 64 || s.folds != 0 {
		t.Fatalf("under load: %d shards, %d folds; want the cap of 64 and none", n, s.folds)
	}
	s.run(30*time.Minute, silence)
	t.Logf("%d splits to the cap, then %d folds to %d shards", s.splits, s.folds, s.m.DistinctShards())
	if n := s.m.DistinctShards(); n != 16 || s.folds != 48 {
		t.Fatalf("quiet: %d shards after %d folds; want 16 after 48", n, s.folds)
	}
	for idx, c := range s.m.SlotCounts() {
		if c != 256 {
			t.Fatalf("shard %d owns %d slots after healing; want the 256 of a 16-shard tree", idx, c)
		}
	}
}
