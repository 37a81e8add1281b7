package migrator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Reasons on the rejected counter when a reshard and a rebalance of the
// same tree meet.
const (
	ReasonRebalanceInFlight = "rebalance_in_flight" // a reshard refused: a rebalance, drain or move runs
	ReasonReshardInFlight   = "reshard_in_flight"   // a rebalance, drain or move refused: a reshard runs
)

// rebalanceFunctionList names this file's functions for hints.
const rebalanceFunctionList = "lattice_move_shard, lattice_rebalance, lattice_rebalance_status, lattice_rebalance_complete, lattice_drain_node and lattice_drain_complete"

var rebalanceSignatures = map[string][]pgproto3.FieldDescription{
	"lattice_move_shard":         {field("lattice_move_shard", pgtype.TextOID)},
	"lattice_rebalance":          {field("lattice_rebalance", pgtype.TextOID)},
	"lattice_rebalance_complete": {field("lattice_rebalance_complete", pgtype.BoolOID)},
	"lattice_drain_node":         {field("lattice_drain_node", pgtype.TextOID)},
	"lattice_drain_complete":     {field("lattice_drain_complete", pgtype.BoolOID)},
	"lattice_rebalance_status": {
		field("phase", pgtype.TextOID), field("by", pgtype.TextOID), field("node", pgtype.TextOID),
		field("moves_done", pgtype.Int4OID), field("moves_left", pgtype.Int4OID),
		field("migrations_in_flight", pgtype.Int4OID), field("rows_copied", pgtype.Int8OID), field("lag_bytes", pgtype.Int8OID),
		field("eta_seconds", pgtype.Float8OID), field("last_error", pgtype.TextOID),
	},
}

var rebalanceArgNames = map[string][]string{
	"lattice_move_shard":         {"tree", "shard", "node"},
	"lattice_rebalance":          {"tree", "by"},
	"lattice_rebalance_status":   {"tree"},
	"lattice_rebalance_complete": {"tree"},
	"lattice_drain_node":         {"node"},
	"lattice_drain_complete":     {"node"},
}

// The functions of this file join the others' tables, so that Describe,
// ArgType and the argument binding treat them alike.
func init() {
	maps.Copy(signatures, rebalanceSignatures)
	maps.Copy(argNames, rebalanceArgNames)
}

// callRebalance runs the functions of this file; ok is false for any other name.
func (f *Functions) callRebalance(ctx context.Context, tenant, name string, args []*string, named map[string]*string) (rows [][]any, ok bool, err error) {
	params, ok := rebalanceArgNames[name]
	if !ok {
		return nil, false, nil
	}
	a, err := bindArgs(name, args, named, params...)
	if err != nil {
		return nil, true, err
	}
	var v any
	switch name {
	case "lattice_move_shard":
		v, err = f.moveShard(ctx, tenant, a)
	case "lattice_rebalance":
		v, err = f.rebalance(ctx, tenant, a)
	case "lattice_rebalance_status":
		rows, err = f.rebalanceStatus(ctx, tenant, a)
		return rows, true, err
	case "lattice_rebalance_complete":
		v, err = f.rebalanceComplete(ctx, tenant, a)
	case "lattice_drain_node":
		v, err = f.drainNode(ctx, tenant, a)
	case "lattice_drain_complete":
		v, err = f.drainComplete(ctx, tenant, a)
	}
	if err != nil {
		return nil, true, err
	}
	return [][]any{{v}}, true, nil
}

// lookupTree is the tree named by argument "tree", folded; 42P01 if it is
// not a tree.
func (f *Functions) lookupTree(ctx context.Context, tenant string, a map[string]*string) (*shardmap.Tree, error) {
	name, err := required(a, "tree")
	if err != nil {
		return nil, err
	}
	name = foldName(name)
	t, err := f.store.Tree(ctx, tenant, name)
	if errors.Is(err, shardmap.ErrNotFound) {
		e := sqlstate.New(sqlstate.UndefinedTable, "tree %q does not exist", name)
		e.Hint = "SELECT * FROM lattice_trees() lists the trees; an ordinary table becomes one with lattice_create_tree."
		return nil, e
	}
	return t, err
}

// lookupNode is the node named by argument "node"; 42704 if there is none.
func (f *Functions) lookupNode(a map[string]*string) (string, error) {
	node, err := required(a, "node")
	if err != nil {
		return "", err
	}
	if _, ok := f.cluster.Node(node); !ok {
		e := sqlstate.New(sqlstate.UndefinedObject, "node %q does not exist", node)
		e.Hint = "The nodes are " + strings.Join(f.cluster.NodeNames(), ", ") + "."
		return "", e
	}
	return node, nil
}

