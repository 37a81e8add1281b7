package shardmap

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// MigrationKind says whether a migration splits a shard or folds one away.
type MigrationKind string

const (
	Split MigrationKind = "split" // moves some slots of Source to a new shard Target
	Fold  MigrationKind = "fold"  // moves every slot of Source (the donor) into Target (the survivor)
	Move  MigrationKind = "move"  // moves shard Source, slots and index unchanged, to TargetNode; Target == Source
	// Resize rewrites shard Source into a new shard Target on the same
	// node, created with the tree's current layout (lattice_resize): every
	// slot of Source moves, and Source retires as a fold's donor does.
	Resize MigrationKind = "resize"
)

// MigrationPhase is where a migration is in docs/DESIGN.md section 5's pipeline.
type MigrationPhase string

const (
	PhasePrepare MigrationPhase = "prepare" // recorded; nothing created yet, or being created
	PhaseCopy    MigrationPhase = "copy"    // shadow copy under the exported snapshot
	PhaseDrain   MigrationPhase = "drain"   // streaming until the lag is small
	PhaseFreeze  MigrationPhase = "freeze"  // slots frozen, fence installed, final drain
	PhaseFlip    MigrationPhase = "flip"    // map points the slots at the target; the move is being verified
	// PhaseVerifyFailed: the target did not hold what the source held at the
	// flip; the source keeps its rows until an operator repairs it.
	PhaseVerifyFailed MigrationPhase = "verify_failed"
	PhaseRelease      MigrationPhase = "release" // moved rows, publication and slot removed
	PhaseDone         MigrationPhase = "done"
)

// Migration is one split or fold as recorded in the store before anything
// is created, so that everything it makes can be found after a crash.
type Migration struct {
	ID         string         `json:"id"`
	Tenant     string         `json:"tenant"`
	Tree       string         `json:"tree"`
	Kind       MigrationKind  `json:"kind"`
	Source     int            `json:"source"`
	SourceNode string         `json:"source_node"`
	Target     int            `json:"target"`
	TargetNode string         `json:"target_node"`
	Slots      [][2]int       `json:"slots"`
	Phase      MigrationPhase `json:"phase"`
	Created    time.Time      `json:"created"`
	Updated    time.Time      `json:"updated"`
	RowsCopied int64          `json:"rows_copied"`
	LagBytes   int64          `json:"lag_bytes"`
	Freezes    int            `json:"freezes"` // freeze attempts, rolled back ones included
	LastError  string         `json:"last_error,omitempty"`
	// Verify is the last verification of the move, nil before one.
	Verify *Verification `json:"verify,omitempty"`
	// Compare: the move froze with its target's write log, so it is
	// compared before its release by every run that resumes it, one
	// started with --verify-moves=false included (migrator/verify.go).
	Compare bool `json:"compare,omitempty"`
	// Origin names the autonomic mechanism that started the migration
	// (OriginAutosplit, OriginAutoheal), "" for an operator's (a reshard,
	// a rebalance, a move): a shrink waits for healing's folds.
	Origin string `json:"origin,omitempty"`
}

// Origins of autonomic migrations (migrator/autonomic.go).
const (
	OriginAutosplit = "autosplit"
	OriginAutoheal  = "autoheal"
)

