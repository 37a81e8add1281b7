package migrator

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lattice-db/lattice/autonomic"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// fakeLoad is a LoadSource whose rates the test sets.
type fakeLoad struct {
	mu     sync.Mutex
	writes []float64
	reads  int
}

func (f *fakeLoad) SlotWrites(context.Context, string, string) ([]float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return f.writes, nil
}

func (f *fakeLoad) set(w []float64) {
	f.mu.Lock()
	f.writes = w
	f.mu.Unlock()
}

// testClock is a clock the test moves.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// autoRig is the test rig's tree under a coordinator and an autonomic
// monitor and healer on a fake clock and fake load: a window is one
// advance of the clock.
type autoRig struct {
	*testRig
	coord *Coordinator
	auto  *Autonomic
	load  *fakeLoad
	clock *testClock
}

func newAutoRig(t *testing.T) *autoRig {
	r := newRig(t)
	coord := NewCoordinator("c1", r.runner(""), CoordinatorOptions{Tick: time.Hour}, nil)
	load := &fakeLoad{}
	clock := &testClock{now: time.Unix(0, 0)}
	auto := NewAutonomic(coord, load, AutonomicOptions{Split: true, Heal: true, Clock: clock,
		Policy:   autonomic.Config{SplitWrites: 1000, SplitWindow: time.Minute, HealWindow: time.Minute},
		Tenants:  func(context.Context) ([]string, error) { return []string{"app"}, nil },
		Statuses: r.store.Store.(*shardmap.RedisStore)}, nil)
	t.Cleanup(coord.wg.Wait)
	return &autoRig{testRig: r, coord: coord, auto: auto, load: load, clock: clock}
}

// pass runs one pass a window after the last and waits for the
// migrations it started.
func (a *autoRig) pass() {
	a.clock.advance(time.Minute)
	a.auto.Pass(a.ctx)
	a.coord.wg.Wait()
}

func (a *autoRig) status() *shardmap.AutonomicStatus {
	st, err := a.store.Store.(*shardmap.RedisStore).Autonomic(a.ctx, "app", "items")
	if err != nil || st == nil {
		a.t.Fatalf("status: %v, %v", st, err)
	}
	return st
}

// hotOn puts 3000 writes/s on slots lo..hi and none elsewhere.
func hotOn(lo, hi int) []float64 {
	w := make([]float64, rigSlots)
	for s := lo; s <= hi; s++ {
		w[s] = 3000 / float64(hi-lo+1)
	}
	return w
}

// TestAutonomicSplitsAtLoadMidpoint: shard 1 (slots 16..31) writes all of
// its load on slots 24..31; the monitor splits it at slot 28, the middle
// of its load and not of its slots, through the migrator, as an autosplit
// migration; then no shard is hot and it stops.
func TestAutonomicSplitsAtLoadMidpoint(t *testing.T) {
	a := newAutoRig(t)
	a.load.set(hotOn(24, 31))
	a.pass() // shard 1 hot since now
	a.pass() // hot for the window: split
	m := a.mapNow()
	if got := m.SlotRanges(1); len(got) != 1 || got[0] != [2]int{16, 27} {
		t.Fatalf("shard 1 owns %v after the split; want 16..27", got)
	}
	if got := m.SlotRanges(4); len(got) != 1 || got[0] != [2]int{28, 31} {
		t.Fatalf("new shard owns %v; want 28..31", got)
	}
	migs := a.store.started()
	if len(migs) != 1 || migs[0].Origin != shardmap.OriginAutosplit || migs[0].Phase != shardmap.PhaseDone {
		t.Fatalf("migrations %+v", migs)
	}
	if !strings.Contains(a.status().Monitor, "split of shard 1 at slot 28: 100% of the tree's writes") {
		t.Fatalf("status %+v", a.status())
	}
	if got := testutil.ToFloat64(a.auto.metrics.Splits.WithLabelValues("items", "app")); got != 1 {
		t.Fatalf("splits counted %v", got)
	}
	// Shards 1 and 4 now write 1500/s each: still above 1000, so both
	// split again once the window has passed, then the tree is cool.
	for i := 0; i < 6; i++ {
		a.pass()
	}
	if n := a.mapNow().DistinctShards(); n != 7 {
		t.Fatalf("%d shards; want 7 (4, one split, then two more)", n)
	}
	if !strings.Contains(a.status().Monitor, "watching: no shard is hot") {
		t.Fatalf("status %+v", a.status())
	}
}