// intentRunning says what a tree's intent is doing, for errors.
func intentRunning(r *shardmap.Reshard) string {
	switch r.Kind {
	case shardmap.IntentReshard:
		return fmt.Sprintf("a reshard of %s to %d shards is in progress", r.Tree, r.Target)
	case shardmap.IntentMove:
		return fmt.Sprintf("a move of shard %d of %s to node %s is in progress", r.Shard, r.Tree, r.Node)
	case shardmap.IntentDrain:
		return fmt.Sprintf("a drain of node %s is moving the shards of %s", r.Node, r.Tree)
	}
	return fmt.Sprintf("a rebalance of %s by %s is in progress", r.Tree, r.By)
}

// startIntent stores r unless the tree has an intent already, which it
// returns instead; a reshard's refusal is counted here, with its reason.
func (f *Functions) startIntent(ctx context.Context, r *shardmap.Reshard) (*shardmap.Reshard, error) {
	cur, err := f.store.Reshard(ctx, r.Tenant, r.Tree)
	if err == nil {
		return cur, nil
	}
	if !errors.Is(err, shardmap.ErrNotFound) {
		return nil, err
	}
	return f.store.StartReshard(ctx, r)
}

// refuseIntent is the error for an intent refused because cur runs, with
// the reason counted on the rejected counter.
func (f *Functions) refuseIntent(cur *shardmap.Reshard, what string) error {
	reason := ReasonInProgress
	if cur.Kind == shardmap.IntentReshard {
		reason = ReasonReshardInFlight
	}
	f.coord.metrics.ReshardRejected.WithLabelValues(cur.Tree, cur.Tenant, reason).Inc()
	e := sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "%s; %s afterwards", intentRunning(cur), what)
	if cur.Kind == shardmap.IntentReshard {
		e.Hint = fmt.Sprintf("Wait until SELECT lattice_reshard_complete('%s') returns true.", cur.Tree)
	} else {
		e.Hint = fmt.Sprintf("Wait until SELECT lattice_rebalance_complete('%s') returns true.", cur.Tree)
	}
	return &Rejected{Reason: reason, Err: e}
}

// started publishes rebalance_started for r.
func (f *Functions) started(ctx context.Context, r *shardmap.Reshard) {
	f.coord.runner.publish(ctx, Event{Event: EventRebalanceStarted, Tenant: r.Tenant, Tree: r.Tree,
		Epoch: f.coord.runner.mapEpoch(ctx, r.Tenant, r.Tree), Rebalance: r.OpID, Kind: string(r.Kind), By: r.By, Node: r.Node})
	f.coord.Nudge()
}

func newIntent(t *shardmap.Tree, kind shardmap.IntentKind) *shardmap.Reshard {
	return &shardmap.Reshard{OpID: newID(), Tenant: t.Tenant, Tree: t.MapName(), Phase: string(kind),
		Started: time.Now().UTC(), Rebalance: shardmap.Rebalance{Kind: kind, By: ByBytes}}
}

// moveShard is lattice_move_shard(tree, shard, node).
func (f *Functions) moveShard(ctx context.Context, tenant string, a map[string]*string) (string, error) {
	t, err := f.lookupTree(ctx, tenant, a)
	if err != nil {
		return "", err
	}
	s, err := required(a, "shard")
	if err != nil {
		return "", err
	}
	idx, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return "", sqlstate.New(sqlstate.InvalidParameterValue, "argument shard must be an integer, got %q", s)
	}
	node, err := required(a, "node")
	if err != nil {
		return "", err
	}
	m, err := f.store.Map(ctx, tenant, t.MapName())
	if err != nil {
		return "", err
	}
	migs, err := f.store.Migrations(ctx, tenant, t.MapName())
	if err != nil {
		return "", err
	}
	draining, err := f.store.DrainingNodes(ctx)
	if err != nil {
		return "", err
	}
	if err := f.coord.runner.checkMove(t, m, idx, node, draining, inFlight(migs)); err != nil {
		return "", err
	}
	r := newIntent(t, shardmap.IntentMove)
	r.Shard, r.Node = idx, node
	cur, err := f.startIntent(ctx, r)
	if err != nil {
		return "", err
	}
	if cur != nil {
		if cur.Kind == shardmap.IntentMove && cur.Shard == idx && cur.Node == node {
			return fmt.Sprintf("shard %d of %s is already moving to %s", idx, t.Name, node), nil
		}
		return "", f.refuseIntent(cur, "move the shard")
	}
	f.started(ctx, r)
	return fmt.Sprintf("moving shard %d of %s from %s to %s", idx, t.Name, m.Shards[idx].Node, node), nil
}