// Verification is the comparison of a move's slots on its source and its
// target as of the flip (migrator/verify.go).
type Verification struct {
	// Exact: compared as of the flip, under snapshots taken inside the
	// freeze or, when a crash after the flip lost them (FromLog), from
	// the target's write log.
	Exact   bool  `json:"exact"`
	FromLog bool  `json:"from_log,omitempty"`
	Rows    int64 `json:"rows"` // rows compared on the source
	// BytesScanned is the size of the tables the comparison read.
	BytesScanned int64      `json:"bytes_scanned,omitempty"`
	Seconds      float64    `json:"seconds"`
	Differ       []SlotDiff `json:"differ,omitempty"`
	// Rows differing under the snapshots, at most a bound, for the repair.
	DiffRows []RowDiff `json:"diff_rows,omitempty"`
	// DiffRowsCut: more rows differed than were kept.
	DiffRowsCut bool `json:"diff_rows_cut,omitempty"`
	// Written are the keys of the differing slots that clients wrote on
	// the target between the flip and the freeze of those slots: their
	// rows are newer than the source's, and a repair keeps them.
	Written []RowDiff `json:"written,omitempty"`
	// WrittenRead: Written was read (the differing slots were frozen first).
	WrittenRead bool `json:"written_read,omitempty"`
	// Repaired are the slots lattice_repair_migration made agree.
	Repaired []int     `json:"repaired,omitempty"`
	At       time.Time `json:"at"`
}

// SlotDiff is one slot whose rows differ between source and target.
type SlotDiff struct {
	Slot       int   `json:"slot"`
	SourceRows int64 `json:"source_rows"`
	TargetRows int64 `json:"target_rows"`
}

// RowDiff is one primary key whose row differs: Key is the key columns
// as a row literal.
type RowDiff struct {
	Slot int    `json:"slot"`
	Key  string `json:"key"`
	// Tree names the table of a colocation group's migration, which
	// compares every member; empty for a tree alone.
	Tree string `json:"tree,omitempty"`
}

// Reshard is a tree's persisted reshard intent.
type Reshard struct {
	OpID    string    `json:"op_id"`
	Tenant  string    `json:"tenant"`
	Tree    string    `json:"tree"`
	Target  int       `json:"target"`
	From    int       `json:"from"` // distinct shards when it started
	Grow    bool      `json:"grow"`
	Phase   string    `json:"phase"`
	Started time.Time `json:"started"`
	// Rebalance says what the intent is for; the fields below are a
	// rebalance's, a drain's or a move's (intent.go).
	Rebalance
}

// EventIntent announces that a reshard or rebalance intent was stored
// (StartReshard), so that every coordinator plans at once; Tree names the
// intent's map, Epoch is 0. Views do not change with it.
const EventIntent EventKind = "intent"

