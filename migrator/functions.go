// Package migrator moves slots between shards (split and fold) and runs the
// lattice_* SQL functions that create and reshard trees.
package migrator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Functions serves the lattice_* functions of docs/DESIGN.md section 7.
type Functions struct {
	cluster *pgshard.Cluster
	store   Store
	cache   *shardmap.Cache
	coord   *Coordinator
	nodes   *NodeAdmin // nil until SetNodeAdmin
	ops     *TreeOpRunner
	merger  *Merger      // nil until SetMerger
	snaps   *Snapshotter // nil until SetSnapshotter
	// perNode finds a column default that would differ between a
	// reference table's copies; the router's parser is wired in by the
	// binary, so that the migrator does not import the router.
	perNode pgshard.ReferenceCheck
}

// NewFunctions wires the functions to the nodes, the map store, the
// proxy's map cache (refreshed after a change so that the caller's next
// statement already routes by it), the reshard coordinator and the check
// of a reference table's column defaults.
func NewFunctions(cluster *pgshard.Cluster, store Store, cache *shardmap.Cache, coord *Coordinator, perNode pgshard.ReferenceCheck) *Functions {
	return &Functions{cluster: cluster, store: store, cache: cache, coord: coord, perNode: perNode}
}

func field(name string, oid uint32) pgproto3.FieldDescription {
	size := int16(-1)
	switch oid {
	case pgtype.Int4OID:
		size = 4
	case pgtype.Int8OID:
		size = 8
	}
	return pgproto3.FieldDescription{Name: []byte(name), DataTypeOID: oid, DataTypeSize: size, TypeModifier: -1}
}

var signatures = map[string][]pgproto3.FieldDescription{
	"lattice_create_tree": {field("lattice_create_tree", pgtype.TextOID)},
	"lattice_trees": {
		field("tree", pgtype.TextOID), field("key_column", pgtype.TextOID), field("key_type", pgtype.TextOID),
		field("shard_count", pgtype.Int4OID), field("slot_count", pgtype.Int4OID), field("epoch", pgtype.Int8OID),
		field("colocation_group", pgtype.TextOID),
	},
	"lattice_reshard":          {field("lattice_reshard", pgtype.TextOID)},
	"lattice_reshard_complete": {field("lattice_reshard_complete", pgtype.BoolOID)},
	"lattice_reshard_status": {
		field("phase", pgtype.TextOID), field("target", pgtype.Int4OID), field("distinct_shards", pgtype.Int4OID),
		field("migrations_in_flight", pgtype.Int4OID), field("rows_copied", pgtype.Int8OID), field("lag_bytes", pgtype.Int8OID),
		field("eta_seconds", pgtype.Float8OID),
		field("verify_failed_migration", pgtype.TextOID), field("verify_failed_slots", pgtype.TextOID),
		field("autonomic", pgtype.TextOID), field("last_error", pgtype.TextOID),
	},
	"lattice_shards": {
		field("shard", pgtype.Int4OID), field("node", pgtype.TextOID), field("schema", pgtype.TextOID),
		field("slot_ranges", pgtype.TextOID), field("slot_count", pgtype.Int4OID), field("state", pgtype.TextOID),
		field("rows_estimate", pgtype.Int8OID), field("colocation_group", pgtype.TextOID),
		field("reads_per_s", pgtype.Float8OID), field("writes_per_s", pgtype.Float8OID), field("rows_written_per_s", pgtype.Float8OID),
	},
}

// Describe returns the result columns of a lattice function.
func (f *Functions) Describe(name string) ([]pgproto3.FieldDescription, error) {
	sig, ok := signatures[name]
	if !ok {
		e := sqlstate.New(sqlstate.UndefinedFunction, "function %s does not exist", name)
		e.Hint = "Lattice provides lattice_create_tree, lattice_trees, lattice_shards, lattice_reshard, lattice_reshard_complete, lattice_reshard_status, " + rebalanceFunctionList + ", lattice_verify, lattice_repair_migration, lattice_merge, lattice_merge_status, lattice_merge_complete"
		return nil, e
	}
	return sig, nil
}

