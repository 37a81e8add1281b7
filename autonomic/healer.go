package autonomic

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// heal is over-split healing's pass: once the tree has been quiet (no
// shard above ColdWrites) and uniform for the whole HealWindow, counted
// again from the last split, it folds adjacent pairs that stay cold
// together, never below the registry's shard count.
func (p *Policy) heal(st *treeState, v View, counts map[int]int, now time.Time, d *Decision) {
	switch {
	case v.HealOff != "":
		st.quietSince = time.Time{}
		d.Healer = "off: " + v.HealOff
		return
	case v.Intent != "":
		// No new fold while a reshard runs; the quiet window starts over
		// on the map it leaves.
		st.quietSince = time.Time{}
		d.Healer = "idle while " + v.Intent + "; no fold starts"
		return
	case v.Writes == nil:
		st.quietSince = time.Time{}
		d.Healer = "idle: no load data yet"
		return
	}
	l := newLoad(v, counts)
	folding := unflipped(v.Flying, shardmap.Fold)
	if len(counts)-folding <= v.Registry {
		d.Healer = fmt.Sprintf("idle: %d shards, the registry's count (set at creation or by the last reshard); healing folds no further", len(counts))
		if folding > 0 {
			d.Healer = fmt.Sprintf("folding: %d folds in flight, down to the registry's %d shards", folding, v.Registry)
		}
		return
	}
	hw := l.shard[l.hottest]
	switch {
	case hw > p.cfg.ColdWrites:
		st.quietSince = time.Time{}
		d.Healer = fmt.Sprintf("idle: not quiet (shard %d: %s, above %s)", l.hottest, rate(hw), rate(p.cfg.ColdWrites))
		return
	case hw >= 1 && hw > p.cfg.UniformMultiple*l.mean:
		st.quietSince = time.Time{}
		d.Healer = fmt.Sprintf("idle: load not uniform (shard %d writes %.1f times the mean)", l.hottest, hw/l.mean)
		return
	}
	if st.quietSince.IsZero() {
		st.quietSince = now
	}
	since := st.quietSince
	if st.lastSplit.After(since) {
		since = st.lastSplit
	}
	if q := now.Sub(since); q < p.cfg.HealWindow {
		d.Healer = fmt.Sprintf("waiting: quiet and uniform for %s of %s", q.Round(time.Second), p.cfg.HealWindow)
		return
	}
	if n := unflipped(v.Flying, shardmap.Split); n > 0 {
		d.Healer = fmt.Sprintf("waiting: %d splits in flight", n)
		return
	}
	want := min(p.cfg.MaxConcurrent-len(v.Flying), len(counts)-folding-v.Registry)
	var why []string
	for _, f := range p.coldPairs(v, l, want) {
		d.Folds = append(d.Folds, f)
		why = append(why, fmt.Sprintf("fold of shard %d into shard %d", f.Donor, f.Survivor))
	}
	switch {
	case len(d.Folds) > 0:
		d.Healer = fmt.Sprintf("%s: quiet and uniform for %s (%d shards, the registry's %d)", strings.Join(why, ", "),
			p.cfg.HealWindow, len(counts), v.Registry)
	case folding > 0:
		d.Healer = fmt.Sprintf("folding: %d folds in flight", folding)
	default:
		d.Healer = "waiting: no adjacent pair is free and cold together"
	}
}

// coldPairs chooses up to want disjoint adjacent pairs of owning shards
// that are in no migration and write less than ColdWrites together: as
// many as there are, so that a tree split in halves folds its halves back
// together rather than stranding a shard between two folded pairs, and
// among the choices of that many the one whose shards come out most even
// (the least sum of the products of each pair's sizes, which is the least
// sum of squared sizes after the folds: the smallest pairs first). How
// cold each pair is does not order them: all of them are cold. Sizes are
// slot counts, not the nodes' row estimates, which lag the migrations that
// just ran (docs/DESIGN.md section 6.1). The donor is the smaller side.
func (p *Policy) coldPairs(v View, l load, want int) []Fold {
	type span struct{ idx, lo, hi int }
	var spans []span
	for _, idx := range v.Map.OwningShards() {
		rg := v.Map.SlotRanges(idx)
		spans = append(spans, span{idx, rg[0][0], rg[len(rg)-1][1]})
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	counts := v.Map.SlotCounts()
	size := func(idx int) int64 { return int64(counts[idx]) }
	n := len(spans)
	if want <= 0 || n < 2 {
		return nil
	}
	foldable := func(i int) bool {
		x, y := spans[i], spans[i+1]
		return x.hi+1 == y.lo && !l.busy[x.idx] && !l.busy[y.idx] && l.shard[x.idx]+l.shard[y.idx] < p.cfg.ColdWrites
	}
	// cost[i][k]: the least cost of k pairs among spans[i:], +Inf if
	// there are not k; take[i][k]: whether spans i and i+1 pair in it.
	inf := math.Inf(1)
	cost := make([][]float64, n+2)
	take := make([][]bool, n+2)
	for i := range cost {
		cost[i] = make([]float64, want+1)
		take[i] = make([]bool, want+1)
		for k := 1; k <= want; k++ {
			cost[i][k] = inf
		}
	}
	for i := n - 2; i >= 0; i-- {
		for k := 1; k <= want; k++ {
			cost[i][k] = cost[i+1][k]
			if !foldable(i) {
				continue
			}
			if c := float64(size(spans[i].idx))*float64(size(spans[i+1].idx)) + cost[i+2][k-1]; c < cost[i][k] {
				cost[i][k], take[i][k] = c, true
			}
		}
	}
	k := want
	for k > 0 && math.IsInf(cost[0][k], 1) {
		k--
	}
	var out []Fold
	for i := 0; i+1 < n && k > 0; {
		if !take[i][k] {
			i++
			continue
		}
		d, s := spans[i].idx, spans[i+1].idx
		if size(d) > size(s) || size(d) == size(s) && d < s {
			d, s = s, d
		}
		out = append(out, Fold{Donor: d, Survivor: s, Writes: l.shard[d] + l.shard[s]})
		i, k = i+2, k-1
	}
	return out
}
