package shardmap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// NodeState is a node's place in its life cycle.
type NodeState string

const (
	// NodeActive: the node takes new shards.
	NodeActive NodeState = "active"
	// NodeDraining: shards are being moved off the node; it takes no new
	// ones (lattice_drain_node sets it).
	NodeDraining NodeState = "draining"
)

// NodeEntry is one PostgreSQL server of the deployment as the node registry
// keeps it. The DSN carries no password: each proxy finds the password in
// its pgpass file or its environment.
type NodeEntry struct {
	Name  string    `json:"name"`
	DSN   string    `json:"dsn"`
	State NodeState `json:"state"`
	Added time.Time `json:"added"`
}

// Nodes is the node registry of a deployment at one version. The order is
// the order of addition, and the first node is the catalog node: a node is
// appended, never inserted, so the catalog keeps its place.
type Nodes struct {
	Version uint64      `json:"version"`
	Nodes   []NodeEntry `json:"nodes"`
}

// Node returns the entry named name.
func (n *Nodes) Node(name string) (NodeEntry, bool) {
	for _, e := range n.Nodes {
		if e.Name == name {
			return e, true
		}
	}
	return NodeEntry{}, false
}

// Catalog is the catalog node's name, "" for an empty registry.
func (n *Nodes) Catalog() string {
	if len(n.Nodes) == 0 {
		return ""
	}
	return n.Nodes[0].Name
}

// Clone returns a copy that can be changed and written back.
func (n *Nodes) Clone() *Nodes {
	return &Nodes{Version: n.Version, Nodes: slices.Clone(n.Nodes)}
}

// MaxNodes bounds the registry: every proxy holds a presence session and
// pools on every node, so a registry this large is a mistake, not a plan.
const MaxNodes = 256

// EventNodes announces a new version of the node registry; Epoch is the
// version, Tenant and Tree are empty.
const EventNodes EventKind = "nodes"

// ErrNodesConflict is returned by SwapNodes when the registry is not at the
// version the writer read: another writer won, read again.
var ErrNodesConflict = errors.New("shardmap: node registry changed meanwhile")

//	P:nodes   hash: "version" -> decimal version, "nodes" -> Nodes JSON
//
// One key for the whole registry, outside every tenant's hash tag: nodes
// belong to the deployment, and one key lets one script compare and write
// all of it.
func (s *RedisStore) nodesKey() string { return s.prefix + ":nodes" }

// KEYS: nodes. ARGV: expected version ("0": the registry must be empty),
// new version, Nodes JSON, channel, event. Returns 0 on a mismatch.
var swapNodesScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'version') or '0'
if cur ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'nodes', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1`)

// Nodes reads the node registry; an empty one (version 0) when none was
// ever written.
func (s *RedisStore) Nodes(ctx context.Context) (*Nodes, error) {
	v, err := s.client.HGet(ctx, s.nodesKey(), "nodes").Result()
	if errors.Is(err, redis.Nil) {
		return &Nodes{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("shardmap: read node registry: %w", err)
	}
	n := new(Nodes)
	if err := json.Unmarshal([]byte(v), n); err != nil {
		return nil, fmt.Errorf("shardmap: decode node registry: %w", err)
	}
	return n, nil
}

// SwapNodes stores n only if the registry is still at version expected (0:
// still empty); on success n.Version is expected+1 and an EventNodes event
// is published in the same step. ErrNodesConflict otherwise.
func (s *RedisStore) SwapNodes(ctx context.Context, n *Nodes, expected uint64) error {
	if len(n.Nodes) > MaxNodes {
		return fmt.Errorf("shardmap: a registry holds at most %d nodes", MaxNodes)
	}
	next := n.Clone()
	next.Version = expected + 1
	b, err := json.Marshal(next)
	if err != nil {
		return fmt.Errorf("shardmap: encode node registry: %w", err)
	}
	ok, err := swapNodesScript.Run(ctx, s.client, []string{s.nodesKey()},
		strconv.FormatUint(expected, 10), strconv.FormatUint(next.Version, 10), b,
		s.channel, s.event(EventNodes, "", "", next.Version)).Int()
	if err != nil {
		return fmt.Errorf("shardmap: write node registry: %w", err)
	}
	if ok == 0 {
		return fmt.Errorf("shardmap: write node registry at version %d: %w", expected, ErrNodesConflict)
	}
	n.Version = next.Version
	return nil
}

// maxTenants bounds TenantsWithTrees: the scan reads every key name.
const maxTenants = 100000

// TenantsWithTrees lists, sorted, every tenant that has a tree registry
// key, for work that must look at every tenant's maps (removing a node,
// creating tenant databases on a new one). It scans key names, on every
// master of a Redis Cluster: an operator's command, never the request path.
func (s *RedisStore) TenantsWithTrees(ctx context.Context) ([]string, error) {
	return s.tenantsWith(ctx, ":trees")
}

// tenantsWith lists, sorted, every tenant with a key of that suffix.
func (s *RedisStore) tenantsWith(ctx context.Context, suffix string) ([]string, error) {
	pattern := s.prefix + ":{*}" + suffix
	seen := map[string]bool{}
	scan := func(ctx context.Context, c redis.Cmdable) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			if t, ok := s.tenantOfKey(it.Val(), suffix); ok {
				seen[t] = true
				if len(seen) > maxTenants {
					return fmt.Errorf("more than %d tenants", maxTenants)
				}
			}
		}
		return it.Err()
	}
	var err error
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		// ForEachMaster runs in parallel; the scans share one set.
		var mu sync.Mutex
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, c)
		})
	} else {
		err = scan(ctx, s.client)
	}
	if err != nil {
		return nil, fmt.Errorf("shardmap: list tenants: %w", err)
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	slices.Sort(out)
	return out, nil
}

// tenantOfKey undoes a tenant key of that suffix, as treesKey makes
// them: P:{escaped tenant}:trees.
func (s *RedisStore) tenantOfKey(key, suffix string) (string, bool) {
	rest, ok := strings.CutPrefix(key, s.prefix+":{")
	if !ok {
		return "", false
	}
	esc, ok := strings.CutSuffix(rest, "}"+suffix)
	if !ok || strings.ContainsAny(esc, "{}") {
		return "", false
	}
	return tagUnescaper.Replace(esc), true
}

var tagUnescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")

// maxNodeSwaps bounds UpdateNodes's retries: each lost race means another
// writer changed the registry, which operators do by hand.
const maxNodeSwaps = 16

// UpdateNodes reads the registry, lets change edit a copy, and writes it
// back with compare-and-set, again from a fresh read when another writer
// won. An error from change ends it unwritten. It returns what it wrote.
func UpdateNodes(ctx context.Context, store NodeStore, change func(*Nodes) error) (*Nodes, error) {
	for range maxNodeSwaps {
		cur, err := store.Nodes(ctx)
		if err != nil {
			return nil, err
		}
		next := cur.Clone()
		if err := change(next); err != nil {
			return nil, err
		}
		err = store.SwapNodes(ctx, next, cur.Version)
		if errors.Is(err, ErrNodesConflict) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return next, nil
	}
	return nil, fmt.Errorf("shardmap: the node registry kept changing during %d attempts to write it", maxNodeSwaps)
}
