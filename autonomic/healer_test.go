package autonomic

import (
	"cmp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

func TestHealer(t *testing.T) {
	cfg := Config{SplitWrites: 1000, HealWindow: time.Minute, MaxConcurrent: 4}
	sixteen := identity(4096, 16)
	quiet := spread(4096, 0, 4095, 16) // 1 write/s a shard
	fold := []*shardmap.Migration{{ID: "f", Kind: shardmap.Fold, Source: 0, Target: 1, Phase: shardmap.PhaseCopy, Origin: "autoheal"}}
	split := []*shardmap.Migration{{ID: "s", Kind: shardmap.Split, Source: 0, Target: 16, Phase: shardmap.PhaseCopy}}
	notUniform := spread(4096, 0, 4095, 16)
	notUniform[0] = 30
	cases := []struct {
		name   string
		view   View
		passes int
		folds  int // in the last pass
		says   string
	}{
		{"quiet and uniform for the window: folds of cold pairs, as many as the concurrency allows",
			View{Map: sixteen, Registry: 4, Writes: quiet}, 7, 4, "fold of shard"},
		{"never below the registry's count", View{Map: sixteen, Registry: 14, Writes: quiet}, 7, 2, "fold of shard"},
		{"at the registry's count nothing folds", View{Map: sixteen, Registry: 16, Writes: quiet}, 7, 0,
			"idle: 16 shards, the registry's count"},
		{"a fold in flight counts toward the registry's count", View{Map: sixteen, Registry: 15, Writes: quiet, Flying: fold}, 7, 0,
			"folding: 1 folds in flight, down to the registry's 15 shards"},
		{"not before the window", View{Map: sixteen, Registry: 4, Writes: quiet}, 6, 0, "waiting: quiet and uniform for 50s of 1m0s"},
		{"not quiet", View{Map: sixteen, Registry: 4, Writes: spread(4096, 0, 4095, 16*500)}, 7, 0, "idle: not quiet"},
		{"not uniform", View{Map: sixteen, Registry: 4, Writes: notUniform}, 7, 0, "idle: load not uniform"},
		{"no fold while a reshard runs", View{Map: sixteen, Registry: 4, Writes: quiet, Intent: "a reshard of tree to 8 shards is in progress"}, 7, 0,
			"idle while a reshard of tree to 8 shards is in progress; no fold starts"},
		{"not while a split is in flight", View{Map: sixteen, Registry: 4, Writes: quiet, Flying: split}, 7, 0, "waiting: 1 splits in flight"},
		{"off for the tree", View{Map: sixteen, Registry: 4, Writes: quiet, HealOff: "--autoheal=false"}, 7, 0, "off: --autoheal=false"},
		{"no load data", View{Map: sixteen, Registry: 4}, 7, 0, "idle: no load data yet"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := newClock()
			p := NewPolicy(cfg, clock)
			d, _ := passes(p, clock, c.view, c.passes)
			if len(d.Folds) != c.folds {
				t.Fatalf("folds %+v, want %d (healer: %s)", d.Folds, c.folds, d.Healer)
			}
			seen := map[int]bool{}
			for _, f := range d.Folds {
				if seen[f.Donor] || seen[f.Survivor] {
					t.Fatalf("pairs overlap: %+v", d.Folds)
				}
				seen[f.Donor], seen[f.Survivor] = true, true
				a, b := c.view.Map.SlotRanges(f.Donor), c.view.Map.SlotRanges(f.Survivor)
				if a[0][1]+1 != b[0][0] && b[0][1]+1 != a[0][0] {
					t.Fatalf("fold of shards %d and %d, which are not adjacent", f.Donor, f.Survivor)
				}
			}
			if !strings.Contains(d.Healer, c.says) {
				t.Fatalf("healer says %q, want %q in it", d.Healer, c.says)
			}
		})
	}
}

// A reshard resets the quiet window: after it ends the healer waits the
// whole window again, and a split starts it over too.
func TestHealerWindowStartsOver(t *testing.T) {
	clock := newClock()
	p := NewPolicy(Config{SplitWrites: 1000, HealWindow: time.Minute}, clock)
	m := identity(4096, 16)
	v := View{Map: m, Registry: 4, Writes: spread(4096, 0, 4095, 16)}
	passes(p, clock, v, 5) // 40 s quiet
	busy := v
	busy.Intent = "a reshard of tree to 8 shards is in progress"
	passes(p, clock, busy, 2)
	if d, _ := passes(p, clock, v, 6); len(d.Folds) != 0 {
		t.Fatalf("folded %d s after the reshard", 50)
	}
	if d, _ := passes(p, clock, v, 2); len(d.Folds) == 0 {
		t.Fatalf("no fold a window after the reshard: %s", d.Healer)
	}
}

// A tree split in halves folds its halves back together: of the pairs a
// pass may fold it takes as many as there are, and of those choices the
// one that leaves the shards most even, not the coldest first, which here
// would fold shards 1 and 2 and strand shard 0 (one run of
// TestAutonomicHealing ended with 1538, 1021, 998 and 539 slots).
func TestHealerFoldsHalvesBack(t *testing.T) {
	cases := []struct {
		name  string
		slots []int // each shard's slots, in slot order
		max   int   // MaxConcurrent
		want  [][2]int
	}{
		{"halves of four shards, all at once", []int{500, 524, 530, 494, 512, 512, 490, 534}, 4,
			[][2]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
		{"two at a time: the smallest pairs", []int{500, 524, 530, 494, 400, 400, 714, 534}, 2,
			[][2]int{{2, 3}, {4, 5}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := identity(4096, len(c.slots))
			slot := 0
			for idx, n := range c.slots {
				for range n {
					m.Slots[slot] = idx
					slot++
				}
			}
			w := spread(4096, 0, 4095, 4) // half a write a second a shard
			for s := c.slots[0]; s < c.slots[0]+c.slots[1]+c.slots[2]; s++ {
				w[s] = 0 // shards 1 and 2: the coldest pair
			}
			clock := newClock()
			p := NewPolicy(Config{SplitWrites: 1000, HealWindow: time.Minute, MaxConcurrent: c.max}, clock)
			d, _ := passes(p, clock, View{Map: m, Registry: 4, Writes: w}, 7)
			var got [][2]int
			for _, f := range d.Folds {
				got = append(got, [2]int{min(f.Donor, f.Survivor), max(f.Donor, f.Survivor)})
			}
			slices.SortFunc(got, func(a, b [2]int) int { return cmp.Compare(a[0], b[0]) })
			if !slices.Equal(got, c.want) {
				t.Fatalf("folds %v, want %v (healer: %s)", got, c.want, d.Healer)
			}
		})
	}
}