// argNames are the arguments of the functions that take any, in order.
var argNames = map[string][]string{
	"lattice_create_tree":      {"tree", "key_column", "shard_count", "slot_count", "colocate_with"},
	"lattice_shards":           {"tree"},
	"lattice_reshard":          {"tree", "shard_count"},
	"lattice_reshard_complete": {"tree"},
	"lattice_reshard_status":   {"tree"},
}

// ArgType is the type of an argument: integer for the counts, else text.
func (f *Functions) ArgType(fn string, pos int, name string) uint32 {
	if name == "" {
		names := argNames[fn]
		if pos < 0 || pos >= len(names) {
			return 0
		}
		name = names[pos]
	}
	switch name {
	case "shard_count", "slot_count", "shard", "fillfactor", "index_fillfactor":
		return pgtype.Int4OID
	case "repair", "value", "deduplicate":
		return pgtype.BoolOID
	}
	return pgtype.TextOID
}

// Call runs a lattice function for tenant.
func (f *Functions) Call(ctx context.Context, tenant, name string, args []*string, named map[string]*string) ([][]any, error) {
	if rows, ok, err := f.callNode(ctx, tenant, name, args, named); ok {
		return rows, err
	}
	switch name {
	case "lattice_create_tree":
		a, err := bindArgs(name, args, named, argNames[name]...)
		if err != nil {
			return nil, err
		}
		return f.createTree(ctx, tenant, a)
	case "lattice_trees":
		if _, err := bindArgs(name, args, named); err != nil {
			return nil, err
		}
		return f.trees(ctx, tenant)
	case "lattice_shards":
		a, err := bindArgs(name, args, named, "tree")
		if err != nil {
			return nil, err
		}
		return f.shards(ctx, tenant, a)
	case "lattice_reshard":
		a, err := bindArgs(name, args, named, argNames[name]...)
		if err != nil {
			return nil, err
		}
		return f.reshard(ctx, tenant, a)
	case "lattice_reshard_complete", "lattice_reshard_status":
		a, err := bindArgs(name, args, named, "tree")
		if err != nil {
			return nil, err
		}
		tree, err := required(a, "tree")
		if err != nil {
			return nil, err
		}
		if name == "lattice_reshard_status" {
			return f.reshardStatus(ctx, tenant, foldName(tree))
		}
		done, err := f.coord.ReshardComplete(ctx, tenant, foldName(tree))
		if err != nil {
			return nil, err
		}
		return [][]any{{done}}, nil
	}
	if rows, ok, err := f.callRebalance(ctx, tenant, name, args, named); ok {
		return rows, err
	}
	if rows, ok, err := f.callReference(ctx, tenant, name, args, named); ok {
		return rows, err
	}
	if rows, ok, err := f.callVerify(ctx, tenant, name, args, named); ok {
		return rows, err
	}
	if rows, ok, err := f.callAutonomic(ctx, tenant, name, args, named); ok {
		return rows, err
	}
	if rows, ok, err := f.callMerge(ctx, tenant, name, args, named); ok {
		return rows, err
	}
	if rows, ok, err := f.callSnapshot(ctx, tenant, name, args, named); ok {
		return rows, err
	}
	if rows, ok, err := f.callResize(ctx, tenant, name, args, named); ok {
		return rows, err
	}
	return nil, sqlstate.New(sqlstate.UndefinedFunction, "function %s does not exist", name)
}

// bindArgs matches positional and named arguments to parameter names.
func bindArgs(fn string, args []*string, named map[string]*string, params ...string) (map[string]*string, error) {
	if len(args) > len(params) {
		return nil, sqlstate.New(sqlstate.UndefinedFunction, "function %s takes at most %d arguments", fn, len(params))
	}
	out := make(map[string]*string, len(params))
	for i, a := range args {
		out[params[i]] = a
	}
	for k, v := range named {
		known := false
		for _, p := range params {
			known = known || p == k
		}
		if !known {
			return nil, sqlstate.New(sqlstate.UndefinedFunction, "function %s has no parameter named %q (it takes %s)", fn, k, strings.Join(params, ", "))
		}
		if _, dup := out[k]; dup {
			return nil, sqlstate.New(sqlstate.InvalidFunctionDefinition, "argument %q of %s given twice", k, fn)
		}
		out[k] = v
	}
	return out, nil
}

