package migrator

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Rebalance measures, for lattice_rebalance's by argument.
const (
	ByBytes = "bytes" // pg_total_relation_size of each shard table
	BySlots = "slots" // slots owned
)

// balanceTolerance is how far from the mean a node's load may be once a
// rebalance is done: every active node within 10%. A tree within it is
// left alone; a rebalance that runs aims at planTolerance, so that the
// bytes the nodes report after it (a moved shard's copy is compact, its
// source was not, and writes go on) still fall within balanceTolerance.
const (
	balanceTolerance = 0.10
	planTolerance    = 0.05
)

// plannedMove is one move of a plan.
type plannedMove struct {
	Shard    int
	From, To string
	Weight   int64
}

// placedShard is an owning shard as a plan sees it.
type placedShard struct {
	Index   int
	Node    string
	Weight  int64
	Movable bool // active, not mixed, in no migration, not yet moved by this intent
}

// planRebalance returns the moves that take every shard off the nodes not
// in active (heaviest first, each to the lightest active node) and then,
// unless drainOnly, even the active nodes' loads: each step is the move
// that most lowers the sum of squared loads, until every active node is
// within tol of the mean or no move helps. Each shard moves
// at most once, so the plan ends.
func planRebalance(shards []placedShard, active []string, drainOnly bool, tol float64) []plannedMove {
	if len(active) == 0 {
		return nil
	}
	load := make(map[string]int64, len(active))
	for _, n := range active {
		load[n] = 0
	}
	var off []*placedShard
	for i := range shards {
		s := &shards[i]
		if _, ok := load[s.Node]; ok {
			load[s.Node] += s.Weight
		} else if s.Movable {
			off = append(off, s)
		}
	}
	lightest := func() string {
		best := active[0]
		for _, n := range active[1:] {
			if load[n] < load[best] {
				best = n
			}
		}
		return best
	}
	var plan []plannedMove
	move := func(s *placedShard, to string) {
		plan = append(plan, plannedMove{Shard: s.Index, From: s.Node, To: to, Weight: s.Weight})
		if _, ok := load[s.Node]; ok {
			load[s.Node] -= s.Weight
		}
		load[to] += s.Weight
		s.Node, s.Movable = to, false
	}
	slices.SortStableFunc(off, func(a, b *placedShard) int { return cmp.Compare(b.Weight, a.Weight) })
	for _, s := range off {
		move(s, lightest())
	}
	if drainOnly {
		return plan
	}
	for {
		if balanced(load, active, tol) {
			return plan
		}
		// The move of weight w from a to b lowers the sum of squares by
		// 2w(load[a]-load[b]-w): the best one of all.
		var best *placedShard
		bestTo, bestGain := "", int64(0)
		for i := range shards {
			s := &shards[i]
			if !s.Movable {
				continue
			}
			from, ok := load[s.Node]
			if !ok {
				continue
			}
			for _, to := range active {
				if gain := s.Weight * (from - load[to] - s.Weight); gain > bestGain {
					best, bestTo, bestGain = s, to, gain
				}
			}
		}
		if best == nil {
			return plan
		}
		move(best, bestTo)
	}
}

// balanced reports whether every active node's load is within tol of the
// mean.
func balanced(loads map[string]int64, active []string, tol float64) bool {
	var total int64
	for _, n := range active {
		total += loads[n]
	}
	mean := float64(total) / float64(len(active))
	for _, n := range active {
		if d := float64(loads[n]) - mean; d > tol*mean || -d > tol*mean {
			return false
		}
	}
	return true
}

// rebalancePlan is the plan of intent r against the tree's state now.
// Moves in flight count as done (their shards weigh on their target
// nodes), so that a tick starts only what they leave to do.
func (c *Coordinator) rebalancePlan(ctx context.Context, r *shardmap.Reshard, t *shardmap.Tree, m *shardmap.Map, flying []*shardmap.Migration, tol float64) ([]plannedMove, error) {
	var weights map[int]int64
	if r.By == BySlots {
		weights = map[int]int64{}
		for idx, n := range m.SlotCounts() {
			weights[idx] = int64(n)
		}
	} else {
		sizes, err := c.runner.treeSizes(ctx, t, m)
		if err != nil {
			return nil, err
		}
		weights = make(map[int]int64, len(sizes))
		for idx, sz := range sizes {
			weights[idx] = sz.Bytes
		}
	}
	active, err := c.runner.activeNodes(ctx)
	if err != nil {
		return nil, err
	}
	if r.Kind == shardmap.IntentDrain {
		active = slices.DeleteFunc(active, func(n string) bool { return n == r.Node })
	}
	shards := placeShards(m, weights, flying, r)
	switch r.Kind {
	case shardmap.IntentMove:
		for _, s := range shards {
			if s.Index == r.Shard && s.Movable && s.Node != r.Node {
				return []plannedMove{{Shard: s.Index, From: s.Node, To: r.Node, Weight: s.Weight}}, nil
			}
		}
		return nil, nil
	case shardmap.IntentDrain:
		// Only the drained node's shards move.
		for i := range shards {
			if shards[i].Node != r.Node {
				shards[i].Movable = false
			}
		}
		return planRebalance(shards, active, true, tol), nil
	}
	return planRebalance(shards, active, false, tol), nil
}

