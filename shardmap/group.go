package shardmap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// A colocation group is a set of trees of one tenant that share one shard
// map: the same slot -> shard assignment, the same shards on the same nodes,
// one epoch. Shard index N of every member is the table of that name in
// schema lattice_sNNNN on the one node the map gives N, so rows with equal
// keys are on one node, in one schema.
//
// A group is named after the tree it was formed from (the tree the first
// colocate_with named). Its map and its coordination keys (migrations,
// reshard intent, lease, acknowledgements) are that name's, which is why
// forming a group moves nothing: the first tree's map becomes the group's.
// The name stays the group's when that tree is dropped, so while the group
// lives no new tree can take it (ErrNameInUse). Dropping the last member
// drops the group.

var (
	// ErrNameInUse is returned by CreateTree for a name a colocation group
	// still uses for its map (its first tree was dropped, other members
	// live on).
	ErrNameInUse = errors.New("shardmap: name used by a colocation group")
	// ErrGroupBusy is returned by CreateColocated while the group has a
	// reshard, move or rebalance intent: the new member would miss its
	// migrations.
	ErrGroupBusy = errors.New("shardmap: colocation group is being resharded")
	// ErrKeyMismatch: the key types of two trees do not hash alike.
	ErrKeyMismatch = errors.New("shardmap: shard keys do not hash alike")
	// ErrSlotMismatch: two trees have different slot counts.
	ErrSlotMismatch = errors.New("shardmap: slot counts differ")
)

// MapName is the name the tree's map and coordination keys are stored
// under: its group's, or its own when it is alone.
func (t *Tree) MapName() string {
	if t.Group != "" {
		return t.Group
	}
	return t.Name
}

// Colocatable says whether a tree keyed and slotted like t can join the
// group of anchor: int2, int4 and int8 hash alike (hashint8extended of the
// value cast to int8), text and varchar alike, uuid only with uuid; KeyType
// is already that family. The slot counts must be equal, or one slot would
// be two different slots.
func Colocatable(t, anchor *Tree) error {
	if t.KeyType != anchor.KeyType {
		return fmt.Errorf("%w: %s is keyed by %s (%s), %s by %s (%s)", ErrKeyMismatch,
			t.Name, t.KeyColumn, t.KeyType, anchor.Name, anchor.KeyColumn, anchor.KeyType)
	}
	if t.SlotCount != anchor.SlotCount {
		return fmt.Errorf("%w: %s has %d slots, %s %d", ErrSlotMismatch, t.Name, t.SlotCount, anchor.Name, anchor.SlotCount)
	}
	return nil
}

// Colocated reports whether trees a and b of the view are in one
// colocation group, so that their rows of equal keys share shard, node and
// schema in the view's maps (a tree is colocated with itself). False when
// either is not a tree of the view.
func (v *View) Colocated(a, b string) bool {
	ta, tb := v.Trees[a], v.Trees[b]
	return ta != nil && tb != nil && ta.MapName() == tb.MapName()
}

// GroupMap is the map tree shares with its group (its own map when it is
// alone); nil when it is not a tree of the view. Every member's entry in
// Maps is this map at the same epoch, named after the member (Map.Tree).
func (v *View) GroupMap(tree string) *Map { return v.Maps[tree] }

// Members lists, sorted, the trees of the view that share tree's map,
// tree included; nil when it is not a tree of the view.
func (v *View) Members(tree string) []string {
	t := v.Trees[tree]
	if t == nil {
		return nil
	}
	var out []string
	for name, u := range v.Trees {
		if u.MapName() == t.MapName() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func (s *RedisStore) groupKey(tenant, group string) string {
	return s.tenantTag(tenant) + ":group:" + group
}

var (
	// KEYS: trees, group map, group reshard intent, group members. ARGV:
	// name, tree JSON, anchor name, anchor JSON as read, anchor JSON with
	// its group set ("" when unchanged), expected epoch, channel, event.
	// Returns 0 if the tree exists, -1 when the anchor or the map changed,
	// -2 while an intent runs.
	colocateScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
if redis.call('HGET', KEYS[1], ARGV[3]) ~= ARGV[4] then return -1 end
if redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[6] then return -1 end
if redis.call('EXISTS', KEYS[3]) == 1 then return -2 end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], ARGV[3], ARGV[5]) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[3], ARGV[1])
redis.call('PUBLISH', ARGV[7], ARGV[8])
return 1`)

	// KEYS: trees, group members, the member's own acknowledgements, then
	// the map and coordination keys, dropped with the last member. ARGV:
	// name, group ("" for a tree alone), channel, event. Returns 0 if the
	// tree is gone, -1 when a tree alone has just become a group's first
	// member (read it again).
	dropScript = redis.NewScript(`