// TestAutonomicPlacesSplitsByLoad: the new shard of the monitor's split
// goes on the active node whose shards write least. With no load the
// nodes tie on bytes and slots, and placement by size alone would take n1
// both times.
func TestAutonomicPlacesSplitsByLoad(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lo, hi int // the hot slots
		node   string
	}{
		{"hot shard 0, on n1: the new shard on n2", 8, 15, "n2"},
		{"hot shard 1, on n2: the new shard on n1", 24, 31, "n1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAutoRig(t)
			a.load.set(hotOn(tc.lo, tc.hi))
			a.pass()
			a.pass()
			migs := a.store.started()
			if len(migs) != 1 || migs[0].TargetNode != tc.node {
				t.Fatalf("migrations %+v; want one split onto %s", migs, tc.node)
			}
		})
	}
}

// TestAutonomicHotSlot: all the load on one slot is a hot key range,
// reported once and never split.
func TestAutonomicHotSlot(t *testing.T) {
	a := newAutoRig(t)
	a.load.set(hotOn(20, 20))
	for i := 0; i < 4; i++ {
		a.pass()
	}
	if n := a.mapNow().DistinctShards(); n != 4 {
		t.Fatalf("%d shards: the monitor split for a single slot", n)
	}
	if got := testutil.ToFloat64(a.auto.metrics.HotKeyRanges.WithLabelValues("items", "app")); got != 1 {
		t.Fatalf("hot key ranges counted %v, want 1", got)
	}
	if !strings.Contains(a.status().Monitor, "hot key range: slot 20 of shard 1") {
		t.Fatalf("status %+v", a.status())
	}
}

