package autonomic

import (
	"strings"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// passes runs n passes of v, every 10 s of the fake clock, and returns the
// last decision and the splits of all of them.
func passes(p *Policy, c *fakeClock, v View, n int) (Decision, []Split) {
	var d Decision
	var all []Split
	for i := 0; i < n; i++ {
		if i > 0 {
			c.advance(10 * time.Second)
		}
		d = p.Decide("t", "tree", v)
		all = append(all, d.Splits...)
	}
	return d, all
}

func TestMonitor(t *testing.T) {
	cfg := Config{SplitWrites: 1000, SplitMeanMultiple: 4, SplitWindow: 30 * time.Second, MaxShards: 256, MaxConcurrent: 4}
	eight := identity(4096, 8) // 512 slots a shard
	skew := onShard(eight, 3, 800, 0.8)
	oneSlot := make([]float64, 4096)
	oneSlot[1700] = 5000
	busy := []*shardmap.Migration{{ID: "m", Kind: shardmap.Split, Source: 3, Target: 8, Phase: shardmap.PhaseCopy}}
	cases := []struct {
		name   string
		cfg    Config
		view   View
		passes int
		splits []Split // of every pass
		hot    []int   // hot slots of the last pass
		says   string  // in the last pass's Monitor
	}{
		{name: "a shard hot by the mean for the window is split at its load midpoint",
			view: View{Map: eight, Registry: 8, Writes: skew}, passes: 4,
			splits: []Split{{Shard: 3, From: 1792, Writes: 640, Share: 0.8}},
			says:   "split of shard 3 at slot 1792: 80% of the tree's writes"},
		{name: "not for less than the window",
			view: View{Map: eight, Registry: 8, Writes: skew}, passes: 3,
			says: "watching: shard 3 hot for 20s of 30s"},
		{name: "a busy tree splits by the absolute threshold, as many as the concurrency allows",
			view: View{Map: eight, Registry: 8, Writes: spread(4096, 0, 4095, 8*1500)}, passes: 4,
			splits: []Split{{0, 256, 1500, 0.125}, {1, 768, 1500, 0.125}, {2, 1280, 1500, 0.125}, {3, 1792, 1500, 0.125}}},
		{name: "an idle tree does not split for its proportions",
			view: View{Map: eight, Registry: 8, Writes: onShard(eight, 3, 50, 0.8)}, passes: 10,
			says: "watching: no shard is hot (hottest shard 3: 80% of the tree's writes, 40.0 writes/s)"},
		{name: "one slot hot alone is a hot key range, not a split",
			view: View{Map: eight, Registry: 8, Writes: oneSlot}, passes: 6, hot: []int{1700},
			says: "hot key range: slot 1700 of shard 3 carries 100% of the tree's writes alone"},
		{name: "the cap stops autonomic growth",
			cfg:  Config{SplitWrites: 1000, SplitMeanMultiple: 4, SplitWindow: 30 * time.Second, MaxShards: 8},
			view: View{Map: eight, Registry: 8, Writes: skew}, passes: 6,
			says: "capped: 8 shards, at --max-physical-shards-per-tree 8"},
		{name: "nothing while a reshard runs",
			view: View{Map: eight, Registry: 8, Writes: skew, Intent: "a reshard of tree to 16 shards is in progress"}, passes: 6,
			says: "idle while a reshard of tree to 16 shards is in progress; no split starts"},
		{name: "off for the tree",
			view: View{Map: eight, Registry: 8, Writes: skew, SplitOff: "lattice_set_tree_option(tree, 'autosplit', false)"}, passes: 6,
			says: "off: lattice_set_tree_option"},
		{name: "no load data",
			view: View{Map: eight, Registry: 8}, passes: 6, says: "idle: no load data yet"},
		{name: "a shard in a migration waits for it",
			view: View{Map: eight, Registry: 8, Writes: skew, Flying: busy}, passes: 6,
			says: "waiting: hot shard 3 is part of a migration in flight"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cf := c.cfg
			if cf == (Config{}) {
				cf = cfg
			}
			clock := newClock()
			p := NewPolicy(cf, clock)
			d, splits := passes(p, clock, c.view, c.passes)
			if len(splits) != len(c.splits) {
				t.Fatalf("splits %+v, want %+v (monitor: %s)", splits, c.splits, d.Monitor)
			}
			for i := range splits {
				got, want := splits[i], c.splits[i]
				if got.Shard != want.Shard || got.From != want.From || !near(got.Writes, want.Writes) || !near(got.Share, want.Share) {
					t.Fatalf("split %d: %+v, want %+v", i, splits[i], c.splits[i])
				}
			}
			var hot []int
			for _, h := range d.HotSlots {
				hot = append(hot, h.Slot)
			}
			if len(hot) != len(c.hot) || len(hot) > 0 && hot[0] != c.hot[0] {
				t.Fatalf("hot slots %v, want %v", hot, c.hot)
			}
			if !strings.Contains(d.Monitor, c.says) {
				t.Fatalf("monitor says %q, want %q in it", d.Monitor, c.says)
			}
		})
	}
}

// After a split the monitor waits a window before the next, and a hot
// key range is new (logged, counted) once per episode.
func TestMonitorCoolsDownAndReportsOnce(t *testing.T) {
	clock := newClock()
	p := NewPolicy(Config{SplitWrites: 100, SplitWindow: 30 * time.Second, MaxConcurrent: 1}, clock)
	m := identity(4096, 8)
	// Shards 3 and 5 are both hot; one split at a time.
	w := onShard(m, 3, 1000, 0.6)
	for s := 2560; s < 3072; s++ {
		w[s] = 400.0 / 512
	}
	_, splits := passes(p, clock, View{Map: m, Registry: 8, Writes: w}, 4)
	if len(splits) != 1 || splits[0].Shard != 3 {
		t.Fatalf("splits %+v", splits)
	}
	// The split lands; shard 5 has stayed hot.
	m2 := m.Clone()
	applySplit(m2, 3, 1792)
	v2 := View{Map: m2, Registry: 8, Writes: w}
	d, splits := passes(p, clock, v2, 3)
	if len(splits) != 0 || !strings.Contains(d.Monitor, "cooling down") {
		t.Fatalf("split during the cool-down: %+v, %s", splits, d.Monitor)
	}
	if _, splits = passes(p, clock, v2, 2); len(splits) != 1 || splits[0].Shard != 5 {
		t.Fatalf("after the cool-down: %+v", splits)
	}

	p = NewPolicy(Config{SplitWrites: 1000, SplitWindow: 30 * time.Second}, clock)

	w = make([]float64, 4096)
	w[100] = 3000
	hot := View{Map: m2, Registry: 8, Writes: w}
	news := 0
	for i := 0; i < 10; i++ {
		clock.advance(10 * time.Second)
		for _, h := range p.Decide("t", "tree", hot).HotSlots {
			if h.New {
				news++
			}
		}
	}
	if news != 1 {
		t.Fatalf("hot slot reported new %d times, want once", news)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
