package autonomic

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// hot is the monitor's test: above the absolute threshold, or above the
// multiple of the tree's mean (and the floor that keeps an idle tree
// still).
func (p *Policy) hot(w float64, l load) bool {
	return w > p.cfg.SplitWrites || w > p.cfg.SplitFloor && w > p.cfg.SplitMeanMultiple*l.mean
}

// monitor is the hot-shard split monitor's pass: a shard hot for the whole
// window is split at the slot that halves its load, unless one slot of it
// is hot alone, which no split can cool (it is reported instead); growth
// stops at MaxShards.
func (p *Policy) monitor(st *treeState, v View, counts map[int]int, now time.Time, d *Decision) {
	switch {
	case v.SplitOff != "":
		clear(st.hotSince)
		d.Monitor = "off: " + v.SplitOff
		return
	case v.Intent != "":
		// Suppressed while the reshard runs; hotness is counted afresh
		// on the map it leaves.
		clear(st.hotSince)
		d.Monitor = "idle while " + v.Intent + "; no split starts"
		return
	case v.Writes == nil:
		d.Monitor = "idle: no load data yet"
		return
	}
	l := newLoad(v, counts)
	var hot []int
	for idx := range counts {
		if !p.hot(l.shard[idx], l) {
			delete(st.hotSince, idx)
			continue
		}
		if st.hotSince[idx].IsZero() {
			st.hotSince[idx] = now
		}
		hot = append(hot, idx)
	}
	for slot := range st.hotSlots {
		if !p.hot(l.shard[v.Map.Slots[slot]], l) {
			delete(st.hotSlots, slot) // the episode is over
		}
	}
	if len(hot) == 0 {
		d.Monitor = "watching: no shard is hot"
		if l.hottest >= 0 && l.total > 0 {
			d.Monitor += fmt.Sprintf(" (hottest shard %d: %s of the tree's writes, %s)", l.hottest, pct(l.share(l.shard[l.hottest])), rate(l.shard[l.hottest]))
		}
		return
	}
	slices.SortFunc(hot, func(a, b int) int {
		if c := cmp.Compare(l.shard[b], l.shard[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	var sustained []int
	for _, idx := range hot {
		if now.Sub(st.hotSince[idx]) >= p.cfg.SplitWindow {
			sustained = append(sustained, idx)
		}
	}
	top := hot[0]
	if len(sustained) == 0 {
		d.Monitor = fmt.Sprintf("watching: shard %d hot for %s of %s (%s of the tree's writes, %s)", top,
			now.Sub(st.hotSince[top]).Round(time.Second), p.cfg.SplitWindow, pct(l.share(l.shard[top])), rate(l.shard[top]))
		return
	}
	// A shard whose load one slot carries alone is a hot key range, not a
	// split: reported (once an episode in the log and the metric) rather
	// than split again and again.
	var why []string
	splittable := sustained[:0:0]
	for _, idx := range sustained {
		slot, ok := p.coolable(v, idx, l)
		if ok {
			splittable = append(splittable, idx)
			continue
		}
		d.HotSlots = append(d.HotSlots, HotSlot{Shard: idx, Slot: slot, Writes: at(v.Writes, slot),
			Share: l.share(at(v.Writes, slot)), New: !st.hotSlots[slot]})
		st.hotSlots[slot] = true
		why = append(why, fmt.Sprintf("hot key range: slot %d of shard %d carries %s of the tree's writes alone; a split cannot spread it",
			slot, idx, pct(l.share(at(v.Writes, slot)))))
	}
	d.Monitor = strings.Join(why, "; ")
	if len(splittable) == 0 {
		return
	}
	top = splittable[0]
	if wait := p.cfg.SplitWindow - now.Sub(st.lastSplit); !st.lastSplit.IsZero() && wait > 0 {
		p.say(d, fmt.Sprintf("cooling down: %s after the last split before the next (shard %d: %s of the tree's writes)",
			wait.Round(time.Second), top, pct(l.share(l.shard[top]))))
		return
	}
	room := p.cfg.MaxShards - len(counts) - unflipped(v.Flying, shardmap.Split)
	if room <= 0 {
		p.say(d, fmt.Sprintf("capped: %d shards, at --max-physical-shards-per-tree %d; shard %d stays hot (%s of the tree's writes)",
			len(counts), p.cfg.MaxShards, top, pct(l.share(l.shard[top]))))
		return
	}
	free := p.cfg.MaxConcurrent - len(v.Flying)
	for _, idx := range splittable {
		if len(d.Splits) >= min(room, free) {
			break
		}
		if l.busy[idx] || v.Map.Shards[idx].State != shardmap.ShardActive {
			continue
		}
		from, ok := Midpoint(v.Map, idx, v.Writes)
		if !ok {
			continue
		}
		d.Splits = append(d.Splits, Split{Shard: idx, From: from, Writes: l.shard[idx], Share: l.share(l.shard[idx])})
		delete(st.hotSince, idx)
		p.say(d, fmt.Sprintf("split of shard %d at slot %d: %s of the tree's writes", idx, from, pct(l.share(l.shard[idx]))))
	}
	if len(d.Splits) == 0 {
		p.say(d, fmt.Sprintf("waiting: hot shard %d is part of a migration in flight", top))
	}
}

// say adds a clause to what the monitor reports.
func (p *Policy) say(d *Decision, s string) {
	if d.Monitor != "" {
		d.Monitor += "; "
	}
	d.Monitor += s
}

// coolable reports whether splitting shard idx can take it under the
// threshold: not when one slot is hot alone and the rest of the shard is
// not (the split would only move cold slots away). It names the hottest
// slot either way.
func (p *Policy) coolable(v View, idx int, l load) (int, bool) {
	hottest, n := -1, 0
	for slot, owner := range v.Map.Slots {
		if owner != idx {
			continue
		}
		n++
		if hottest < 0 || at(v.Writes, slot) > at(v.Writes, hottest) {
			hottest = slot
		}
	}
	if n < 2 {
		return hottest, false
	}
	alone := at(v.Writes, hottest)
	return hottest, !(p.hot(alone, l) && !p.hot(l.shard[idx]-alone, l))
}
