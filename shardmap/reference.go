package shardmap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/redis/go-redis/v9"
)

// A reference table is a small ordinary table with a full copy, under its
// own name in public, in the tenant's database on every node that Nodes
// lists (docs/DESIGN.md, "Reference tables"). Statements read any one
// copy and write every copy in one transaction across nodes. The registry
// entry lives in Redis beside the trees (one hash per tenant); the nodes
// hold what the writes are checked against (lattice_meta.reference_tables
// on the catalog node, read by each copy's fence trigger), so a proxy
// whose entry is stale gets LT001 rather than writing a wrong set of
// copies.

// Reference is the registry entry of a reference table.
type Reference struct {
	Tenant string `json:"tenant"`
	Name   string `json:"name"`
	// Nodes hold a complete copy, sorted; writes go to every one of them.
	Nodes   []string  `json:"nodes"`
	Created time.Time `json:"created"`
	// Epoch counts the entry's writes (PutReference). Proxies acknowledge
	// it as they do a map's, under ReferenceAckName.
	Epoch uint64 `json:"epoch,omitempty"`
	// ChangingSince marks copies about to be added or dropped (zero: none):
	// proxies hold new writes of the table until the entry changes again,
	// so that none carries a list of copies the fence is about to refuse.
	ChangingSince time.Time `json:"changing_since,omitzero"`
	// Dropping are nodes whose copies an undistribution still has to drop:
	// no statement reads or writes them any more, and a retry drops them.
	Dropping []string `json:"dropping,omitempty"`
}

// MaxChange is how long a change of a reference table's copies holds its
// writes at most. A mark older than that was left by a change that did
// not finish (its proxy died): writes go on, checked by the fence.
const MaxChange = 30 * time.Second

// Changing reports whether r's copies are changing at now, and until when
// its writes are held.
func (r *Reference) Changing(now time.Time) (time.Time, bool) {
	if r.ChangingSince.IsZero() {
		return time.Time{}, false
	}
	until := r.ChangingSince.Add(MaxChange)
	return until, now.Before(until)
}

// ReferenceAckName is the name a reference table's entry is acknowledged
// under, beside the trees' maps. The NUL byte keeps it apart from every
// table name, which PostgreSQL never lets hold one.
func ReferenceAckName(table string) string { return "\x00reference:" + table }

// Holds reports whether node has a copy of r.
func (r *Reference) Holds(node string) bool { return slices.Contains(r.Nodes, node) }

// ReferenceStore is implemented by a Store that keeps reference tables
// (RedisStore). A Cache over a Store without it sees none.
type ReferenceStore interface {
	// References lists a tenant's reference tables sorted by name.
	References(ctx context.Context, tenant string) ([]*Reference, error)
	// PutReference creates or replaces r's entry when the stored entry is
	// still prev (nil: none), and publishes a "tree" event; ErrConflict
	// otherwise. It sets r.Epoch to one past prev's.
	PutReference(ctx context.Context, r, prev *Reference) error
	// DeleteReference removes the entry if it is still prev, and publishes
	// a "tree" event; ErrConflict otherwise.
	DeleteReference(ctx context.Context, prev *Reference) error
}

// TenantsWithReferences lists, sorted, every tenant that has reference
// tables, for removing a node (which drops its copies): a tenant may have
// reference tables and no tree. An operator's command, as TenantsWithTrees.
func (s *RedisStore) TenantsWithReferences(ctx context.Context) ([]string, error) {
	return s.tenantsWith(ctx, ":references")
}

// ErrIsTree: a reference table cannot take the name of a tree, nor a tree
// the name of a reference table.
var ErrIsTree = errors.New("shardmap: the name is a tree's")

func (s *RedisStore) referencesKey(tenant string) string { return s.tenantTag(tenant) + ":references" }

// KEYS: references, trees, the entry's acknowledgements. ARGV: name, entry
// as stored ("" for none), new entry ("" to delete), channel, event.
// Returns -1 on a conflict, -2 when the name is a tree's. A deleted entry
// takes its acknowledgements along: one made again under the name starts
// its epochs over.
var referenceScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur == false then cur = '' end
if cur ~= ARGV[2] then return -1 end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[3])
else
  if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return -2 end
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1`)

// References implements ReferenceStore.
func (s *RedisStore) References(ctx context.Context, tenant string) ([]*Reference, error) {
	vals, err := s.client.HGetAll(ctx, s.referencesKey(tenant)).Result()
	if err != nil {
		return nil, fmt.Errorf("shardmap: list reference tables of %s: %w", tenant, err)
	}
	out := make([]*Reference, 0, len(vals))
	for name, v := range vals {
		r := &Reference{}
		if err := json.Unmarshal([]byte(v), r); err != nil {
			return nil, fmt.Errorf("shardmap: decode reference table %s/%s: %w", tenant, name, err)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func encodeReference(r *Reference) (string, error) {
	if r == nil {
		return "", nil
	}
	b, err := json.Marshal(r)
	return string(b), err
}

// PutReference implements ReferenceStore.
func (s *RedisStore) PutReference(ctx context.Context, r, prev *Reference) error {
	if r.Created.IsZero() {
		r.Created = time.Now().UTC()
	}
	r.Nodes = slices.Sorted(slices.Values(r.Nodes))
	r.Epoch = 1
	if prev != nil {
		r.Epoch = prev.Epoch + 1
	}
	return s.swapReference(ctx, r.Tenant, r.Name, r, prev)
}

// DeleteReference implements ReferenceStore.
func (s *RedisStore) DeleteReference(ctx context.Context, prev *Reference) error {
	return s.swapReference(ctx, prev.Tenant, prev.Name, nil, prev)
}

func (s *RedisStore) swapReference(ctx context.Context, tenant, name string, r, prev *Reference) error {
	pj, err := encodeReference(prev)
	if err != nil {
		return err
	}
	rj, err := encodeReference(r)
	if err != nil {
		return err
	}
	n, err := referenceScript.Run(ctx, s.client, []string{s.referencesKey(tenant), s.treesKey(tenant), s.acksKey(tenant, ReferenceAckName(name))},
		name, pj, rj, s.channel, s.event(EventTree, tenant, name, 0)).Int()
	if err != nil {
		return fmt.Errorf("shardmap: write reference table %s/%s: %w", tenant, name, err)
	}
	switch n {
	case -1:
		return fmt.Errorf("shardmap: write reference table %s/%s: %w", tenant, name, ErrConflict)
	case -2:
		return fmt.Errorf("shardmap: reference table %s/%s: %w", tenant, name, ErrIsTree)
	}
	return nil
}

// Reference is the view's entry of a reference table, nil when name is none.
func (v *View) Reference(name string) *Reference { return v.References[name] }

// loadReferences reads a tenant's reference tables when the store keeps them.
func (c *Cache) loadReferences(ctx context.Context, tenant string) (map[string]*Reference, error) {
	rs, ok := c.store.(ReferenceStore)
	if !ok {
		return nil, nil
	}
	list, err := rs.References(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*Reference, len(list))
	for _, r := range list {
		out[r.Name] = r
	}
	return out, nil
}

// sameReferences compares two views' reference tables by their JSON.
func sameReferences(a, b map[string]*Reference) bool {
	if len(a) != len(b) {
		return false
	}
	for name, r := range a {
		u, ok := b[name]
		if !ok {
			return false
		}
		rj, _ := encodeReference(r)
		uj, _ := encodeReference(u)
		if rj != uj {
			return false
		}
	}
	return true
}