// Coordination is the store's side for migrations and the proxies that must
// acknowledge them. RedisStore implements it.
type Coordination interface {
	// PutMigration creates a migration record in PhasePrepare, or replaces
	// one. A record in a later phase is written only over a stored one
	// (ErrNotFound otherwise): a migration whose record was lost with
	// Redis's data stops at its next phase change instead of running on
	// beside `lattice recover-map`.
	PutMigration(ctx context.Context, m *Migration) error
	// Migrations lists a tree's migration records, oldest first.
	Migrations(ctx context.Context, tenant, tree string) ([]*Migration, error)
	// DeleteMigration removes a record; a missing one is fine.
	DeleteMigration(ctx context.Context, tenant, tree, id string) error

	// StartReshard stores r unless the tree has a reshard already, which it
	// returns instead (r is stored when it returns nil), and announces a
	// stored one with an EventIntent.
	StartReshard(ctx context.Context, r *Reshard) (*Reshard, error)
	// Reshard returns the tree's reshard, or ErrNotFound.
	Reshard(ctx context.Context, tenant, tree string) (*Reshard, error)
	// FinishReshard removes the reshard if its operation id is opID.
	FinishReshard(ctx context.Context, tenant, tree, opID string) error
	// Reshards lists every running reshard of every tenant.
	Reshards(ctx context.Context) ([]*Reshard, error)

	// AcquireLease takes or renews the lease of a tree's coordinator for
	// owner; false if another owner holds it.
	AcquireLease(ctx context.Context, tenant, tree, owner string, ttl time.Duration) (bool, error)
	// ReleaseLease gives the lease up if owner holds it.
	ReleaseLease(ctx context.Context, tenant, tree, owner string) error

	// RegisterProxy (re)registers a proxy as live until the given time: its
	// heartbeat.
	RegisterProxy(ctx context.Context, id string, until time.Time) error
	// ServeTenants registers proxy id, until the given time, as one that
	// routes the statements of tenants: the freezes and releases of their
	// trees wait for its acknowledgements. A proxy calls it before it first
	// reads a tenant's maps, and renews it with every heartbeat, before
	// RegisterProxy and to the same time, so that a proxy counted as live
	// is always counted for the tenants it serves.
	ServeTenants(ctx context.Context, id string, until time.Time, tenants ...string) error
	// UnregisterProxy removes a proxy that shuts down cleanly, from the
	// registry and from the tenants it served.
	UnregisterProxy(ctx context.Context, id string, tenants ...string) error
	// LiveProxies lists the proxies whose registration has not expired.
	LiveProxies(ctx context.Context) ([]string, error)
	// TenantProxies lists the proxies whose ServeTenants registration for
	// tenant has not expired: the ones a freeze waits for.
	TenantProxies(ctx context.Context, tenant string) ([]string, error)
	// AckEpoch records that proxy routes tree by a map of epoch or later.
	AckEpoch(ctx context.Context, tenant, tree, proxy string, epoch uint64) error
	// Acks returns each proxy's acknowledged epoch of tree.
	Acks(ctx context.Context, tenant, tree string) (map[string]uint64, error)
	// WatchAcks signals on the channel, until ctx ends, whenever a proxy's
	// acknowledgement of tree moves forward. Signals coalesce and can be
	// lost (a reconnect), so a waiter reads Lagging on a timer too.
	WatchAcks(ctx context.Context, tenant, tree string) (<-chan struct{}, error)
	// Lagging reads what a freeze polls for: the live proxies serving
	// tenant that have not acknowledged epoch of tree, and every live proxy.
	Lagging(ctx context.Context, tenant, tree string, epoch uint64) (Lag, error)
	// ClusterID names the Lattice deployment this store holds, created on
	// first use: a proxy's sessions on the nodes carry it, so that proxies
	// of another deployment sharing the nodes are told apart.
	ClusterID(ctx context.Context) (string, error)
}

// Lag is what Lagging reads, with every expiry judged at one instant.
type Lag struct {
	Lagging []string // live proxies serving the tenant, behind the epoch
	Live    []string // every live proxy, read before the tenant's
}

var _ Coordination = (*RedisStore)(nil)

// More keys of the RedisStore:
//
//	P:{T}:migs:<tree>     hash: migration id -> Migration JSON
//	P:{T}:reshard:<tree>  string: Reshard JSON
//	P:{T}:lease:<tree>    string: coordinator owner, with an expiry
//	P:{T}:acks:<tree>     hash: proxy id -> acknowledged epoch
//	P:{T}:autonomic:<tree> string: AutonomicStatus JSON, with an expiry (autonomic.go)
//	P:{T}:proxies         sorted set: id of a proxy that routes the tenant's
//	                      statements, scored by lease expiry (unix ms)
//	P:proxies             sorted set: proxy id scored by lease expiry (unix ms)
//	P:cluster-id          string: the deployment's id (ClusterID)
//	P:secret:<name>       string: a secret of the deployment, hex (DeploymentSecret)
//	P:reshard-index       hash: "tenant/tree" -> "<op id> <unix ms>" of the
//	                      tree's last StartReshard, so a coordinator finds
//	                      every running reshard without scanning keys
func (s *RedisStore) migsKey(tenant, tree string) string {
	return s.tenantTag(tenant) + ":migs:" + tree
}
func (s *RedisStore) reshardKey(tenant, tree string) string {
	return s.tenantTag(tenant) + ":reshard:" + tree
}
func (s *RedisStore) leaseKey(tenant, tree string) string {
	return s.tenantTag(tenant) + ":lease:" + tree
}
func (s *RedisStore) acksKey(tenant, tree string) string {
	return s.tenantTag(tenant) + ":acks:" + tree
}
func (s *RedisStore) tenantProxiesKey(tenant string) string {
	return s.tenantTag(tenant) + ":proxies"
}
func (s *RedisStore) proxiesKey() string   { return s.prefix + ":proxies" }
func (s *RedisStore) clusterIDKey() string { return s.prefix + ":cluster-id" }
func (s *RedisStore) reshardsKey() string  { return s.prefix + ":reshard-index" }