if ARGV[2] == '' and redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('SREM', KEYS[2], ARGV[1])
if ARGV[2] ~= '' and ARGV[2] ~= ARGV[1] then redis.call('DEL', KEYS[3]) end
if redis.call('SCARD', KEYS[2]) == 0 then
  for i = 4, #KEYS do redis.call('DEL', KEYS[i]) end
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1`)
)

// CreateColocated registers t as a member of anchor's colocation group,
// whose map the caller read at epoch and built t's shards by: t.Group must
// be anchor.MapName(). anchor is the registry entry as read; a tree alone
// becomes its group's first member in the same step. ErrExists if t is
// registered; ErrConflict when anchor's entry or the map changed since
// (build again); ErrGroupBusy while the group has an intent. Publishes a
// "tree" event.
func (s *RedisStore) CreateColocated(ctx context.Context, t, anchor *Tree, epoch uint64) error {
	g := anchor.MapName()
	if t.Tenant != anchor.Tenant || t.Group != g {
		return fmt.Errorf("shardmap: colocate %s/%s (group %q) with %s/%s (group %q)", t.Tenant, t.Name, t.Group, anchor.Tenant, anchor.Name, g)
	}
	if t.SlotCount != anchor.SlotCount || t.KeyType != anchor.KeyType {
		return fmt.Errorf("shardmap: colocate %s/%s: %w", t.Tenant, t.Name, Colocatable(t, anchor))
	}
	tj, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("shardmap: encode tree %s/%s: %w", t.Tenant, t.Name, err)
	}
	aj, err := json.Marshal(anchor)
	if err != nil {
		return fmt.Errorf("shardmap: encode tree %s/%s: %w", anchor.Tenant, anchor.Name, err)
	}
	var next []byte
	if anchor.Group == "" {
		a := *anchor
		a.Group = g
		if next, err = json.Marshal(&a); err != nil {
			return fmt.Errorf("shardmap: encode tree %s/%s: %w", anchor.Tenant, anchor.Name, err)
		}
	}
	n, err := colocateScript.Run(ctx, s.client,
		[]string{s.treesKey(t.Tenant), s.mapKey(t.Tenant, g), s.reshardKey(t.Tenant, g), s.groupKey(t.Tenant, g)},
		t.Name, tj, anchor.Name, aj, next, strconv.FormatUint(epoch, 10),
		s.channel, s.event(EventTree, t.Tenant, t.Name, 0)).Int()
	if err != nil {
		return fmt.Errorf("shardmap: colocate tree %s/%s with %s: %w", t.Tenant, t.Name, anchor.Name, err)
	}
	switch n {
	case 0:
		return fmt.Errorf("shardmap: colocate tree %s/%s: %w", t.Tenant, t.Name, ErrExists)
	case -1:
		return fmt.Errorf("shardmap: colocate tree %s/%s with %s at epoch %d: %w", t.Tenant, t.Name, anchor.Name, epoch, ErrConflict)
	case -2:
		return fmt.Errorf("shardmap: colocate tree %s/%s with group %s: %w", t.Tenant, t.Name, g, ErrGroupBusy)
	}
	return nil
}

// DeleteTree implements Store. A member of a group leaves it; the last
// member takes the group's map and coordination keys with it.
func (s *RedisStore) DeleteTree(ctx context.Context, tenant, name string) error {
	for attempt := 0; ; attempt++ {
		t, err := s.Tree(ctx, tenant, name)
		if err != nil {
			return fmt.Errorf("shardmap: delete tree %s/%s: %w", tenant, name, err)
		}
		g := t.MapName()
		n, err := dropScript.Run(ctx, s.client,
			[]string{s.treesKey(tenant), s.groupKey(tenant, g), s.acksKey(tenant, name), s.mapKey(tenant, g), s.migsKey(tenant, g),
				s.reshardKey(tenant, g), s.leaseKey(tenant, g), s.acksKey(tenant, g)},
			name, t.Group, s.channel, s.event(EventTree, tenant, name, 0)).Int()
		if err != nil {
			return fmt.Errorf("shardmap: delete tree %s/%s: %w", tenant, name, err)
		}
		switch {
		case n == 0:
			return fmt.Errorf("shardmap: delete tree %s/%s: %w", tenant, name, ErrNotFound)
		case n == -1 && attempt < 3:
			continue // it just became a group's first member: its entry names the group now
		case n == -1:
			return fmt.Errorf("shardmap: delete tree %s/%s: %w", tenant, name, ErrConflict)
		}
		return nil
	}
}
