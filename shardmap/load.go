package shardmap

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The load signal: each proxy counts statements and rows written per slot
// of each tree and adds its deltas, every few seconds, into per-tree time
// buckets in Redis (AddLoad); a reader sums the last complete buckets over
// every proxy and divides by their span (TreeLoad). A bucket expires by
// itself, so a proxy that stops publishing ages out within LoadRetention.
const (
	// LoadBucket is the width of one bucket. Every proxy and reader of a
	// deployment must agree on it, so it is not a flag.
	LoadBucket = 5 * time.Second
	// LoadWindow is the span TreeLoad averages over: the last complete
	// buckets before now.
	LoadWindow = 30 * time.Second
	// LoadRetention is how long a bucket lives after its end.
	LoadRetention = 2 * LoadWindow
	// loadChunk bounds the commands of one pipeline round trip.
	loadChunk = 1024
)

// SlotRate is the load of one slot, per second, summed over every proxy.
type SlotRate struct {
	Reads  float64 `json:"reads_per_s"`        // statements that only read
	Writes float64 `json:"writes_per_s"`       // statements that write (INSERT, UPDATE, DELETE, COPY FROM)
	Rows   float64 `json:"rows_written_per_s"` // rows those statements wrote
}

// Add returns the sum of two rates.
func (r SlotRate) Add(o SlotRate) SlotRate {
	return SlotRate{Reads: r.Reads + o.Reads, Writes: r.Writes + o.Writes, Rows: r.Rows + o.Rows}
}

// TreeLoad is a tree's per-slot load over the window [From, To).
type TreeLoad struct {
	Tenant string
	Tree   string
	From   time.Time
	To     time.Time
	// Slots has one entry per slot of the tree, by slot number.
	Slots []SlotRate
}

// Empty reports whether no statement of the tree was counted in the
// window: no proxy counted any, or none published (counting off), so a
// caller that orders shards by load falls back to another order.
func (l *TreeLoad) Empty() bool {
	for _, r := range l.Slots {
		if r != (SlotRate{}) {
			return false
		}
	}
	return true
}

// ByShard sums the slots' rates per owning shard of m; a shard owning no
// slot is absent.
func (l *TreeLoad) ByShard(m *Map) map[int]SlotRate {
	out := make(map[int]SlotRate)
	for s, idx := range m.Slots {
		if s < len(l.Slots) {
			out[idx] = out[idx].Add(l.Slots[s])
		}
	}
	return out
}

// ByNode sums the slots' rates per node of m's owning shards.
func (l *TreeLoad) ByNode(m *Map) map[string]SlotRate {
	out := make(map[string]SlotRate)
	for idx, r := range l.ByShard(m) {
		n := m.Shards[idx].Node
		out[n] = out[n].Add(r)
	}
	return out
}

// SlotDelta is what one proxy counted for one slot since its last
// publication.
type SlotDelta struct {
	Slot   int
	Reads  uint64
	Writes uint64
	Rows   uint64
}

// LoadReader reads the load signal. RedisStore implements it.
type LoadReader interface {
	// TreeLoad returns the per-slot rates of tree (its own name, not its
	// colocation group's) over the LoadWindow of complete buckets before
	// now; slotCount sizes Slots, and a slot beyond it is ignored.
	TreeLoad(ctx context.Context, tenant, tree string, slotCount int, now time.Time) (*TreeLoad, error)
}

// LoadWriter publishes a proxy's deltas. RedisStore implements it.
type LoadWriter interface {
	// AddLoad adds deltas into the bucket that holds at (the
	// publisher's now).
	AddLoad(ctx context.Context, tenant, tree string, at time.Time, deltas []SlotDelta) error
}

var (
	_ LoadReader = (*RedisStore)(nil)
	_ LoadWriter = (*RedisStore)(nil)
)

// loadKey is the bucket of tree that starts at bucket*LoadBucket (unix):
//
//	P:{T}:load:<tree>:<bucket>  hash: "r<slot>", "w<slot>", "n<slot>" ->
//	                            reads, writes, rows written, summed over
//	                            proxies; expires LoadRetention after its end
func (s *RedisStore) loadKey(tenant, tree string, bucket int64) string {
	return s.tenantTag(tenant) + ":load:" + tree + ":" + strconv.FormatInt(bucket, 10)
}

func loadBucketOf(t time.Time) int64 { return t.Unix() / int64(LoadBucket/time.Second) }

// AddLoad implements LoadWriter: HINCRBY per non-zero counter, in
// pipelines of at most loadChunk commands, each ending with the bucket's
// expiry so that a bucket never outlives LoadRetention even if a later
// chunk fails.
func (s *RedisStore) AddLoad(ctx context.Context, tenant, tree string, at time.Time, deltas []SlotDelta) error {
	b := loadBucketOf(at)
	key := s.loadKey(tenant, tree, b)
	end := time.Unix((b+1)*int64(LoadBucket/time.Second), 0)
	ttl := end.Sub(at) + LoadRetention
	pipe := s.client.Pipeline()
	n := 0
	flush := func() error {
		if n == 0 {
			return nil
		}
		pipe.Expire(ctx, key, ttl)
		_, err := pipe.Exec(ctx)
		n = 0
		if err != nil {
			return fmt.Errorf("shardmap: add load of %s/%s: %w", tenant, tree, err)
		}
		return nil
	}
	add := func(prefix byte, slot int, v uint64) error {
		if v == 0 {
			return nil
		}
		pipe.HIncrBy(ctx, key, string(prefix)+strconv.Itoa(slot), int64(v))
		if n++; n >= loadChunk {
			return flush()
		}
		return nil
	}
	for _, d := range deltas {
		for _, f := range []struct {
			p byte
			v uint64
		}{{'r', d.Reads}, {'w', d.Writes}, {'n', d.Rows}} {
			if err := add(f.p, d.Slot, f.v); err != nil {
				return err
			}
		}
	}
	return flush()
}

// TreeLoad implements LoadReader.
func (s *RedisStore) TreeLoad(ctx context.Context, tenant, tree string, slotCount int, now time.Time) (*TreeLoad, error) {
	buckets := int64(LoadWindow / LoadBucket)
	last := loadBucketOf(now) - 1 // the bucket now is in is not complete
	first := last - buckets + 1
	step := int64(LoadBucket / time.Second)
	l := &TreeLoad{
		Tenant: tenant, Tree: tree,
		From:  time.Unix(first*step, 0),
		To:    time.Unix((last+1)*step, 0),
		Slots: make([]SlotRate, slotCount),
	}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, 0, buckets)
	for b := first; b <= last; b++ {
		cmds = append(cmds, pipe.HGetAll(ctx, s.loadKey(tenant, tree, b)))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("shardmap: read load of %s/%s: %w", tenant, tree, err)
	}
	per := 1 / l.To.Sub(l.From).Seconds()
	for _, c := range cmds {
		for f, v := range c.Val() {
			if len(f) < 2 {
				continue
			}
			slot, err := strconv.Atoi(f[1:])
			if err != nil || slot < 0 || slot >= slotCount {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				continue
			}
			r := float64(n) * per
			switch f[0] {
			case 'r':
				l.Slots[slot].Reads += r
			case 'w':
				l.Slots[slot].Writes += r
			case 'n':
				l.Slots[slot].Rows += r
			}
		}
	}
	return l, nil
}