func required(a map[string]*string, name string) (string, error) {
	v := a[name]
	if v == nil || *v == "" {
		return "", sqlstate.New(sqlstate.NullValueNotAllowed, "argument %s must not be null or empty", name)
	}
	return *v, nil
}

func optionalInt(a map[string]*string, name string, def int) (int, error) {
	v := a[name]
	if v == nil {
		return def, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(*v))
	if err != nil {
		return 0, sqlstate.New(sqlstate.InvalidParameterValue, "argument %s must be an integer, got %q", name, *v)
	}
	return n, nil
}

// foldName folds an unquoted identifier the way PostgreSQL does.
func foldName(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return strings.ReplaceAll(s[1:len(s)-1], `""`, `"`)
	}
	return strings.ToLower(s)
}

func (f *Functions) createTree(ctx context.Context, tenant string, a map[string]*string) ([][]any, error) {
	table, err := required(a, "tree")
	if err != nil {
		return nil, err
	}
	key, err := required(a, "key_column")
	if err != nil {
		return nil, err
	}
	// 0 for a count not given: pgshard takes the default, or the group's.
	shards, err := optionalInt(a, "shard_count", 0)
	if err != nil {
		return nil, err
	}
	slots, err := optionalInt(a, "slot_count", 0)
	if err != nil {
		return nil, err
	}
	spec := pgshard.TreeSpec{Tenant: tenant, Table: foldName(table), KeyColumn: foldName(key), ShardCount: shards, SlotCount: slots}
	if v := a["colocate_with"]; v != nil {
		spec.ColocateWith = foldName(*v)
	}
	if f.coord != nil {
		spec.AwaitProxies = f.coord.runner.WaitKnown
	}
	t, m, err := f.cluster.CreateTree(ctx, f.store, spec)
	if err != nil {
		return nil, err
	}
	if f.cache != nil {
		if _, err := f.cache.Refresh(ctx, tenant); err != nil {
			return nil, fmt.Errorf("tree created, but refreshing the map cache failed: %w", err)
		}
	}
	nodes := map[string]bool{}
	for _, sh := range m.Shards {
		nodes[sh.Node] = true
	}
	msg := fmt.Sprintf("tree %s: %d shards on %d nodes, key %s (%s), %d slots", t.Name, len(m.Shards), len(nodes), t.KeyColumn, t.KeyType, len(m.Slots))
	if t.Group != "" {
		msg += ", colocation group " + t.Group
	}
	return [][]any{{msg}}, nil
}

func (f *Functions) trees(ctx context.Context, tenant string) ([][]any, error) {
	trees, err := f.store.Trees(ctx, tenant)
	if err != nil {
		return nil, err
	}
	rows := make([][]any, 0, len(trees))
	for _, t := range trees {
		m, err := f.store.Map(ctx, tenant, t.MapName())
		if err != nil {
			return nil, err
		}
		rows = append(rows, []any{t.Name, t.KeyColumn, string(t.KeyType), int32(m.DistinctShards()), int32(len(m.Slots)), int64(m.Epoch), groupValue(t)})
	}
	return rows, nil
}

