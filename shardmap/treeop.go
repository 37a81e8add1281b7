package shardmap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// TreeOpKind names a whole-tree operation that shares a tree with its
// reshards: the specification's snapshot, merge and resize.
type TreeOpKind string

const (
	OpSnapshot TreeOpKind = "snapshot" // copies Tree as of one instant into the new tree Target
	OpMerge    TreeOpKind = "merge"    // upserts every row of Tree into Target
	OpResize   TreeOpKind = "resize"   // rewrites every shard of Tree with new storage parameters
)

// OpIntent is the phase every tree operation is recorded in before it acts:
// a record in it has created nothing yet, or is creating it. The kinds add
// their own phases after it.
const OpIntent = "intent"

// OpFailed is the phase of an operation that failed for good (a merge
// whose rows the target refuses): it runs no more and conflicts with
// nothing, and its record stays only to report the error, until the
// operation is started again.
const OpFailed = "failed"

// TreeOp is one running tree operation as recorded in the store before it
// acts, so that whoever holds the tree's coordinator lease resumes it after
// a crash and finds everything it created. Tree is the tree it reads or
// rewrites; Target is the tree it writes, for a snapshot (the new tree) and
// a merge (the tree merged into), else "".
type TreeOp struct {
	ID     string     `json:"id"`
	Tenant string     `json:"tenant"`
	Kind   TreeOpKind `json:"kind"`
	Tree   string     `json:"tree"`
	Target string     `json:"target,omitempty"`
	// Map is the name of Tree's map (its colocation group's), and TargetMap
	// that of Target when Target is a tree already; "" means the tree's own
	// name. A group's migrations move every member's table, so the
	// interlocks and the conflicts are the maps' (TreeMap, TargetMapName).
	Map       string `json:"map,omitempty"`
	TargetMap string `json:"target_map,omitempty"`
	Phase     string `json:"phase"`
	// Attempt names the run that owns the record: a run that resumes the
	// operation after a crash takes it with a new attempt (ClaimTreeOp), and
	// every write of the run before is refused from then on.
	Attempt   string    `json:"attempt"`
	RowsDone  int64     `json:"rows_done"`
	RowsTotal int64     `json:"rows_total"`
	Started   time.Time `json:"started"`
	Updated   time.Time `json:"updated"`
	LastError string    `json:"last_error,omitempty"`
	// State is the kind's own state (the shards a snapshot or merge
	// recorded, the parameters of a resize), opaque to the store.
	State json.RawMessage `json:"state,omitempty"`
}

// Touches reports whether op reads or writes tree.
func (op *TreeOp) Touches(tree string) bool { return op.Tree == tree || op.Target == tree }

// TreeMap is the name of the map of the tree op reads or rewrites.
func (op *TreeOp) TreeMap() string {
	if op.Map != "" {
		return op.Map
	}
	return op.Tree
}

// TargetMapName is the name of the map of the tree op writes, "" for none.
func (op *TreeOp) TargetMapName() string {
	if op.TargetMap != "" {
		return op.TargetMap
	}
	return op.Target
}

// OnMap reports whether op reads or rewrites map name (a tree's or its
// group's), or names it as its tree.
func (op *TreeOp) OnMap(name string) bool { return op.Tree == name || op.TreeMap() == name }

// IntoMap reports whether op writes into map name, or names it as its target.
func (op *TreeOp) IntoMap(name string) bool {
	return op.Target != "" && (op.Target == name || op.TargetMapName() == name)
}

// ErrAttempt is returned by a write of a run that no longer owns its
// operation: another run claimed it.
var ErrAttempt = errors.New("shardmap: tree operation claimed by another run")

// TreeOps is the store's side for tree operations. RedisStore implements it.
type TreeOps interface {
	// StartTreeOp records op (in OpIntent, with its first Attempt) unless a
	// running operation (not OpFailed) conflicts: one of the same kind on the same map (a
	// colocation group's members share one), or one that names op's Target
	// as its tree or target. It returns that
	// operation instead (op is stored when it returns nil).
	StartTreeOp(ctx context.Context, op *TreeOp) (*TreeOp, error)
	// UpdateTreeOp replaces the record if the stored one has op's Attempt:
	// ErrAttempt if another run claimed it, ErrNotFound once it is gone.
	UpdateTreeOp(ctx context.Context, op *TreeOp) error
	// ClaimTreeOp gives op to a new run: the stored record, if it still has
	// attempt prev, gets op.Attempt.
	ClaimTreeOp(ctx context.Context, op *TreeOp, prev string) error
	// FinishTreeOp removes the record of a finished (or undone) operation.
	FinishTreeOp(ctx context.Context, tenant, id string) error
	// TreeOps lists the running operations of the tenant that touch tree
	// (Touches), oldest first; every one of the tenant for tree "".
	TreeOps(ctx context.Context, tenant, tree string) ([]*TreeOp, error)
	// AllTreeOps lists every running operation of every tenant, for the
	// coordinators that resume them.
	AllTreeOps(ctx context.Context) ([]*TreeOp, error)
}

var _ TreeOps = (*RedisStore)(nil)

// More keys of the RedisStore:
//
//	P:{T}:treeops        hash: operation id -> TreeOp JSON
//	P:treeop-tenants     set: tenants that have had a tree operation, so a
//	                     coordinator finds them without scanning keys
func (s *RedisStore) treeOpsKey(tenant string) string { return s.tenantTag(tenant) + ":treeops" }
func (s *RedisStore) treeOpTenantsKey() string        { return s.prefix + ":treeop-tenants" }

