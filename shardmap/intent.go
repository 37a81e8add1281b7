package shardmap

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// IntentKind says what a tree's intent (a Reshard record) is for. One key
// holds it whatever its kind, so a reshard, a rebalance, a drain and a move
// of the same tree exclude each other.
type IntentKind string

const (
	IntentReshard   IntentKind = ""          // lattice_reshard
	IntentRebalance IntentKind = "rebalance" // lattice_rebalance
	IntentDrain     IntentKind = "drain"     // lattice_drain_node, one intent per tree
	IntentMove      IntentKind = "move"      // lattice_move_shard
)

// Rebalance is the part of an intent that moves shards between nodes.
type Rebalance struct {
	Kind IntentKind `json:"kind,omitempty"`
	By   string     `json:"by,omitempty"`   // "bytes" or "slots"
	Node string     `json:"node,omitempty"` // a drain's node, a move's target node
	// Shard is a move's shard.
	Shard int `json:"shard,omitempty"`
	// Moved lists the shards this intent has started moving, so that none
	// moves twice in one rebalance and the plan ends.
	Moved []int `json:"moved,omitempty"`
	// Skipped lists the shards a planned move was refused for (the tree
	// changed since the plan), so that the plan does not retry them.
	Skipped []int `json:"skipped,omitempty"`
}

// Intents is the store's side for intents beyond StartReshard and
// FinishReshard. RedisStore implements it.
type Intents interface {
	// UpdateReshard replaces the tree's intent with r if the stored one has
	// r's operation id; ErrNotFound otherwise.
	UpdateReshard(ctx context.Context, r *Reshard) error
}

var _ Intents = (*RedisStore)(nil)

// KEYS: reshard. ARGV: op id, JSON. Replaces only the operation named.
var updateReshardScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if cjson.decode(cur)['op_id'] ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
return 1`)

// UpdateReshard implements Intents.
func (s *RedisStore) UpdateReshard(ctx context.Context, r *Reshard) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	n, err := updateReshardScript.Run(ctx, s.client, []string{s.reshardKey(r.Tenant, r.Tree)}, r.OpID, b).Int()
	if err != nil {
		return fmt.Errorf("shardmap: update intent of %s/%s: %w", r.Tenant, r.Tree, err)
	}
	if n == 0 {
		return fmt.Errorf("shardmap: intent %s of %s/%s: %w", r.OpID, r.Tenant, r.Tree, ErrNotFound)
	}
	return nil
}

// Draining is the draining state of the node registry's entries
// (lattice_drain_node): no shard is placed or moved onto a draining node.
type Draining interface {
	// MarkDraining sets node's registry state to draining; ErrNotFound if
	// the registry has no such node.
	MarkDraining(ctx context.Context, node string) error
	// DrainingNodes lists the registry's draining nodes, in registry order.
	DrainingNodes(ctx context.Context) ([]string, error)
}

var _ Draining = (*RedisStore)(nil)

// MarkDraining implements Draining.
func (s *RedisStore) MarkDraining(ctx context.Context, node string) error {
	_, err := UpdateNodes(ctx, s, func(n *Nodes) error {
		i := slices.IndexFunc(n.Nodes, func(e NodeEntry) bool { return e.Name == node })
		if i < 0 {
			return fmt.Errorf("shardmap: node %s: %w", node, ErrNotFound)
		}
		n.Nodes[i].State = NodeDraining
		return nil
	})
	return err
}

// DrainingNodes implements Draining.
func (s *RedisStore) DrainingNodes(ctx context.Context) ([]string, error) {
	n, err := s.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range n.Nodes {
		if e.State == NodeDraining {
			out = append(out, e.Name)
		}
	}
	return out, nil
}