// reshardMember names a tree in the reshard index; a tenant name cannot
// contain '/', a tree name can, so the first '/' separates them.
func reshardMember(tenant, tree string) string { return tenant + "/" + tree }

// reshardIndexGrace is how long an index entry whose intent is missing is
// kept. StartReshard writes the entry before the intent (the index lives
// in another hash slot, so the two cannot be written at once), and a
// coordinator that lists the reshards in between must not drop it.
const reshardIndexGrace = time.Minute

var (
	// KEYS: lease. ARGV: owner, ttl ms. Returns 1 when owner holds the lease.
	leaseScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1`)

	// KEYS: lease. ARGV: owner.
	releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1`)

	// KEYS: reshard. ARGV: op id. Deletes only the operation named.
	finishReshardScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
if cjson.decode(cur)['op_id'] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1`)

	// KEYS: reshard index. ARGV: member, op id. Removes the member if its
	// entry names op id: a newer operation's entry stays.
	unindexOpScript = redis.NewScript(`
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and string.sub(v, 1, #ARGV[2] + 1) == ARGV[2] .. ' ' then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 1`)

	// KEYS: reshard index. ARGV: member, entry. Removes the member if its
	// entry is still the one read: a StartReshard since then keeps it.
	unindexEntryScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 1`)

	// KEYS: acks. ARGV: proxy, epoch. Acknowledgements only move forward;
	// each step forward is announced on the channel named like the key
	// (WatchAcks), so a freeze need not wait for its next poll.
	ackScript = redis.NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if tonumber(ARGV[2]) > cur then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('PUBLISH', KEYS[1], ARGV[2])
end
return 1`)
)

// PutMigration implements Coordination.
func (s *RedisStore) PutMigration(ctx context.Context, m *Migration) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	create := "0"
	if m.Phase == PhasePrepare {
		create = "1"
	}
	n, err := putMigrationScript.Run(ctx, s.client, []string{s.migsKey(m.Tenant, m.Tree)}, m.ID, b, create).Int()
	if err != nil {
		return fmt.Errorf("shardmap: write migration %s: %w", m.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("shardmap: write migration %s in phase %s: %w", m.ID, m.Phase, ErrNotFound)
	}
	return nil
}

// KEYS: migs. ARGV: id, record JSON, "1" if it may create the record.
var putMigrationScript = redis.NewScript(`
if ARGV[3] ~= '1' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1`)