// rebalance is lattice_rebalance(tree [, by]).
func (f *Functions) rebalance(ctx context.Context, tenant string, a map[string]*string) (string, error) {
	t, err := f.lookupTree(ctx, tenant, a)
	if err != nil {
		return "", err
	}
	by := ByBytes
	if v := a["by"]; v != nil {
		by = strings.ToLower(strings.TrimSpace(*v))
	}
	if by != ByBytes && by != BySlots {
		e := sqlstate.New(sqlstate.InvalidParameterValue, "argument by must be 'bytes' or 'slots', got %q", by)
		e.Hint = "Rebalance by 'bytes' (the default: each shard table's size on disk) or by 'slots' (slots owned)."
		return "", e
	}
	r := newIntent(t, shardmap.IntentRebalance)
	r.By = by
	m, err := f.store.Map(ctx, tenant, t.MapName())
	if err != nil {
		return "", err
	}
	cur, err := f.store.Reshard(ctx, tenant, t.MapName())
	if err != nil && !errors.Is(err, shardmap.ErrNotFound) {
		return "", err
	}
	if cur == nil {
		plan, err := f.coord.rebalancePlan(ctx, r, t, m, nil, balanceTolerance)
		if err != nil {
			return "", err
		}
		if len(plan) == 0 {
			return fmt.Sprintf("tree %s is as even by %s as moves can make it: nothing to move", t.Name, by), nil
		}
		if cur, err = f.startIntent(ctx, r); err != nil {
			return "", err
		}
		if cur == nil {
			f.started(ctx, r)
			return fmt.Sprintf("rebalancing %s by %s: %d moves planned", t.Name, by, len(plan)), nil
		}
	}
	if cur.Kind == shardmap.IntentRebalance && cur.By == by {
		return fmt.Sprintf("a rebalance of %s by %s is already running", t.Name, by), nil
	}
	return "", f.refuseIntent(cur, "rebalance it")
}

// drainTenants are the tenants a drain covers: every tenant with trees
// (the node registry is the deployment's), the caller's at least.
func (f *Functions) drainTenants(ctx context.Context, tenant string) ([]string, error) {
	if f.nodes == nil {
		return []string{tenant}, nil
	}
	tenants, err := f.nodes.Registry.TenantsWithTrees(ctx)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(tenants, tenant) {
		tenants = append(tenants, tenant)
	}
	return tenants, nil
}

// drainNode is lattice_drain_node(node): it sets the node's registry state
// to draining, so that no shard is placed on it any more, and stores a
// drain intent for every tree of every tenant with a shard there. Every
// tree is checked before anything is stored.
func (f *Functions) drainNode(ctx context.Context, tenant string, a map[string]*string) (string, error) {
	node, err := f.lookupNode(a)
	if err != nil {
		return "", err
	}
	active, err := f.coord.runner.activeNodes(ctx)
	if err != nil {
		return "", err
	}
	if !slices.ContainsFunc(active, func(n string) bool { return n != node }) {
		e := sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "node %s is the last node that is not drained: its shards have nowhere to go", node)
		e.Hint = "Add a node first."
		return "", e
	}
	trees, err := f.allTrees(ctx, tenant)
	if err != nil {
		return "", err
	}
	var todo []*shardmap.Tree
	shards := 0
	for _, t := range trees {
		m, err := f.store.Map(ctx, t.Tenant, t.MapName())
		if err != nil {
			return "", err
		}
		n := shardsOn(m, node)
		cur, err := f.store.Reshard(ctx, t.Tenant, t.MapName())
		if err != nil && !errors.Is(err, shardmap.ErrNotFound) {
			return "", err
		}
		switch {
		case cur != nil && cur.Kind == shardmap.IntentDrain && cur.Node == node:
		case cur != nil && (n > 0 || cur.Kind != shardmap.IntentReshard):
			// A reshard that holds no shard on the node places none there
			// (placement skips draining nodes); a rebalance or move might.
			return "", f.refuseIntent(cur, "drain node "+node)
		case n > 0:
			todo = append(todo, t)
		}
		shards += n
	}
	if err := f.store.MarkDraining(ctx, node); err != nil {
		return "", err
	}
	if f.nodes != nil {
		// This proxy places no shard there from its next statement on; the
		// others within a second (the registry's watch).
		if err := f.nodes.Watch.Reload(ctx); err != nil {
			return "", fmt.Errorf("node %s is draining, but this proxy did not apply it yet: %w", node, err)
		}
	}
	for _, t := range todo {
		r := newIntent(t, shardmap.IntentDrain)
		r.Node = node
		cur, err := f.startIntent(ctx, r)
		if err != nil {
			return "", err
		}
		if cur != nil && !(cur.Kind == shardmap.IntentDrain && cur.Node == node) {
			return "", f.refuseIntent(cur, "drain node "+node)
		}
		if cur == nil {
			f.started(ctx, r)
		}
	}
	return fmt.Sprintf("draining node %s: %d shards to move, of %d trees", node, shards, len(todo)), nil
}