// placeShards lists m's owning shards for a plan of intent r: a shard
// with a move in flight is on its target node already, and a shard that
// is not active, is mixed, is in a migration, or that r moved or skipped
// before does not move (each shard moves at most once per intent, which is
// what ends a plan whose sizes change under load).
func placeShards(m *shardmap.Map, weights map[int]int64, flying []*shardmap.Migration, r *shardmap.Reshard) []placedShard {
	b := busy(flying)
	moving := map[int]string{}
	for _, o := range flying {
		if o.Kind == shardmap.Move {
			moving[o.Source] = o.TargetNode
		}
	}
	var shards []placedShard
	for _, idx := range m.OwningShards() {
		sh := m.Shards[idx]
		p := placedShard{Index: idx, Node: sh.Node, Weight: weights[idx],
			Movable: sh.State == shardmap.ShardActive && !sh.Mixed && !b[idx] && !slices.Contains(r.Moved, idx) && !slices.Contains(r.Skipped, idx)}
		if to, ok := moving[idx]; ok {
			p.Node = to
		}
		shards = append(shards, p)
	}
	return shards
}

// tickRebalance is one tick of a rebalance, a drain or a move: it starts
// the plan's next moves while fewer than MaxConcurrentMigrations are in
// flight, and completes the intent once nothing is left to move. ctx is
// the tick's (tickBudget), run the one the moves it starts run under.
func (c *Coordinator) tickRebalance(ctx, run context.Context, r *shardmap.Reshard) error {
	u, err := c.runner.unitOf(ctx, r.Tenant, r.Tree)
	if err != nil {
		return err
	}
	t := u.lead
	m, err := c.store.Map(ctx, r.Tenant, r.Tree)
	if err != nil {
		return err
	}
	migs, err := c.store.Migrations(ctx, r.Tenant, r.Tree)
	if err != nil {
		return err
	}
	flying := inFlight(migs)
	for _, mig := range flying {
		c.ensureRunning(run, mig)
	}
	plan, err := c.rebalancePlan(ctx, r, t, m, flying, planTolerance)
	if err != nil {
		return err
	}
	if len(plan) == 0 && len(flying) == 0 {
		return c.completeRebalance(ctx, t, r, m)
	}
	for _, mv := range plan[:min(len(plan), max(c.opts.MaxConcurrentMigrations-len(flying), 0))] {
		mig, err := c.runner.StartMove(ctx, t, mv.Shard, mv.To)
		var refused *sqlstate.Error
		if errors.As(err, &refused) {
			// StartMove's own checks: the tree changed since the plan.
			c.log.Warn("rebalance: planned move refused; skipping the shard", "tree", t.Name, "shard", mv.Shard, "node", mv.To, "err", err)
			r.Skipped = append(r.Skipped, mv.Shard)
			if err := c.store.UpdateReshard(ctx, r); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		r.Moved = append(r.Moved, mv.Shard)
		if err := c.store.UpdateReshard(ctx, r); err != nil {
			return err
		}
		c.ensureRunning(run, mig)
	}
	return nil
}

// completeRebalance clears the intent, counts the completion, publishes
// rebalance_completed and gives the lease up.
func (c *Coordinator) completeRebalance(ctx context.Context, t *shardmap.Tree, r *shardmap.Reshard, m *shardmap.Map) error {
	if err := c.store.FinishReshard(ctx, t.Tenant, r.Tree, r.OpID); err != nil {
		return err
	}
	c.metrics.CoordinatorCompleted.WithLabelValues(r.Tree, t.Tenant, string(r.Kind)).Inc()
	moves := len(r.Moved)
	c.runner.publish(ctx, Event{Event: EventRebalanceCompleted, Tenant: t.Tenant, Tree: r.Tree, Epoch: m.Epoch,
		Rebalance: r.OpID, Kind: string(r.Kind), By: r.By, Node: r.Node, Moves: &moves})
	c.log.Info("rebalance completed", "tree", r.Tree, "tenant", t.Tenant, "kind", r.Kind, "moves", moves, "took", time.Since(r.Started))
	return c.store.ReleaseLease(ctx, t.Tenant, r.Tree, c.id)
}