// Migrations implements Coordination.
func (s *RedisStore) Migrations(ctx context.Context, tenant, tree string) ([]*Migration, error) {
	vals, err := s.client.HGetAll(ctx, s.migsKey(tenant, tree)).Result()
	if err != nil {
		return nil, fmt.Errorf("shardmap: read migrations of %s/%s: %w", tenant, tree, err)
	}
	out := make([]*Migration, 0, len(vals))
	for id, v := range vals {
		m := new(Migration)
		if err := json.Unmarshal([]byte(v), m); err != nil {
			return nil, fmt.Errorf("shardmap: decode migration %s: %w", id, err)
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *Migration) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// DeleteMigration implements Coordination.
func (s *RedisStore) DeleteMigration(ctx context.Context, tenant, tree, id string) error {
	if err := s.client.HDel(ctx, s.migsKey(tenant, tree), id).Err(); err != nil {
		return fmt.Errorf("shardmap: delete migration %s: %w", id, err)
	}
	return nil
}

// StartReshard implements Coordination.
func (s *RedisStore) StartReshard(ctx context.Context, r *Reshard) (*Reshard, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	// The index entry comes first: an intent without an entry would never
	// be found, and an entry without an intent is dropped by Reshards only
	// after reshardIndexGrace.
	if err := s.index(ctx, r.Tenant, r.Tree, r.OpID); err != nil {
		return nil, err
	}
	ok, err := s.client.SetNX(ctx, s.reshardKey(r.Tenant, r.Tree), b, 0).Result()
	if err != nil {
		return nil, fmt.Errorf("shardmap: write reshard of %s/%s: %w", r.Tenant, r.Tree, err)
	}
	if ok {
		// Every coordinator plans at once, not only this proxy's: the
		// intent may have come through a proxy that runs none. A lost
		// event costs a tick.
		if err := s.client.Publish(ctx, s.channel, s.event(EventIntent, r.Tenant, r.Tree, 0)).Err(); err != nil {
			slog.WarnContext(ctx, "shardmap: intent event not published; coordinators find it at their next tick", "tree", r.Tree, "tenant", r.Tenant, "err", err)
		}
		return nil, nil
	}
	cur, err := s.Reshard(ctx, r.Tenant, r.Tree)
	if errors.Is(err, ErrNotFound) {
		// Finished between the two calls: try once more.
		return s.StartReshard(ctx, r)
	}
	if err != nil {
		return nil, err
	}
	// The entry names the running operation again, so that its finish
	// removes it.
	return cur, s.index(ctx, r.Tenant, r.Tree, cur.OpID)
}

func (s *RedisStore) index(ctx context.Context, tenant, tree, opID string) error {
	entry := opID + " " + strconv.FormatInt(time.Now().UnixMilli(), 10)
	if err := s.client.HSet(ctx, s.reshardsKey(), reshardMember(tenant, tree), entry).Err(); err != nil {
		return fmt.Errorf("shardmap: write reshard of %s/%s: %w", tenant, tree, err)
	}
	return nil
}

// Reshard implements Coordination.
func (s *RedisStore) Reshard(ctx context.Context, tenant, tree string) (*Reshard, error) {
	v, err := s.client.Get(ctx, s.reshardKey(tenant, tree)).Result()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("shardmap: reshard of %s/%s: %w", tenant, tree, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("shardmap: read reshard of %s/%s: %w", tenant, tree, err)
	}
	r := new(Reshard)
	if err := json.Unmarshal([]byte(v), r); err != nil {
		return nil, fmt.Errorf("shardmap: decode reshard of %s/%s: %w", tenant, tree, err)
	}
	return r, nil
}

// FinishReshard implements Coordination.
func (s *RedisStore) FinishReshard(ctx context.Context, tenant, tree, opID string) error {
	if err := finishReshardScript.Run(ctx, s.client, []string{s.reshardKey(tenant, tree)}, opID).Err(); err != nil {
		return fmt.Errorf("shardmap: finish reshard of %s/%s: %w", tenant, tree, err)
	}
	return unindexOpScript.Run(ctx, s.client, []string{s.reshardsKey()}, reshardMember(tenant, tree), opID).Err()
}

// Reshards implements Coordination. An index entry whose intent is gone
// (a crash between the two writes, a dropped tree) is removed once it is
// older than reshardIndexGrace.
func (s *RedisStore) Reshards(ctx context.Context) ([]*Reshard, error) {
	entries, err := s.client.HGetAll(ctx, s.reshardsKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("shardmap: list reshards: %w", err)
	}
	members := slices.Sorted(maps.Keys(entries))
	var out []*Reshard
	for _, mem := range members {
		tenant, tree, ok := strings.Cut(mem, "/")
		if !ok {
			continue
		}
		r, err := s.Reshard(ctx, tenant, tree)
		if errors.Is(err, ErrNotFound) {
			if indexEntryAge(entries[mem]) > reshardIndexGrace {
				unindexEntryScript.Run(ctx, s.client, []string{s.reshardsKey()}, mem, entries[mem])
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// indexEntryAge is how long ago an index entry was written; an entry it
// cannot read counts as old.
func indexEntryAge(entry string) time.Duration {
	_, ms, _ := strings.Cut(entry, " ")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return reshardIndexGrace + 1
	}
	return time.Since(time.UnixMilli(n))
}

// AcquireLease implements Coordination.
func (s *RedisStore) AcquireLease(ctx context.Context, tenant, tree, owner string, ttl time.Duration) (bool, error) {
	n, err := leaseScript.Run(ctx, s.client, []string{s.leaseKey(tenant, tree)}, owner, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("shardmap: lease of %s/%s: %w", tenant, tree, err)
	}
	return n == 1, nil
}

// ReleaseLease implements Coordination.
func (s *RedisStore) ReleaseLease(ctx context.Context, tenant, tree, owner string) error {
	return releaseScript.Run(ctx, s.client, []string{s.leaseKey(tenant, tree)}, owner).Err()
}

// RegisterProxy implements Coordination. The expiry only moves forward
// (ZADD GT): a renewal can reach Redis seconds after a newer one, when it
// was retried after a read timeout or sat unacknowledged in the kernel of
// a proxy whose packets to Redis were dropped, and it must not shorten the
// registration the newer renewal made.
func (s *RedisStore) RegisterProxy(ctx context.Context, id string, until time.Time) error {
	exp := until.UnixMilli()
	if err := s.client.ZAddGT(ctx, s.proxiesKey(), redis.Z{Score: float64(exp), Member: id}).Err(); err != nil {
		return fmt.Errorf("shardmap: register proxy %s: %w", id, err)
	}
	return nil
}

// ServeTenants implements Coordination. Like RegisterProxy, the expiry only
// moves forward. Were a late renewal to take a tenant's registration back
// to a time past, the proxy would stay live in the global registry while
// missing from the tenant's, so a freeze would count it as neither lagging
// nor cut off (TestLateRenewalKeepsTheRegistration; the one-way partitions
// of TestPartitions showed it as a stale read and a read of a released
// fold donor).
func (s *RedisStore) ServeTenants(ctx context.Context, id string, until time.Time, tenants ...string) error {
	if len(tenants) == 0 {
		return nil
	}
	exp := float64(until.UnixMilli())
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, t := range tenants {
			p.ZAddGT(ctx, s.tenantProxiesKey(t), redis.Z{Score: exp, Member: id})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("shardmap: register proxy %s for its tenants: %w", id, err)
	}
	return nil
}

// UnregisterProxy implements Coordination.
func (s *RedisStore) UnregisterProxy(ctx context.Context, id string, tenants ...string) error {
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, t := range tenants {
			p.ZRem(ctx, s.tenantProxiesKey(t), id)
		}
		p.ZRem(ctx, s.proxiesKey(), id)
		return nil
	})
	return err
}

// LiveProxies implements Coordination.
func (s *RedisStore) LiveProxies(ctx context.Context) ([]string, error) {
	ids, err := s.live(ctx, s.proxiesKey())
	if err != nil {
		return nil, fmt.Errorf("shardmap: live proxies: %w", err)
	}
	return ids, nil
}

// TenantProxies implements Coordination.
func (s *RedisStore) TenantProxies(ctx context.Context, tenant string) ([]string, error) {
	ids, err := s.live(ctx, s.tenantProxiesKey(tenant))
	if err != nil {
		return nil, fmt.Errorf("shardmap: proxies of tenant %s: %w", tenant, err)
	}
	return ids, nil
}

// live lists the unexpired members of a registry. Expired entries are
// removed on the way, so it does not grow with every proxy that ever ran.
func (s *RedisStore) live(ctx context.Context, key string) ([]string, error) {
	var ids *redis.StringSliceCmd
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		ids = liveAt(ctx, p, key, time.Now())
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ids.Val(), nil
}

// liveAt queues the removal of a registry's members expired at now and the
// read of the others.
func liveAt(ctx context.Context, p redis.Pipeliner, key string, now time.Time) *redis.StringSliceCmd {
	ms := strconv.FormatInt(now.UnixMilli(), 10)
	p.ZRemRangeByScore(ctx, key, "-inf", "("+ms)
	return p.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: ms, Max: "+inf"})
}

// AckEpoch implements Coordination.
func (s *RedisStore) AckEpoch(ctx context.Context, tenant, tree, proxy string, epoch uint64) error {
	return ackScript.Run(ctx, s.client, []string{s.acksKey(tenant, tree)}, proxy, strconv.FormatUint(epoch, 10)).Err()
}

// Acks implements Coordination.
func (s *RedisStore) Acks(ctx context.Context, tenant, tree string) (map[string]uint64, error) {
	vals, err := s.client.HGetAll(ctx, s.acksKey(tenant, tree)).Result()
	if err != nil {
		return nil, fmt.Errorf("shardmap: acks of %s/%s: %w", tenant, tree, err)
	}
	out := make(map[string]uint64, len(vals))
	for p, v := range vals {
		e, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("shardmap: ack of %s: %w", p, err)
		}
		out[p] = e
	}
	return out, nil
}