// allTrees lists the trees of drainTenants.
func (f *Functions) allTrees(ctx context.Context, tenant string) ([]*shardmap.Tree, error) {
	tenants, err := f.drainTenants(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var out []*shardmap.Tree
	for _, tn := range tenants {
		trees, err := f.store.Trees(ctx, tn)
		if err != nil {
			return nil, err
		}
		// One tree per map: a colocation group's shards move as one, under
		// one intent.
		seen := map[string]bool{}
		for _, t := range trees {
			if !seen[t.MapName()] {
				seen[t.MapName()] = true
				out = append(out, t)
			}
		}
	}
	return out, nil
}

// shardsOn counts the shards of m on node that own slots or are pending.
func shardsOn(m *shardmap.Map, node string) int {
	counts := m.SlotCounts()
	n := 0
	for idx, sh := range m.Shards {
		if sh.Node == node && (counts[idx] > 0 || sh.State == shardmap.ShardPending) {
			n++
		}
	}
	return n
}

// rebalanceComplete is lattice_rebalance_complete(tree): no rebalance,
// drain or move of the tree runs.
func (f *Functions) rebalanceComplete(ctx context.Context, tenant string, a map[string]*string) (bool, error) {
	t, err := f.lookupTree(ctx, tenant, a)
	if err != nil {
		return false, err
	}
	r, err := f.store.Reshard(ctx, tenant, t.MapName())
	if errors.Is(err, shardmap.ErrNotFound) {
		return true, nil
	}
	return err == nil && r.Kind == shardmap.IntentReshard, err
}

// drainComplete is lattice_drain_complete(node): no drain of the node runs
// and no shard of any tenant's trees is on it, so it can be removed.
func (f *Functions) drainComplete(ctx context.Context, tenant string, a map[string]*string) (bool, error) {
	node, err := f.lookupNode(a)
	if err != nil {
		return false, err
	}
	trees, err := f.allTrees(ctx, tenant)
	if err != nil {
		return false, err
	}
	for _, t := range trees {
		r, err := f.store.Reshard(ctx, t.Tenant, t.MapName())
		if err == nil && r.Kind == shardmap.IntentDrain && r.Node == node {
			return false, nil
		}
		if err != nil && !errors.Is(err, shardmap.ErrNotFound) {
			return false, err
		}
		m, err := f.store.Map(ctx, t.Tenant, t.MapName())
		if err != nil {
			return false, err
		}
		if shardsOn(m, node) > 0 {
			return false, nil
		}
	}
	return true, nil
}

// rebalanceStatus is lattice_rebalance_status(tree): one row, phase idle
// when no rebalance, drain or move runs.
func (f *Functions) rebalanceStatus(ctx context.Context, tenant string, a map[string]*string) ([][]any, error) {
	t, err := f.lookupTree(ctx, tenant, a)
	if err != nil {
		return nil, err
	}
	r, err := f.store.Reshard(ctx, tenant, t.MapName())
	if errors.Is(err, shardmap.ErrNotFound) || err == nil && r.Kind == shardmap.IntentReshard {
		return [][]any{{"idle", nil, nil, int32(0), int32(0), int32(0), int64(0), int64(0), float64(0), nil}}, nil
	}
	if err != nil {
		return nil, err
	}
	m, err := f.store.Map(ctx, tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	migs, err := f.store.Migrations(ctx, tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	flying := inFlight(migs)
	plan, err := f.coord.rebalancePlan(ctx, r, t, m, flying, planTolerance)
	if err != nil {
		return nil, err
	}
	var rows, lag int64
	var lastErr any // NULL when nothing holds a move back
	for _, mg := range flying {
		rows += mg.RowsCopied
		lag += mg.LagBytes
		if lastErr == nil && mg.LastError != "" {
			lastErr = mg.LastError
		}
	}
	done := max(len(r.Moved)-len(flying), 0)
	left := len(plan) + len(flying)
	var eta any // NULL until a move is done to extrapolate from
	if done > 0 {
		eta = time.Since(r.Started).Seconds() * float64(left) / float64(done)
	}
	var node any
	if r.Node != "" {
		node = r.Node
	}
	return [][]any{{string(r.Kind), r.By, node, int32(done), int32(left), int32(len(flying)), rows, lag, eta, lastErr}}, nil
}