// TestAutonomicIdleWhileReshardRuns: with a reshard's intent stored, the
// monitor starts no split and the healer no fold.
func TestAutonomicIdleWhileReshardRuns(t *testing.T) {
	for _, tc := range []struct {
		name  string
		load  []float64
		grow  bool
		saysM string
		saysH string
	}{
		{"monitor", hotOn(24, 31), true, "idle while a reshard of items to 6 shards is in progress; no split starts", ""},
		{"healer", make([]float64, rigSlots), false, "", "idle while a reshard of items to 3 shards is in progress; no fold starts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAutoRig(t)
			a.load.set(tc.load)
			target := 3
			if tc.grow {
				target = 6
			}
			if tc.name == "healer" {
				// Grown to 6 by the monitor's splits, so that healing has
				// room above the registry's 4.
				a.growTo(6)
			}
			op := &shardmap.Reshard{OpID: "op", Tenant: "app", Tree: "items", Target: target, Grow: tc.grow, Phase: ReshardMigrating, Started: time.Now()}
			if _, err := a.store.StartReshard(a.ctx, op); err != nil {
				t.Fatal(err)
			}
			before := a.mapNow().DistinctShards()
			for i := 0; i < 4; i++ {
				a.pass()
			}
			for _, m := range a.store.started() {
				if m.Created.After(op.Started) {
					t.Fatalf("%s started during the reshard: %+v", m.Kind, m)
				}
			}
			if n := a.mapNow().DistinctShards(); n != before {
				t.Fatalf("%d shards, %d before", n, before)
			}
			st := a.status()
			if !strings.Contains(st.Monitor, tc.saysM) || !strings.Contains(st.Healer, tc.saysH) {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

// growTo splits the tree, as the monitor's splits would (the registry
// keeps its count), until it has n shards.
func (a *autoRig) growTo(n int) {
	for a.mapNow().DistinctShards() < n {
		counts := a.mapNow().SlotCounts()
		src := 0
		for idx, c := range counts {
			if c > counts[src] || c == counts[src] && idx < src {
				src = idx
			}
		}
		mig, err := a.coord.runner.startSplit(a.ctx, a.tree, src, splitAt{from: -1, origin: shardmap.OriginAutosplit})
		if err != nil {
			a.t.Fatal(err)
		}
		if err := a.coord.runner.Run(a.ctx, mig); err != nil {
			a.t.Fatal(err)
		}
	}
}

// TestAutonomicHealsToRegistryCount: a quiet, uniform tree grown from 4
// to 8 heals back to 4 and stops there; each fold counts on
// lattice_shard_consolidations_committed_total with its donor.
func TestAutonomicHealsToRegistryCount(t *testing.T) {
	a := newAutoRig(t)
	a.growTo(8)
	a.load.set(make([]float64, rigSlots))
	for i := 0; i < 8; i++ {
		a.pass()
	}
	m := a.mapNow()
	if n := m.DistinctShards(); n != 4 {
		t.Fatalf("%d shards after healing; want the registry's 4", n)
	}
	migs := a.store.started()
	folds := 0
	for _, mig := range migs {
		if mig.Kind != shardmap.Fold {
			continue
		}
		folds++
		if mig.Origin != shardmap.OriginAutoheal {
			t.Fatalf("fold %+v is not healing's", mig)
		}
		if got := testutil.ToFloat64(a.coord.metrics.ConsolidationsCommitted.WithLabelValues("items", "app", strconv.Itoa(mig.Source))); got != 1 {
			t.Fatalf("consolidations of donor %d: %v", mig.Source, got)
		}
	}
	if folds != 4 {
		t.Fatalf("%d folds; want 4", folds)
	}
	if !strings.Contains(a.status().Healer, "idle: 4 shards, the registry's count") {
		t.Fatalf("status %+v", a.status())
	}
}

// TestShrinkWaitsForHealing: a shrink plans nothing while a fold healing
// started is in flight, and plans once it has finished.
func TestShrinkWaitsForHealing(t *testing.T) {
	r := newRig(t)
	run := r.runner("")
	c := NewCoordinator("c1", run, CoordinatorOptions{Tick: time.Hour}, nil)
	heal, err := run.startFold(r.ctx, r.tree, 1, 0, shardmap.OriginAutoheal)
	if err != nil {
		t.Fatal(err)
	}
	op := &shardmap.Reshard{OpID: "op", Tenant: "app", Tree: "items", Target: 2, Phase: ReshardMigrating, Started: time.Now()}
	if _, err := r.store.StartReshard(r.ctx, op); err != nil {
		t.Fatal(err)
	}
	// The tick takes healing's fold over (it runs under the lease), and
	// plans no fold of its own while it runs.
	if err := c.Tick(r.ctx, "app", "items"); err != nil {
		t.Fatal(err)
	}
	migs := r.store.started()
	if len(migs) != 1 || migs[0].ID != heal.ID {
		t.Fatalf("the shrink planned beside healing's fold: %+v", migs)
	}
	c.wg.Wait()
	if err := c.Tick(r.ctx, "app", "items"); err != nil {
		t.Fatal(err)
	}
	c.wg.Wait()
	migs = r.store.started()
	if len(migs) != 2 {
		t.Fatalf("after healing's fold the shrink planned %d folds; want 1 more", len(migs)-1)
	}
}

// TestGrowSplitsHottestFirst: with load data a grow splits the hottest
// shard first, at its load midpoint; without, the largest owner at half
// its slots.
func TestGrowSplitsHottestFirst(t *testing.T) {
	for _, tc := range []struct {
		name   string
		load   []float64
		source int
		slots  [2]int
	}{
		{"load", hotOn(52, 63), 3, [2]int{58, 63}},
		{"no load", nil, 0, [2]int{8, 15}},
		{"no writes", make([]float64, rigSlots), 0, [2]int{8, 15}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			c := NewCoordinator("c1", r.runner(""), CoordinatorOptions{Tick: time.Hour, MaxConcurrentMigrations: 1}, nil)
			c.SetLoad(&fakeLoad{writes: tc.load})
			if _, err := r.store.StartReshard(r.ctx, &shardmap.Reshard{OpID: "op", Tenant: "app", Tree: "items", Target: 5, Grow: true, Phase: ReshardMigrating, Started: time.Now()}); err != nil {
				t.Fatal(err)
			}
			if err := c.Tick(r.ctx, "app", "items"); err != nil {
				t.Fatal(err)
			}
			c.wg.Wait()
			migs := r.store.started()
			if len(migs) != 1 || migs[0].Source != tc.source || len(migs[0].Slots) != 1 || migs[0].Slots[0] != tc.slots {
				t.Fatalf("grow split %+v; want shard %d, slots %v", migs[0], tc.source, tc.slots)
			}
		})
	}
}

// TestGrowReadsLoadOncePerSecond: the ticks of a grow within writesFresh
// plan with the writes the first one read.
func TestGrowReadsLoadOncePerSecond(t *testing.T) {
	r := newRig(t)
	c := NewCoordinator("c1", r.runner(""), CoordinatorOptions{Tick: time.Hour}, nil)
	load := &fakeLoad{writes: hotOn(52, 63)}
	c.SetLoad(load)
	u, err := c.runner.unitOf(r.ctx, "app", "items")
	if err != nil {
		t.Fatal(err)
	}
	first := c.slotWrites(r.ctx, u)
	load.set(hotOn(0, 7))
	if got := c.slotWrites(r.ctx, u); load.reads != 1 || !slices.Equal(got, first) {
		t.Fatalf("a second tick at once read the load again (%d reads)", load.reads)
	}
	c.seen["app/items"] = seenWrites{at: time.Now().Add(-writesFresh), w: first}
	c.seen["app/dropped"] = seenWrites{at: time.Now().Add(-writesFresh)}
	if got := c.slotWrites(r.ctx, u); load.reads != 2 || slices.Equal(got, first) {
		t.Fatalf("a tick after writesFresh planned with the old writes (%d reads)", load.reads)
	}
	if _, ok := c.seen["app/dropped"]; ok {
		t.Fatal("the writes of a tree no longer ticked were kept")
	}
}

// TestSetTreeOption: lattice_set_tree_option turns the monitor off for
// the tree (stored in its registry entry), and lattice_reshard_status says
// so; an unknown option is refused with a hint.
func TestSetTreeOption(t *testing.T) {
	a := newAutoRig(t)
	f := &Functions{store: a.store.Store, coord: a.coord}
	rows, err := f.Call(a.ctx, "app", "lattice_set_tree_option", []*string{ptr("items"), ptr("autosplit"), ptr("false")}, nil)
	if err != nil || rows[0][0] != "autosplit of items is off" {
		t.Fatalf("set option: %v, %v", rows, err)
	}
	if tr, _ := a.store.Tree(a.ctx, "app", "items"); !tr.AutosplitOff || tr.AutohealOff {
		t.Fatalf("registry entry %+v", tr)
	}
	a.load.set(hotOn(24, 31))
	for i := 0; i < 3; i++ {
		a.pass()
	}
	if n := a.mapNow().DistinctShards(); n != 4 {
		t.Fatalf("%d shards with autosplit off", n)
	}
	st, err := f.ReshardStatus(a.ctx, "app", "items")
	if err != nil || !strings.Contains(st.Autonomic, "monitor off: lattice_set_tree_option('items', 'autosplit', false)") {
		t.Fatalf("status %+v, %v", st, err)
	}
	if _, err := f.Call(a.ctx, "app", "lattice_set_tree_option", []*string{ptr("items"), ptr("autosplit"), ptr("true")}, nil); err != nil {
		t.Fatal(err)
	}
	a.pass()
	a.pass()
	if n := a.mapNow().DistinctShards(); n != 5 {
		t.Fatalf("%d shards once autosplit is on again; want 5", n)
	}
	_, err = f.Call(a.ctx, "app", "lattice_set_tree_option", []*string{ptr("items"), ptr("autoscale"), ptr("true")}, nil)
	if e := sqlstate.As(err); err == nil || e.Code != sqlstate.InvalidParameterValue || e.Hint == "" {
		t.Fatalf("unknown option: %v", err)
	}
}

// TestAutonomicSwitches: each mechanism is switched off for the deployment
// (--autosplit, --autoheal) or for one tree (lattice_set_tree_option), and
// then does nothing, its status says which switch, while the other one
// goes on.
func TestAutonomicSwitches(t *testing.T) {
	for _, tc := range []struct {
		name   string
		off    func(a *autoRig, f *Functions)
		heal   bool // a quiet tree over-split to 6, else a hot shard
		shards int  // after the passes
		says   string
	}{
		{"--autosplit=false", func(a *autoRig, _ *Functions) { a.auto.opts.Split = false }, false, 4,
			"monitor off: --autosplit=false; healing idle: 4 shards"},
		{"--autoheal=false", func(a *autoRig, _ *Functions) { a.auto.opts.Heal = false }, true, 6,
			"monitor watching: no shard is hot; healing off: --autoheal=false"},
		{"autosplit off for the tree", func(a *autoRig, f *Functions) { a.setOption(f, "autosplit") }, false, 4,
			"monitor off: lattice_set_tree_option('items', 'autosplit', false)"},
		{"autoheal off for the tree", func(a *autoRig, f *Functions) { a.setOption(f, "autoheal") }, true, 6,
			"healing off: lattice_set_tree_option('items', 'autoheal', false)"},
		{"--autoheal=false, autosplit on", func(a *autoRig, _ *Functions) { a.auto.opts.Heal = false }, false, 7,
			"healing off: --autoheal=false"},
		{"--autosplit=false, autoheal on", func(a *autoRig, _ *Functions) { a.auto.opts.Split = false }, true, 4,
			"monitor off: --autosplit=false; healing idle: 4 shards"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAutoRig(t)
			f := &Functions{store: a.store.Store, coord: a.coord}
			if tc.heal {
				a.growTo(6)
				a.load.set(make([]float64, rigSlots))
			} else {
				a.load.set(hotOn(24, 31))
			}
			tc.off(a, f)
			for range 8 {
				a.pass()
			}
			if n := a.mapNow().DistinctShards(); n != tc.shards {
				t.Fatalf("%d shards, want %d", n, tc.shards)
			}
			st, err := f.ReshardStatus(a.ctx, "app", "items")
			if err != nil || !strings.Contains(st.Autonomic, tc.says) {
				t.Fatalf("status %q, %v; want %q in it", st.Autonomic, err, tc.says)
			}
		})
	}
}

// setOption turns option off for the rig's tree.
func (a *autoRig) setOption(f *Functions, option string) {
	a.t.Helper()
	if _, err := f.Call(a.ctx, "app", "lattice_set_tree_option", []*string{ptr("items"), ptr(option), ptr("false")}, nil); err != nil {
		a.t.Fatal(err)
	}
}

// TestAutonomicForgetsDroppedTrees: the leases and timers the monitor
// keeps go with a dropped tree.
func TestAutonomicForgetsDroppedTrees(t *testing.T) {
	a := newAutoRig(t)
	a.load.set(hotOn(24, 31))
	a.pass()
	if len(a.auto.heldTrees()) != 1 {
		t.Fatalf("held %v after a pass", a.auto.heldTrees())
	}
	if err := a.store.DeleteTree(a.ctx, "app", "items"); err != nil {
		t.Fatal(err)
	}
	a.pass()
	if held := a.auto.heldTrees(); len(held) != 0 {
		t.Fatalf("held %v after the tree was dropped", held)
	}
}

// TestAutonomicGroup: a colocation group's members share one map, so the
// monitor splits and healing folds the group as one, with group
// migrations recorded under the group's name that make and drop the table
// of every member; the load is summed over the members, every member's
// status shows the group's, and one member's option turns the monitor off
// for the whole group.
func TestAutonomicGroup(t *testing.T) {
	t.Run("split", func(t *testing.T) {
		a := newAutoRig(t)
		a.join("extras")
		// Each member writes 600 rows/s on slots 24..31 of shard 1 and one
		// on every other slot: neither is hot alone (608 is below 1000 and
		// below 4 times the mean of 164), their sum is.
		w := make([]float64, rigSlots)
		for s := range w {
			w[s] = 1
			if s >= 24 && s <= 31 {
				w[s] = 75
			}
		}
		a.load.set(w)
		a.pass()
		a.pass()
		migs := a.store.started()
		if len(migs) != 1 || migs[0].Tree != "items" || migs[0].Origin != shardmap.OriginAutosplit || migs[0].Phase != shardmap.PhaseDone {
			t.Fatalf("migrations %+v", migs)
		}
		for _, tree := range []string{"items", "extras"} {
			if !a.nodes.called(fmt.Sprintf("create %d %s", migs[0].Target, tree)) {
				t.Errorf("the split made no table of member %s", tree)
			}
			st, err := a.store.Store.(*shardmap.RedisStore).Autonomic(a.ctx, "app", tree)
			if err != nil || st == nil || !strings.Contains(st.Monitor, "split of shard 1 at slot 28") {
				t.Errorf("status of member %s: %+v, %v", tree, st, err)
			}
		}
	})
	t.Run("heal", func(t *testing.T) {
		a := newAutoRig(t)
		a.join("extras")
		a.growTo(6)
		a.load.set(make([]float64, rigSlots))
		for range 6 {
			a.pass()
		}
		if n := a.mapNow().DistinctShards(); n != 4 {
			t.Fatalf("%d shards after healing the group; want the registry's 4", n)
		}
		folds := 0
		for _, mig := range a.store.started() {
			if mig.Kind != shardmap.Fold {
				continue
			}
			folds++
			if mig.Tree != "items" || mig.Origin != shardmap.OriginAutoheal {
				t.Fatalf("fold %+v", mig)
			}
			if !a.nodes.called(fmt.Sprintf("drop %d extras", mig.Source)) {
				t.Errorf("fold of donor %d dropped no table of member extras", mig.Source)
			}
		}
		if folds != 2 {
			t.Fatalf("%d folds; want 2", folds)
		}
	})
	t.Run("member option", func(t *testing.T) {
		a := newAutoRig(t)
		a.join("extras")
		f := &Functions{store: a.store.Store, coord: a.coord}
		if _, err := f.Call(a.ctx, "app", "lattice_set_tree_option", []*string{ptr("extras"), ptr("autosplit"), ptr("false")}, nil); err != nil {
			t.Fatal(err)
		}
		a.load.set(hotOn(24, 31))
		for range 3 {
			a.pass()
		}
		if n := a.mapNow().DistinctShards(); n != 4 {
			t.Fatalf("%d shards with autosplit off on a member", n)
		}
		if !strings.Contains(a.status().Monitor, "off: lattice_set_tree_option('extras', 'autosplit', false)") {
			t.Fatalf("status %+v", a.status())
		}
	})
}
