package shardmap

import (
	"context"
	"errors"
	"time"
)

var (
	// ErrNotFound is returned when a tree (or its map) is not registered.
	ErrNotFound = errors.New("shardmap: not found")
	// ErrExists is returned by CreateTree when the tree is already registered.
	ErrExists = errors.New("shardmap: already exists")
	// ErrConflict is returned by SwapMap when the stored epoch is not the
	// expected one: another writer won the compare-and-set.
	ErrConflict = errors.New("shardmap: epoch conflict")
)

// EventKind says what changed.
type EventKind string

const (
	// EventMap: a tree's map changed; Epoch is the new epoch.
	EventMap EventKind = "map"
	// EventTree: a tree was created, altered or dropped; Epoch is 0.
	EventTree EventKind = "tree"
)

// Event announces a change to every subscriber. Events can be lost (a
// subscriber that is reconnecting misses them), so a consumer also re-reads
// on a timer.
type Event struct {
	Kind   EventKind `json:"kind"`
	Tenant string    `json:"tenant"`
	Tree   string    `json:"tree"`
	Epoch  uint64    `json:"epoch,omitempty"`
	// Carried is the map itself, on a map event of a store that sends it
	// (RedisStore), so that a proxy routes by it without reading it.
	Carried *CarriedMap `json:"-"`
}

// CarriedMap is the map an event carries, as JSON, with the creation time
// of the tree it was written for, read with the map's write: a tree
// dropped and created again starts its epochs over, so a map is installed
// only into a view of the same tree (Cache).
type CarriedMap struct {
	Map     []byte
	Created time.Time
	// decode is the store's, which keeps what it decoded (the proxy that
	// wrote the map has it already); nil: plain JSON.
	decode func(raw []byte) (*Map, error)
}

// Store keeps the tree registry and the shard maps of every tenant.
type Store interface {
	// Trees lists a tenant's trees sorted by name.
	Trees(ctx context.Context, tenant string) ([]*Tree, error)
	// Tree returns one registry entry, or ErrNotFound.
	Tree(ctx context.Context, tenant, name string) (*Tree, error)
	// Map returns the map stored under name, or ErrNotFound: a tree's, by
	// Tree.MapName (its colocation group's, for a member of one).
	Map(ctx context.Context, tenant, tree string) (*Map, error)
	// MapEpochs returns the stored epoch of each map named, in one round
	// trip, without the maps; a map not found has none in the result.
	MapEpochs(ctx context.Context, tenant string, names []string) (map[string]uint64, error)
	// CreateTree registers t with its first map m in one step and publishes
	// a "tree" event; ErrExists if t is already registered. A zero t.Created
	// is set to now: it is how a Cache tells a re-created tree (whose epochs
	// start over) from the one that was dropped.
	CreateTree(ctx context.Context, t *Tree, m *Map) error
	// CreateColocated registers t in the colocation group of anchor, whose
	// map it shares (group.go).
	CreateColocated(ctx context.Context, t, anchor *Tree, epoch uint64) error
	// SwapTree replaces the registry entry prev with t only if the stored
	// entry is still prev (compare-and-set), not its map, and publishes a
	// "tree" event; ErrConflict when another writer changed it, ErrNotFound
	// if it is gone. It is the only way an entry changes, so that no writer
	// (DDL appending to t.DDL, a tree option, the coordinator's shard
	// count) loses another's change.
	SwapTree(ctx context.Context, t, prev *Tree) error
	// DeleteTree removes a tree and publishes a "tree" event; ErrNotFound if
	// it is not registered. Its map and coordination keys go with it, or,
	// for a member of a colocation group, with the group's last member.
	DeleteTree(ctx context.Context, tenant, name string) error
	// SwapMap stores m only if the stored epoch equals expected; on success
	// the stored (and m's) epoch is expected+1 and a "map" event is
	// published. ErrConflict otherwise, ErrNotFound if the tree is gone.
	SwapMap(ctx context.Context, m *Map, expected uint64) error
	// Subscribe delivers events until ctx ends, then closes the channel. The
	// subscription is active when Subscribe returns and reconnects by itself
	// after the server restarts; events published while it was down are lost.
	Subscribe(ctx context.Context) (<-chan Event, error)
	// Close releases the connections.
	Close() error
}
