package autonomic

import (
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