func (f *Functions) shards(ctx context.Context, tenant string, a map[string]*string) ([][]any, error) {
	name, err := required(a, "tree")
	if err != nil {
		return nil, err
	}
	name = foldName(name)
	t, err := f.store.Tree(ctx, tenant, name)
	if errors.Is(err, shardmap.ErrNotFound) {
		return nil, sqlstate.New(sqlstate.UndefinedTable, "tree %q does not exist", name)
	}
	if err != nil {
		return nil, err
	}
	m, err := f.store.Map(ctx, tenant, t.MapName())
	if err != nil {
		return nil, err
	}
	counts, err := f.cluster.TreeRowCount(ctx, t, m)
	if err != nil {
		return nil, err
	}
	load, err := shardLoad(ctx, f.store, t, m)
	if err != nil {
		return nil, err
	}
	slotCounts := m.SlotCounts()
	idx := make([]int, 0, len(m.Shards))
	for i := range m.Shards {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	rows := make([][]any, 0, len(idx))
	for _, i := range idx {
		sh := m.Shards[i]
		rows = append(rows, []any{int32(i), sh.Node, shardmap.SchemaName(i), formatRanges(m.SlotRanges(i)),
			int32(slotCounts[i]), string(sh.State), counts[i], groupValue(t),
			roundRate(load[i].Reads), roundRate(load[i].Writes), roundRate(load[i].Rows)})
	}
	return rows, nil
}

func formatRanges(r [][2]int) string {
	parts := make([]string, len(r))
	for i, x := range r {
		if x[0] == x[1] {
			parts[i] = strconv.Itoa(x[0])
		} else {
			parts[i] = strconv.Itoa(x[0]) + "-" + strconv.Itoa(x[1])
		}
	}
	return strings.Join(parts, ",")
}

func (f *Functions) reshard(ctx context.Context, tenant string, a map[string]*string) ([][]any, error) {
	tree, err := required(a, "tree")
	if err != nil {
		return nil, err
	}
	if a["shard_count"] == nil {
		return nil, sqlstate.New(sqlstate.NullValueNotAllowed, "argument shard_count must not be null")
	}
	n, err := optionalInt(a, "shard_count", 0)
	if err != nil {
		return nil, err
	}
	msg, err := f.Reshard(ctx, tenant, foldName(tree), n)
	if err != nil {
		return nil, err
	}
	return [][]any{{msg}}, nil
}

// Reshard is lattice_reshard for a tree named exactly (not folded): the SQL
// function and the admin API share it. It returns what it did.
func (f *Functions) Reshard(ctx context.Context, tenant, tree string, n int) (string, error) {
	msg, err := f.coord.Reshard(ctx, tenant, tree, n)
	if err != nil {
		return "", err
	}
	if f.cache != nil {
		if _, err := f.cache.Refresh(ctx, tenant); err != nil {
			return "", fmt.Errorf("%s, but refreshing the map cache failed: %w", msg, err)
		}
	}
	return msg, nil
}

// ReshardStatus is a tree's reshard as lattice_reshard_status and the admin
// API report it.
type ReshardStatus struct {
	Tenant, Tree       string
	Phase              string // "idle" when no reshard runs
	From, Target       int    // distinct shards at the start, and asked for
	Shards             int    // distinct shards now
	MigrationsInFlight int
	RowsCopied         int64
	LagBytes           int64
	// ETASeconds is extrapolated from the progress in distinct shards so
	// far; nil until there is progress to extrapolate from.
	ETASeconds *float64
	Started    time.Time // zero when idle
	// VerifyFailed names a migration whose verification failed (the phase
	// is then verify_failed), and VerifyFailedSlots its differing slots.
	VerifyFailed      string
	VerifyFailedSlots string
	// Autonomic says what the tree's split monitor and healing do and why
	// (autonomic_functions.go), whether or not a reshard runs.
	Autonomic string
	// LastError is what last held back a migration in flight: a freeze
	// rolled back or put off, a failed verification.
	LastError string
}

// ReshardStatus reports a tree (named exactly) whose reshard may or may not
// run; 42P01 if the tree does not exist.
func (f *Functions) ReshardStatus(ctx context.Context, tenant, tree string) (*ReshardStatus, error) {
	t, err := f.store.Tree(ctx, tenant, tree)
	if errors.Is(err, shardmap.ErrNotFound) {
		return nil, sqlstate.New(sqlstate.UndefinedTable, "tree %q does not exist", tree)
	} else if err != nil {
		return nil, err
	}
	r, err := f.store.Reshard(ctx, tenant, t.MapName())
	if errors.Is(err, shardmap.ErrNotFound) || err == nil && r.Kind != shardmap.IntentReshard {
		r = nil
	} else if err != nil {
		return nil, err
	}
	st, err := f.statusOf(ctx, tenant, t.MapName(), r)
	if st != nil {
		st.Tree = tree
		st.Autonomic = f.autonomicStatus(ctx, t)
	}
	return st, err
}

// Reshards reports every running reshard of every tenant.
func (f *Functions) Reshards(ctx context.Context) ([]*ReshardStatus, error) {
	rs, err := f.store.Reshards(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*ReshardStatus, 0, len(rs))
	for _, r := range rs {
		if r.Kind != shardmap.IntentReshard {
			continue // a rebalance: lattice_rebalance_status reports it
		}
		st, err := f.statusOf(ctx, r.Tenant, r.Tree, r)
		if errors.Is(err, shardmap.ErrNotFound) {
			continue // the tree was dropped meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// statusOf computes the status of tree's reshard r, nil meaning idle.
func (f *Functions) statusOf(ctx context.Context, tenant, tree string, r *shardmap.Reshard) (*ReshardStatus, error) {
	m, err := f.store.Map(ctx, tenant, tree)
	if err != nil {
		return nil, err
	}
	distinct := m.DistinctShards()
	if r == nil {
		return &ReshardStatus{Tenant: tenant, Tree: tree, Phase: "idle", From: distinct, Target: distinct, Shards: distinct}, nil
	}
	migs, err := f.store.Migrations(ctx, tenant, tree)
	if err != nil {
		return nil, err
	}
	st := &ReshardStatus{Tenant: tenant, Tree: tree, Phase: r.Phase, From: r.From, Target: r.Target, Shards: distinct, Started: r.Started}
	flying := inFlight(migs)
	st.MigrationsInFlight = len(flying)
	for _, m := range flying {
		st.RowsCopied += m.RowsCopied
		st.LagBytes += m.LagBytes
		if st.LastError == "" {
			st.LastError = m.LastError
		}
		if m.Phase == shardmap.PhaseVerifyFailed && st.VerifyFailed == "" && m.Verify != nil {
			st.Phase, st.VerifyFailed, st.VerifyFailedSlots = string(shardmap.PhaseVerifyFailed), m.ID, formatSlots(m.Verify.Differ)
		}
	}
	if total, done := abs(r.Target-r.From), abs(distinct-r.From); total > 0 && done > 0 {
		eta := time.Since(r.Started).Seconds() * float64(total-min(done, total)) / float64(done)
		st.ETASeconds = &eta
	}
	return st, nil
}

// reshardStatus is lattice_reshard_status.
func (f *Functions) reshardStatus(ctx context.Context, tenant, tree string) ([][]any, error) {
	st, err := f.ReshardStatus(ctx, tenant, tree)
	if err != nil {
		return nil, err
	}
	var eta any // NULL until there is progress to extrapolate from
	if st.ETASeconds != nil {
		eta = *st.ETASeconds
	} else if st.Phase == "idle" {
		eta = float64(0)
	}
	var failed, slots any // NULL unless a move failed its verification
	if st.VerifyFailed != "" {
		failed, slots = st.VerifyFailed, st.VerifyFailedSlots
	}
	var lastErr any // NULL when nothing holds a migration back
	if st.LastError != "" {
		lastErr = st.LastError
	}
	return [][]any{{st.Phase, int32(st.Target), int32(st.Shards), int32(st.MigrationsInFlight), st.RowsCopied, st.LagBytes, eta, failed, slots, st.Autonomic, lastErr}}, nil
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// groupValue is t's colocation group as a column value: NULL for a tree alone.
func groupValue(t *shardmap.Tree) any {
	if t.Group == "" {
		return nil
	}
	return t.Group
}