// Lagging implements Coordination over the proxies registered for the
// tenant (ServeTenants). Pipelines, not a script: in Redis Cluster the
// registries and the tenant's acknowledgements are in different slots.
//
// Every expiry is judged at one instant, and the live proxies are read
// before the tenant's: a proxy renews its tenants before its liveness, to
// the same time, so a proxy read here as live and not lagging either
// acknowledged the epoch or serves no statement of the tenant.
func (s *RedisStore) Lagging(ctx context.Context, tenant, tree string, epoch uint64) (Lag, error) {
	now := time.Now()
	var live, serving *redis.StringSliceCmd
	var acks *redis.MapStringStringCmd
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		live = liveAt(ctx, p, s.proxiesKey(), now)
		return nil
	})
	if err == nil {
		_, err = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			serving = liveAt(ctx, p, s.tenantProxiesKey(tenant), now)
			acks = p.HGetAll(ctx, s.acksKey(tenant, tree))
			return nil
		})
	}
	if err != nil {
		return Lag{}, fmt.Errorf("shardmap: acks of %s/%s: %w", tenant, tree, err)
	}
	lag := Lag{Live: live.Val()}
	for _, id := range serving.Val() {
		if e, err := strconv.ParseUint(acks.Val()[id], 10, 64); err != nil || e < epoch {
			lag.Lagging = append(lag.Lagging, id)
		}
	}
	return lag, nil
}

// ClusterID implements Coordination.
func (s *RedisStore) ClusterID(ctx context.Context) (string, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	if err := s.client.SetNX(ctx, s.clusterIDKey(), hex.EncodeToString(b), 0).Err(); err != nil {
		return "", fmt.Errorf("shardmap: cluster id: %w", err)
	}
	id, err := s.client.Get(ctx, s.clusterIDKey()).Result()
	if err != nil {
		return "", fmt.Errorf("shardmap: cluster id: %w", err)
	}
	return id, nil
}

// RestoreClusterID stores id as the deployment id unless one is stored
// (`lattice recover-map`: the proxies still running name their presence
// sessions with the id Redis lost), and returns the stored one.
func (s *RedisStore) RestoreClusterID(ctx context.Context, id string) (string, error) {
	if err := s.client.SetNX(ctx, s.clusterIDKey(), id, 0).Err(); err != nil {
		return "", fmt.Errorf("shardmap: cluster id: %w", err)
	}
	got, err := s.client.Get(ctx, s.clusterIDKey()).Result()
	if err != nil {
		return "", fmt.Errorf("shardmap: cluster id: %w", err)
	}
	return got, nil
}