var (
	// KEYS: treeops. ARGV: id, JSON, kind, tree, target, map. Returns ""
	// once stored, else the conflicting record.
	startTreeOpScript = redis.NewScript(`
local all = redis.call('HGETALL', KEYS[1])
for i = 2, #all, 2 do
  local o = cjson.decode(all[i])
  local otarget = o['target'] or ''
  local omap = o['map'] or ''
  if omap == '' then omap = o['tree'] end
  if o['id'] == ARGV[1] then return all[i] end
  if o['phase'] ~= 'failed' then
    if o['kind'] == ARGV[3] and (o['tree'] == ARGV[4] or omap == ARGV[6]) then return all[i] end
    if ARGV[5] ~= '' and (o['tree'] == ARGV[5] or otarget == ARGV[5]) then return all[i] end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ''`)

	// KEYS: treeops. ARGV: id, expected attempt, JSON. 1 stored, 0 gone,
	// -1 another attempt owns it.
	swapTreeOpScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return 0 end
if cjson.decode(cur)['attempt'] ~= ARGV[2] then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1`)
)

// StartTreeOp implements TreeOps. The tenant is added to the tenant set
// first: an operation whose tenant is not in it would never be resumed.
func (s *RedisStore) StartTreeOp(ctx context.Context, op *TreeOp) (*TreeOp, error) {
	if op.Phase == "" {
		op.Phase = OpIntent
	}
	b, err := json.Marshal(op)
	if err != nil {
		return nil, err
	}
	if err := s.client.SAdd(ctx, s.treeOpTenantsKey(), op.Tenant).Err(); err != nil {
		return nil, fmt.Errorf("shardmap: record %s of %s/%s: %w", op.Kind, op.Tenant, op.Tree, err)
	}
	v, err := startTreeOpScript.Run(ctx, s.client, []string{s.treeOpsKey(op.Tenant)}, op.ID, b, string(op.Kind), op.Tree, op.Target, op.TreeMap()).Text()
	if err != nil {
		return nil, fmt.Errorf("shardmap: record %s of %s/%s: %w", op.Kind, op.Tenant, op.Tree, err)
	}
	if v == "" {
		return nil, nil
	}
	cur := new(TreeOp)
	if err := json.Unmarshal([]byte(v), cur); err != nil {
		return nil, fmt.Errorf("shardmap: decode tree operation: %w", err)
	}
	return cur, nil
}

func (s *RedisStore) swapTreeOp(ctx context.Context, op *TreeOp, prev string) error {
	b, err := json.Marshal(op)
	if err != nil {
		return err
	}
	n, err := swapTreeOpScript.Run(ctx, s.client, []string{s.treeOpsKey(op.Tenant)}, op.ID, prev, b).Int()
	if err != nil {
		return fmt.Errorf("shardmap: write tree operation %s: %w", op.ID, err)
	}
	switch n {
	case 0:
		return fmt.Errorf("shardmap: tree operation %s: %w", op.ID, ErrNotFound)
	case -1:
		return fmt.Errorf("shardmap: tree operation %s: %w", op.ID, ErrAttempt)
	}
	return nil
}

// UpdateTreeOp implements TreeOps.
func (s *RedisStore) UpdateTreeOp(ctx context.Context, op *TreeOp) error {
	op.Updated = time.Now().UTC()
	return s.swapTreeOp(ctx, op, op.Attempt)
}

// ClaimTreeOp implements TreeOps.
func (s *RedisStore) ClaimTreeOp(ctx context.Context, op *TreeOp, prev string) error {
	op.Updated = time.Now().UTC()
	return s.swapTreeOp(ctx, op, prev)
}

// FinishTreeOp implements TreeOps.
func (s *RedisStore) FinishTreeOp(ctx context.Context, tenant, id string) error {
	if err := s.client.HDel(ctx, s.treeOpsKey(tenant), id).Err(); err != nil {
		return fmt.Errorf("shardmap: finish tree operation %s: %w", id, err)
	}
	return nil
}

// TreeOps implements TreeOps.
func (s *RedisStore) TreeOps(ctx context.Context, tenant, tree string) ([]*TreeOp, error) {
	vals, err := s.client.HGetAll(ctx, s.treeOpsKey(tenant)).Result()
	if err != nil {
		return nil, fmt.Errorf("shardmap: read tree operations of %s: %w", tenant, err)
	}
	var out []*TreeOp
	for id, v := range vals {
		op := new(TreeOp)
		if err := json.Unmarshal([]byte(v), op); err != nil {
			return nil, fmt.Errorf("shardmap: decode tree operation %s: %w", id, err)
		}
		if tree == "" || op.Touches(tree) {
			out = append(out, op)
		}
	}
	slices.SortFunc(out, func(a, b *TreeOp) int {
		if c := a.Started.Compare(b.Started); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// AllTreeOps implements TreeOps.
func (s *RedisStore) AllTreeOps(ctx context.Context) ([]*TreeOp, error) {
	tenants, err := s.client.SMembers(ctx, s.treeOpTenantsKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("shardmap: list tree operations: %w", err)
	}
	slices.Sort(tenants)
	var out []*TreeOp
	for _, tenant := range tenants {
		ops, err := s.TreeOps(ctx, tenant, "")
		if err != nil {
			return nil, err
		}
		out = append(out, ops...)
	}
	return out, nil
}
