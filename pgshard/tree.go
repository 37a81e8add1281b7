package pgshard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// DefaultShardCount is the shard count of a tree created without one.
const DefaultShardCount = 64

// maxSlotCount bounds a tree's declared slot count; its map holds one entry
// per slot.
const maxSlotCount = 1 << 16

// fenceTrigger and fenceFunction reject writes to a tree's template.
const (
	fenceTrigger  = "lattice_fence"
	fenceSchema   = "lattice_meta"
	fenceFunction = fenceSchema + ".template_fence()"
)

// TreeSpec describes lattice_create_tree's arguments. Names are exact (the
// caller folds case as SQL would).
type TreeSpec struct {
	Tenant     string // "" means the default tenant
	Table      string // an ordinary table in the catalog node's public schema
	KeyColumn  string
	ShardCount int // 0 means DefaultShardCount
	SlotCount  int // 0 means shardmap.DefaultSlotCount; else a power of two in [2, 65536]
	// ColocateWith names a tree whose colocation group the new tree joins
	// (colocate.go); its shard and slot counts are the group's.
	ColocateWith string
	// AwaitProxies, when set, waits after the creation until every proxy
	// routes by the new tree, so that once CreateTree returns no proxy
	// reads the emptied template for it.
	AwaitProxies func(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) error
}

func (c *Cluster) normalizeSpec(spec TreeSpec) (TreeSpec, error) {
	if spec.Tenant == "" {
		spec.Tenant = c.DefaultTenant()
	}
	if spec.ShardCount == 0 {
		spec.ShardCount = DefaultShardCount
	}
	if spec.SlotCount == 0 {
		spec.SlotCount = shardmap.DefaultSlotCount
	}
	switch {
	case spec.Table == "":
		return spec, &sqlstate.Error{Code: sqlstate.InvalidParameterValue, Message: "table name is empty"}
	case spec.KeyColumn == "":
		return spec, &sqlstate.Error{Code: sqlstate.InvalidParameterValue, Message: "shard key column name is empty"}
	case strings.HasPrefix(spec.Table, "lattice_"):
		return spec, &sqlstate.Error{Code: sqlstate.ReservedName,
			Message: fmt.Sprintf("relation name %s is reserved", quoted(spec.Table)),
			Detail:  `Names beginning with "lattice_" belong to Lattice's own objects in shard schemas.`}
	case spec.SlotCount < 2 || spec.SlotCount > maxSlotCount || spec.SlotCount&(spec.SlotCount-1) != 0:
		return spec, &sqlstate.Error{Code: sqlstate.InvalidParameterValue,
			Message: fmt.Sprintf("slot count %d is invalid", spec.SlotCount),
			Detail:  fmt.Sprintf("The slot count must be a power of two between 2 and %d.", maxSlotCount)}
	case spec.ShardCount < 1 || spec.ShardCount > spec.SlotCount:
		return spec, &sqlstate.Error{Code: sqlstate.InvalidParameterValue,
			Message: fmt.Sprintf("shard count %d is out of range", spec.ShardCount),
			Detail:  fmt.Sprintf("The shard count must be between 1 and the slot count (%d).", spec.SlotCount)}
	}
	return spec, nil
}

// CreateTree turns the ordinary table public.<Table> on the catalog node into
// a tree: it checks the table meets the rules, records its DDL, creates the
// shards on the nodes, moves the rows into them, and registers the tree and
// its first map in store. The table stays as an empty template whose fence
// rejects writes with sqlstate.SlotMoved, so catalog queries keep working.
//
// The template is write-locked (reads go on) from the start to the end, so no
// write is lost: one that waited for the lock gets sqlstate.SlotMoved afterwards and
// the proxy retries it on the shards. Rule violations are *sqlstate.Error.
func (c *Cluster) CreateTree(ctx context.Context, store shardmap.Store, spec TreeSpec) (*shardmap.Tree, *shardmap.Map, error) {
	given := spec
	spec, err := c.normalizeSpec(spec)
	if err != nil {
		return nil, nil, err
	}
	log := c.log.With("tenant", spec.Tenant, "tree", spec.Table)
	start := time.Now()
	switch _, err := store.Tree(ctx, spec.Tenant, spec.Table); {
	case err == nil:
		return nil, nil, alreadyTree(spec.Table)
	case !errors.Is(err, shardmap.ErrNotFound):
		return nil, nil, fmt.Errorf("pgshard: create tree %s: %w", spec.Table, err)
	}

	conn, err := c.connect(ctx, c.Catalog().Name, spec.Tenant)
	if err != nil {
		return nil, nil, err
	}
	defer closeConn(conn)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("pgshard: create tree %s: %w", spec.Table, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	var co *colocation
	var m *shardmap.Map
	if spec.ColocateWith != "" {
		if co, m, err = colocateWith(ctx, store, spec, given); err != nil {
			return nil, nil, err
		}
		spec.SlotCount, spec.ShardCount = co.anchor.SlotCount, m.DistinctShards()
	}
	tree, ti, err := prepareTree(ctx, tx, spec)
	if err != nil {
		return nil, nil, err
	}
	if co != nil {
		if err := co.check(tree); err != nil {
			return nil, nil, err
		}
		tree.Group = co.anchor.MapName()
	} else {
		m = shardmap.NewIdentityMap(spec.Tenant, spec.Table, spec.SlotCount, spec.ShardCount, c.PlacementNodes())
	}
	fks, err := createTreeForeignKeys(ctx, store, tree, co, ti)
	if err != nil {
		return nil, nil, err
	}
	tree.DDL = append(tree.DDL, fks...)
	log.Info("creating tree", "key", tree.KeyColumn, "key_type", tree.KeyType,
		"shards", spec.ShardCount, "slots", spec.SlotCount, "nodes", len(c.set().nodes))

	// From here on, a failure rolls the catalog back and drops the shards.
	undo := func(err error) (*shardmap.Tree, *shardmap.Map, error) {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		c.dropShards(ctx, tree, m, log)
		log.Error("create tree failed", "err", err)
		return nil, nil, err
	}
	if err := c.createShards(ctx, tree, m); err != nil {
		return undo(err)
	}
	log.Info("shards created", "elapsed", time.Since(start).Round(time.Millisecond))
	rows, err := c.copyRows(ctx, tx.Conn().PgConn(), tree, ti, m, log)
	if err != nil {
		return undo(err)
	}
	if err := fenceTemplate(ctx, tx, tree.Name); err != nil {
		return undo(fmt.Errorf("pgshard: fence template %s: %w", tree.Name, err))
	}
	if err := recordTree(ctx, tx, tree, m); err != nil {
		return undo(fmt.Errorf("pgshard: record tree %s on the catalog node: %w", tree.Name, err))
	}
	register := func() error { return store.CreateTree(ctx, tree, m) }
	if co != nil {
		register = func() error { return co.register(ctx, store, tree) }
	}
	if err := register(); err != nil {
		var se *sqlstate.Error
		switch {
		case errors.Is(err, shardmap.ErrExists):
			return undo(alreadyTree(tree.Name))
		case errors.Is(err, shardmap.ErrNameInUse):
			return undo(&sqlstate.Error{Code: sqlstate.DuplicateTable,
				Message: fmt.Sprintf("name %s is still used by a colocation group", quoted(tree.Name)),
				Detail:  "A colocation group keeps the name of the tree it was formed from while any member lives.",
				Hint:    "Create the tree with colocate_with naming a member of that group, or drop its members first."})
		case errors.As(err, &se):
			return undo(err) // refused, nothing registered
		}
		// The registration may have happened with only the reply lost: take
		// it back before the template takes writes again.
		if derr := store.DeleteTree(context.WithoutCancel(ctx), tree.Tenant, tree.Name); derr != nil && !errors.Is(derr, shardmap.ErrNotFound) {
			log.Error("could not take back the registration of a failed tree", "err", derr)
		}
		return undo(fmt.Errorf("pgshard: register tree %s: %w", tree.Name, err))
	}
	if err := tx.Commit(context.WithoutCancel(ctx)); err != nil {
		// The tree is registered and its rows are on the shards: proxies may
		// already write there, so finish forwards rather than undo.
		log.Warn("catalog commit failed after the tree was registered; fencing the template again", "err", err)
		if err := c.finishTemplate(ctx, tree, m); err != nil {
			return nil, nil, fmt.Errorf("pgshard: tree %s is registered but its template %s is not fenced: %w",
				tree.Name, pgx.Identifier{"public", tree.Name}.Sanitize(), err)
		}
	}
	var waited time.Duration
	if spec.AwaitProxies != nil {
		began := time.Now()
		err := spec.AwaitProxies(ctx, tree, m)
		waited = time.Since(began)
		if err != nil {
			log.Warn("not every proxy routes by the new tree yet; a read through one that does not finds its empty template", "err", err)
			return nil, nil, fmt.Errorf("pgshard: tree %s is created, but not every proxy routes by it yet: %w", tree.Name, err)
		}
	}
	log.Info("tree created", "rows", rows, "elapsed", time.Since(start).Round(time.Millisecond),
		"proxies_wait", waited.Round(time.Millisecond))
	return tree, m, nil
}

// prepareTree locks the template against writes, inspects it and builds the
// tree's registry entry. Inspecting under the lock means the table cannot be
// altered between the DDL read here and the copy.
func prepareTree(ctx context.Context, tx pgx.Tx, spec TreeSpec) (*shardmap.Tree, *tableInfo, error) {
	template := pgx.Identifier{"public", spec.Table}.Sanitize()
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, template).Scan(&exists); err != nil {
		return nil, nil, fmt.Errorf("pgshard: create tree %s: %w", spec.Table, err)
	}
	if !exists {
		return nil, nil, &sqlstate.Error{Code: sqlstate.UndefinedTable, Message: fmt.Sprintf("relation %s does not exist", quoted(spec.Table)),
			Hint: "Create the table in the public schema first, through the proxy."}
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+template+" IN EXCLUSIVE MODE"); err != nil {
		return nil, nil, fmt.Errorf("pgshard: lock %s: %w", template, err)
	}
	ti, err := inspectTable(ctx, tx, spec.Table)
	if err != nil {
		return nil, nil, fmt.Errorf("pgshard: inspect %s: %w", template, err)
	}
	kt, err := checkTable(ti, spec.KeyColumn)
	if err != nil {
		return nil, nil, err
	}
	if err := checkReaders(ctx, tx, template, spec.Table); err != nil {
		return nil, nil, err
	}
	ddl, err := buildDDL(ti)
	if err != nil {
		return nil, nil, fmt.Errorf("pgshard: DDL of %s: %w", template, err)
	}
	cols := make([]string, len(ti.Columns))
	for i, col := range ti.Columns {
		cols[i] = col.Name
	}
	return &shardmap.Tree{
		Tenant:     spec.Tenant,
		Name:       spec.Table,
		KeyColumn:  spec.KeyColumn,
		KeyType:    kt,
		Columns:    cols,
		SlotCount:  spec.SlotCount,
		ShardCount: spec.ShardCount,
		DDL:        ddl,
		// In microseconds, as the catalog record keeps it (TreesTable), so
		// that a rebuilt entry is equal to this one.
		Created: time.Now().UTC().Truncate(time.Microsecond),
	}, ti, nil
}

func alreadyTree(name string) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.DuplicateTable, Message: fmt.Sprintf("relation %s is already a tree", quoted(name))}
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// shardsByNode lists the shard indices of m placed on each node, in order.
func shardsByNode(m *shardmap.Map) (nodes []string, byNode map[string][]int) {
	byNode = make(map[string][]int)
	for idx, s := range m.Shards {
		if _, ok := byNode[s.Node]; !ok {
			nodes = append(nodes, s.Node)
		}
		byNode[s.Node] = append(byNode[s.Node], idx)
	}
	sort.Strings(nodes)
	for _, idxs := range byNode {
		sort.Ints(idxs)
	}
	return nodes, byNode
}

// createShards creates every shard of a new tree, nodes in parallel. A shard
// table left by an earlier attempt that crashed is dropped first: the tree is
// not registered and its template not fenced, so nothing routes to it, and it
// may hold rows or an outdated DDL.
func (c *Cluster) createShards(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) error {
	nodes, byNode := shardsByNode(m)
	return forEachNode(ctx, nodes, func(ctx context.Context, node string) error {
		// Before DropShard, which connects to the tenant's database too.
		if err := c.EnsureTenant(ctx, node, t.Tenant); err != nil {
			return err
		}
		for _, idx := range byNode[node] {
			if err := c.DropShard(ctx, t, idx, node); err != nil {
				return err
			}
			if err := c.CreateShard(ctx, t, idx, node, m.SlotRanges(idx), m.Epoch); err != nil {
				return err
			}
		}
		return nil
	})
}

// dropShards removes the shards of a tree whose creation failed, on a
// context that outlives the caller's cancellation.
func (c *Cluster) dropShards(ctx context.Context, t *shardmap.Tree, m *shardmap.Map, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	nodes, byNode := shardsByNode(m)
	err := forEachNode(ctx, nodes, func(ctx context.Context, node string) error {
		var errs []error
		for _, idx := range byNode[node] {
			errs = append(errs, c.DropShard(ctx, t, idx, node))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		log.Error("could not drop the shards of a failed tree creation", "err", err)
	}
}

// copyColumns is the column list a binary COPY between template and shard
// carries: generated columns are computed on the shard instead.
func copyColumns(ti *tableInfo) string {
	var cols []string
	for _, col := range ti.Columns {
		if col.Generated == "" {
			cols = append(cols, quoteIdent(col.Name))
		}
	}
	return strings.Join(cols, ", ")
}

// copyRows streams each shard's rows out of the template (on src, inside the
// locking transaction) into the shard, one binary COPY pipe per shard.
func (c *Cluster) copyRows(ctx context.Context, src *pgconn.PgConn, t *shardmap.Tree, ti *tableInfo, m *shardmap.Map, log *slog.Logger) (int64, error) {
	cols := copyColumns(ti)
	template := pgx.Identifier{"public", t.Name}.Sanitize()
	idxs := make([]int, 0, len(m.Shards))
	for idx := range m.Shards {
		idxs = append(idxs, idx)
	}
	sort.Ints(idxs)
	var total int64
	for _, idx := range idxs {
		node := m.Shards[idx].Node
		out := "COPY (SELECT " + cols + " FROM " + template + " WHERE " + btreeindex.SlotPredicate(t, "", m.SlotRanges(idx)) +
			") TO STDOUT (FORMAT binary)"
		n, err := c.fillShard(ctx, src, node, t.Tenant, ShardTable(t, idx), cols, out)
		if err != nil {
			return total, fmt.Errorf("pgshard: copy rows of %s into shard %d on %s: %w", t.Name, idx, node, err)
		}
		log.Debug("shard filled", "shard", idx, "node", node, "rows", n)
		total += n
	}
	return total, nil
}

// pipeCopy runs the COPY TO out on src and streams it into the COPY FROM in on
// node; it returns the row count both agree on.
func (c *Cluster) pipeCopy(ctx context.Context, src *pgconn.PgConn, node, tenant, out, in string) (int64, error) {
	dst, err := c.adminConn(ctx, node, tenant)
	if err != nil {
		return 0, err
	}
	defer dst.Release()
	r := PipeCopy(ctx, src, out, dst.Conn().PgConn(), in)
	if err := r.Err(); err != nil {
		return 0, err
	}
	return r.Written, nil
}

// adminConn takes a control connection to tenant's database on node.
func (c *Cluster) adminConn(ctx context.Context, node, tenant string) (*pgxpool.Conn, error) {
	p, err := c.Admin(ctx, node, tenant)
	if err != nil {
		return nil, err
	}
	conn, err := p.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	return conn, nil
}

// fillShard runs the COPY TO out on src and streams it into columns cols of
// a new shard's table on node; it returns the row count both agree on. One
// transaction truncates the table, drops its indexes, copies with FREEZE
// and builds the indexes after the rows (deferindex.go): a new tree's
// creation holds its table's writers for the whole copy, and COPY into a
// table with its indexes took two to three times as long. Where the table
// cannot be truncated at once (a foreign key referencing it, a lock), it is
// filled as it is.
func (c *Cluster) fillShard(ctx context.Context, src *pgconn.PgConn, node, tenant, table, cols, out string) (int64, error) {
	dst, err := c.adminConn(ctx, node, tenant)
	if err != nil {
		return 0, err
	}
	defer dst.Release()
	tx, err := dst.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("node %s: %w", node, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	in := "COPY " + table + " (" + cols + ") FROM STDIN (FORMAT binary)"
	var rebuild IndexRebuild
	if truncated(ctx, tx, table) {
		in = "COPY " + table + " (" + cols + ") FROM STDIN (FORMAT binary, FREEZE)"
		if rebuild, err = DropIndexes(ctx, tx, []string{table}); err != nil {
			return 0, err
		}
	}
	r := PipeCopy(ctx, src, out, tx.Conn().PgConn(), in)
	if err := r.Err(); err != nil {
		return 0, err
	}
	if err := rebuild.Build(ctx, tx); err != nil {
		return 0, err
	}
	return r.Written, tx.Commit(ctx)
}

// truncated empties table in tx, waiting a second at most for its lock,
// and reports whether it did; a TRUNCATE that failed is undone.
func truncated(ctx context.Context, tx pgx.Tx, table string) bool {
	sub, err := tx.Begin(ctx)
	if err != nil {
		return false
	}
	if _, err := sub.Exec(ctx, "SET LOCAL lock_timeout = 1000; TRUNCATE "+table+"; SET LOCAL lock_timeout = DEFAULT"); err != nil {
		// A rollback that failed too leaves tx failed: the copy says so.
		_ = sub.Rollback(ctx)
		return false
	}
	return sub.Commit(ctx) == nil
}

// fenceTemplate empties the template and installs the fence. TRUNCATE comes
// first because the fence also rejects TRUNCATE.
func fenceTemplate(ctx context.Context, tx pgx.Tx, table string) error {
	template := pgx.Identifier{"public", table}.Sanitize()
	stmts := []string{
		"TRUNCATE ONLY " + template,
		// CREATE OR REPLACE FUNCTION races with itself across sessions.
		fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, -1)", schemaLockClass),
		// Not "lattice": a schema named like the role would come first in its
		// default search_path ("$user", public) and capture unqualified names.
		"CREATE SCHEMA IF NOT EXISTS " + fenceSchema,
		`CREATE OR REPLACE FUNCTION ` + fenceFunction + ` RETURNS trigger LANGUAGE plpgsql AS $fence$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = '` + sqlstate.SlotMoved + `',
        MESSAGE = format('lattice: relation "%s" is a tree now', TG_TABLE_NAME),
        HINT = 'Write through the Lattice proxy, which routes rows to the shards.';
END
$fence$`,
		"CREATE TRIGGER " + fenceTrigger + " BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON " + template +
			" FOR EACH STATEMENT EXECUTE FUNCTION " + fenceFunction,
		hideTriggerSQL(template, fenceTrigger),
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// finishTemplate empties and fences the template of a registered tree unless
// that is already done: it is for when the catalog commit of CreateTree
// failed, or may have succeeded without the reply reaching us.
func (c *Cluster) finishTemplate(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	conn, err := c.connect(ctx, c.Catalog().Name, t.Tenant)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	template := pgx.Identifier{"public", t.Name}.Sanitize()
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "LOCK TABLE "+template+" IN EXCLUSIVE MODE"); err != nil {
			return err
		}
		var fenced bool
		err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2)`,
			template, fenceTrigger).Scan(&fenced)
		if err != nil || fenced {
			return err
		}
		if err := fenceTemplate(ctx, tx, t.Name); err != nil {
			return err
		}
		return recordTree(ctx, tx, t, m)
	})
}

// TreeRowCount estimates each shard's rows (see ShardSizes). Shards whose
// table is gone are absent.
func (c *Cluster) TreeRowCount(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (map[int]int64, error) {
	sizes, err := c.ShardSizes(ctx, t, m)
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(sizes))
	for idx, s := range sizes {
		out[idx] = s.Rows
	}
	return out, nil
}

// ShardSize is one shard's size as the node's statistics estimate it.
type ShardSize struct {
	Rows  int64 // planner estimate (pg_class.reltuples)
	Bytes int64 // table, indexes and TOAST (pg_total_relation_size)
}

// ShardSizes estimates each shard's rows from the planner statistics and
// its bytes on disk, one query per node; a table never analysed reports the
// live-row count of the statistics collector instead. Shards whose table is
// gone are absent.
func (c *Cluster) ShardSizes(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (map[int]ShardSize, error) {
	nodes, byNode := shardsByNode(m)
	var mu sync.Mutex
	out := make(map[int]ShardSize, len(m.Shards))
	err := forEachNode(ctx, nodes, func(ctx context.Context, node string) error {
		schemas := make([]string, len(byNode[node]))
		for i, idx := range byNode[node] {
			schemas[i] = shardmap.SchemaName(idx)
		}
		p, err := c.Admin(ctx, node, t.Tenant)
		if err != nil {
			return err
		}
		// The live-row count is read with the statistics function itself:
		// joined, the pg_stat_user_tables view computes every relation's
		// statistics first (15 ms a call at 750 relations, against 2).
		rows, err := p.Query(ctx, `SELECT n.nspname,
    CASE WHEN c.reltuples >= 0 THEN c.reltuples::int8 ELSE pg_catalog.pg_stat_get_live_tuples(c.oid) END,
    coalesce(pg_catalog.pg_total_relation_size(c.oid), 0) -- NULL once a concurrent fold drops the table
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = $1 AND c.relkind = 'r' AND n.nspname = ANY($2)`, t.Name, schemas)
		if err != nil {
			return fmt.Errorf("pgshard: node %s: size estimates of %s: %w", node, t.Name, err)
		}
		var (
			schema string
			sz     ShardSize
		)
		_, err = pgx.ForEachRow(rows, []any{&schema, &sz.Rows, &sz.Bytes}, func() error {
			mu.Lock()
			out[byNode[node][slices.Index(schemas, schema)]] = sz
			mu.Unlock()
			return nil
		})
		if err != nil {
			return fmt.Errorf("pgshard: node %s: size estimates of %s: %w", node, t.Name, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// tableInfo is what the catalog says about a table that is to become a tree.
type tableInfo struct {
	Name        string
	OID         uint32
	Kind        string   // pg_class.relkind
	Persistence string   // pg_class.relpersistence
	Inherits    bool     // has a parent or children
	Options     []string // reloptions, "name=value"
	Columns     []columnInfo
	Constraints []constraintInfo
	Indexes     []indexInfo
	Triggers    []string // user triggers, by name
}

type columnInfo struct {
	Num              int16
	Name             string
	Type             string // format_type()
	NotNull          bool
	Default          string // the default, or a generated column's expression; "" for none
	FromSequence     bool   // the default draws from a sequence
	Identity         string // attidentity: "", "a" or "d"
	Generated        string // attgenerated: "" or "s"
	Collation        string // qualified and quoted; "" when it is the type's own
	Nondeterministic bool   // the collation is nondeterministic
}

type constraintInfo struct {
	Name      string
	Type      string // contype: p, u, c, f, x
	Def       string // pg_get_constraintdef()
	Validated bool
	// For a foreign key: whether it is this table's, the referencing and
	// referenced table names, and the referencing table as SQL.
	Outgoing bool
	From, To string
	FromSQL  string
	// For a foreign key: the referencing and referenced columns, paired in
	// order, and the pg_constraint codes of its actions and match type.
	FkCols, PkCols                  []string
	DelAction, UpdAction, MatchType string
	Deferrable, InitiallyDeferred   bool
}

type indexInfo struct {
	Name       string
	Unique     bool
	Primary    bool
	Valid      bool
	Constraint bool    // backs a constraint, which CREATE TABLE recreates
	Keys       []int16 // key column numbers (0 for an expression), INCLUDE columns left out
	Def        string  // pg_get_indexdef()
	Prefix     string  // what Def must start with, up to the access method
}

// inspectTable reads public.<name> from pg_catalog.
func inspectTable(ctx context.Context, tx pgx.Tx, name string) (*tableInfo, error) {
	ti := &tableInfo{Name: name}
	err := tx.QueryRow(ctx, `SELECT c.oid, c.relkind::text, c.relpersistence::text, coalesce(c.reloptions, '{}'),
    EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid OR i.inhparent = c.oid)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relname = $1`, name).Scan(&ti.OID, &ti.Kind, &ti.Persistence, &ti.Options, &ti.Inherits)
	if err != nil {
		return nil, fmt.Errorf("table: %w", err)
	}

	rows, err := tx.Query(ctx, `SELECT a.attnum, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
    coalesce(pg_catalog.pg_get_expr(d.adbin, d.adrelid), ''),
    d.oid IS NOT NULL AND (
        EXISTS (SELECT 1 FROM pg_catalog.pg_depend dep JOIN pg_catalog.pg_class s ON s.oid = dep.refobjid
                WHERE dep.classid = 'pg_catalog.pg_attrdef'::regclass AND dep.objid = d.oid
                  AND dep.refclassid = 'pg_catalog.pg_class'::regclass AND s.relkind = 'S')
        OR pg_catalog.pg_get_expr(d.adbin, d.adrelid) ~* '\mnextval\s*\('),
    a.attidentity::text, a.attgenerated::text,
    CASE WHEN a.attcollation <> t.typcollation AND co.oid IS NOT NULL
         THEN pg_catalog.quote_ident(cn.nspname) || '.' || pg_catalog.quote_ident(co.collname) ELSE '' END,
    coalesce(NOT co.collisdeterministic, false)
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation
LEFT JOIN pg_catalog.pg_namespace cn ON cn.oid = co.collnamespace
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`, ti.OID)
	if err != nil {
		return nil, fmt.Errorf("columns: %w", err)
	}
	var col columnInfo
	_, err = pgx.ForEachRow(rows, []any{&col.Num, &col.Name, &col.Type, &col.NotNull, &col.Default, &col.FromSequence,
		&col.Identity, &col.Generated, &col.Collation, &col.Nondeterministic}, func() error {
		ti.Columns = append(ti.Columns, col)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("columns: %w", err)
	}

	// The primary key first, then by name, so the DDL is stable.
	rows, err = tx.Query(ctx, `SELECT con.conname, con.contype::text, pg_catalog.pg_get_constraintdef(con.oid), con.convalidated,
    con.conrelid = $1, fr.relname, coalesce(tr.relname, ''), con.conrelid::regclass::text,
    ARRAY(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY k(num, ord)
          JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.num ORDER BY k.ord),
    ARRAY(SELECT a.attname::text FROM unnest(con.confkey) WITH ORDINALITY k(num, ord)
          JOIN pg_catalog.pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.num ORDER BY k.ord),
    con.confdeltype::text, con.confupdtype::text, con.confmatchtype::text, con.condeferrable, con.condeferred
FROM pg_catalog.pg_constraint con
JOIN pg_catalog.pg_class fr ON fr.oid = con.conrelid
LEFT JOIN pg_catalog.pg_class tr ON tr.oid = con.confrelid
WHERE con.conrelid = $1 OR (con.contype = 'f' AND con.confrelid = $1)
ORDER BY con.contype <> 'p', con.conname`, ti.OID)
	if err != nil {
		return nil, fmt.Errorf("constraints: %w", err)
	}
	var con constraintInfo
	_, err = pgx.ForEachRow(rows, []any{&con.Name, &con.Type, &con.Def, &con.Validated, &con.Outgoing, &con.From, &con.To, &con.FromSQL,
		&con.FkCols, &con.PkCols, &con.DelAction, &con.UpdAction, &con.MatchType, &con.Deferrable, &con.InitiallyDeferred}, func() error {
		ti.Constraints = append(ti.Constraints, con)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("constraints: %w", err)
	}

	rows, err = tx.Query(ctx, `SELECT ic.relname, i.indisunique, i.indisprimary, i.indisvalid,
    EXISTS (SELECT 1 FROM pg_catalog.pg_constraint con WHERE con.conrelid = i.indrelid AND con.conindid = i.indexrelid),
    (i.indkey::int2[])[0:i.indnkeyatts - 1],
    pg_catalog.pg_get_indexdef(i.indexrelid),
    'CREATE ' || CASE WHEN i.indisunique THEN 'UNIQUE ' ELSE '' END || 'INDEX ' || pg_catalog.quote_ident(ic.relname)
        || ' ON ' || pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) || ' USING '
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
JOIN pg_catalog.pg_class c ON c.oid = i.indrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE i.indrelid = $1
ORDER BY ic.relname`, ti.OID)
	if err != nil {
		return nil, fmt.Errorf("indexes: %w", err)
	}
	var ix indexInfo
	_, err = pgx.ForEachRow(rows, []any{&ix.Name, &ix.Unique, &ix.Primary, &ix.Valid, &ix.Constraint, &ix.Keys, &ix.Def, &ix.Prefix}, func() error {
		ti.Indexes = append(ti.Indexes, ix)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("indexes: %w", err)
	}

	// Lattice's fences are internal triggers (hidetrigger.go) but count.
	rows, err = tx.Query(ctx, `SELECT tgname FROM pg_catalog.pg_trigger
WHERE tgrelid = $1 AND (NOT tgisinternal OR tgname IN ($2, $3)) ORDER BY tgname`, ti.OID, fenceTrigger, referenceTrigger)
	if err != nil {
		return nil, fmt.Errorf("triggers: %w", err)
	}
	ti.Triggers, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("triggers: %w", err)
	}
	return ti, nil
}

// quoted renders a name the way PostgreSQL messages do.
func quoted(name string) string { return `"` + name + `"` }

// checkTable applies the rules a tree must meet and returns the key's
// hashing family.
// checkReaders refuses a table that views, materialized views, rules,
// SQL-standard function bodies or policies of other tables read: on the
// catalog node they would go on reading its template, which the tree
// leaves empty, and answer as if the tree had no rows.
func checkReaders(ctx context.Context, tx pgx.Tx, template, table string) error {
	rows, err := tx.Query(ctx, `SELECT DISTINCT pg_catalog.pg_describe_object(d.classid, d.objid, 0)
FROM pg_catalog.pg_depend d
WHERE d.refclassid = 'pg_catalog.pg_class'::regclass AND d.refobjid = $1::regclass AND d.deptype = 'n'
  AND (d.classid = 'pg_catalog.pg_rewrite'::regclass AND (SELECT r.ev_class FROM pg_catalog.pg_rewrite r WHERE r.oid = d.objid) <> $1::regclass
    OR d.classid = 'pg_catalog.pg_proc'::regclass
    OR d.classid = 'pg_catalog.pg_policy'::regclass AND (SELECT p.polrelid FROM pg_catalog.pg_policy p WHERE p.oid = d.objid) <> $1::regclass)
ORDER BY 1`, template)
	if err != nil {
		return fmt.Errorf("pgshard: objects reading %s: %w", template, err)
	}
	readers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("pgshard: objects reading %s: %w", template, err)
	}
	if len(readers) == 0 {
		return nil
	}
	return &sqlstate.Error{Code: sqlstate.DependentObjectsStillExist,
		Message: fmt.Sprintf("cannot make table %s a tree while other objects read it: %s", quoted(table), strings.Join(readers, ", ")),
		Detail:  "They run on the catalog node, where the table is left empty once its rows move to the shards: they would answer as if it had no rows.",
		Hint:    "Drop them, make the tree, and read it through the proxy instead."}
}

func checkTable(ti *tableInfo, keyColumn string) (shardmap.KeyType, error) {
	rel := quoted(ti.Name)
	unsupported := func(msg, detail, hint string) error {
		return &sqlstate.Error{Code: sqlstate.FeatureNotSupported, Message: msg, Detail: detail, Hint: hint}
	}
	switch ti.Kind {
	case "r":
	case "p":
		return "", unsupported("cannot make partitioned table "+rel+" a tree", "", "")
	default:
		return "", &sqlstate.Error{Code: sqlstate.WrongObjectType, Message: rel + " is not a table"}
	}
	if slices.Contains(ti.Triggers, fenceTrigger) {
		return "", alreadyTree(ti.Name)
	}
	if ti.Inherits {
		return "", unsupported("cannot make table "+rel+" a tree: it takes part in table inheritance", "", "")
	}
	if ti.Persistence != "p" {
		return "", unsupported("cannot make unlogged table "+rel+" a tree",
			"Shards are moved by logical replication, which does not carry unlogged tables.",
			"ALTER TABLE "+quoteIdent(ti.Name)+" SET LOGGED")
	}

	ki := slices.IndexFunc(ti.Columns, func(c columnInfo) bool { return c.Name == keyColumn })
	if ki < 0 {
		return "", &sqlstate.Error{Code: sqlstate.UndefinedColumn, Message: fmt.Sprintf("column %s of relation %s does not exist", quoted(keyColumn), rel)}
	}
	key := ti.Columns[ki]
	kt, err := shardmap.KeyTypeFor(key.Type)
	if err != nil {
		return "", unsupported(fmt.Sprintf("shard key column %s has type %s, which Lattice cannot hash", quoted(key.Name), key.Type),
			"Slots are computed with PostgreSQL's own hash functions, ported to the proxy for these types only.",
			"Use text, varchar, smallint, integer, bigint or uuid for the shard key.")
	}
	if key.Generated != "" {
		return "", unsupported(fmt.Sprintf("shard key column %s is a generated column", quoted(key.Name)),
			"Logical replication, which moves shards, does not carry generated columns.", "")
	}
	if key.Nondeterministic {
		return "", unsupported(fmt.Sprintf("shard key column %s uses nondeterministic collation %s", quoted(key.Name), key.Collation),
			"Slots are computed from the bytes of the key.", "")
	}
	for _, col := range ti.Columns {
		what := "column " + quoted(col.Name) + " of " + rel
		if col.Name == keyColumn {
			what = "shard key column " + quoted(col.Name)
		}
		detail := "Each shard would draw from its own sequence and hand out the same values twice."
		switch {
		case col.Identity != "":
			return "", unsupported(what+" is an identity column", detail,
				"Supply the values from the application or use uuid with gen_random_uuid(), then ALTER TABLE "+
					quoteIdent(ti.Name)+" ALTER COLUMN "+quoteIdent(col.Name)+" DROP IDENTITY.")
		case col.FromSequence:
			return "", unsupported(what+" takes its default from a sequence", detail,
				"Supply the values from the application or use uuid with gen_random_uuid(), then ALTER TABLE "+
					quoteIdent(ti.Name)+" ALTER COLUMN "+quoteIdent(col.Name)+" DROP DEFAULT.")
		}
	}

	for _, con := range ti.Constraints {
		switch {
		case con.Type == "f" && !con.Outgoing: // the table's own are checked by treeForeignKeys
			return "", unsupported(fmt.Sprintf("foreign key %s of table %s references %s", quoted(con.Name), quoted(con.From), rel),
				"A foreign key cannot be enforced across shards.",
				"ALTER TABLE "+con.FromSQL+" DROP CONSTRAINT "+quoteIdent(con.Name))
		case con.Type == "x":
			return "", unsupported(fmt.Sprintf("exclusion constraint %s of %s cannot be enforced across shards", quoted(con.Name), rel), "", "")
		case !con.Validated:
			return "", &sqlstate.Error{Code: sqlstate.ObjectNotInPrerequisiteState,
				Message: fmt.Sprintf("constraint %s of %s is not validated", quoted(con.Name), rel),
				Detail:  "A shard enforces it on every row it receives.",
				Hint:    "ALTER TABLE " + quoteIdent(ti.Name) + " VALIDATE CONSTRAINT " + quoteIdent(con.Name)}
		}
	}

	pk := slices.IndexFunc(ti.Indexes, func(ix indexInfo) bool { return ix.Primary })
	switch {
	case pk < 0:
		return "", &sqlstate.Error{Code: sqlstate.InvalidTableDefinition, Message: fmt.Sprintf("relation %s has no primary key", rel),
			Detail: "Shards are moved by logical replication, which identifies rows by the primary key.",
			Hint:   "Add a primary key that includes " + quoted(key.Name) + "."}
	case !slices.Contains(ti.Indexes[pk].Keys, key.Num):
		return "", &sqlstate.Error{Code: sqlstate.InvalidTableDefinition,
			Message: fmt.Sprintf("shard key column %s is not part of the primary key of %s", quoted(key.Name), rel),
			Detail:  "Each shard enforces the primary key only for its own rows.",
			Hint:    "Make the primary key include " + quoted(key.Name) + "."}
	}
	for _, ix := range ti.Indexes {
		if !ix.Valid {
			return "", &sqlstate.Error{Code: sqlstate.ObjectNotInPrerequisiteState, Message: fmt.Sprintf("index %s of %s is invalid", quoted(ix.Name), rel),
				Hint: "REINDEX INDEX " + quoteIdent(ix.Name) + ", or drop it."}
		}
		if ix.Unique && !slices.Contains(ix.Keys, key.Num) {
			return "", &sqlstate.Error{Code: sqlstate.InvalidTableDefinition,
				Message: fmt.Sprintf("unique index %s of %s does not include the shard key column %s", quoted(ix.Name), rel, quoted(key.Name)),
				Detail:  "Each shard enforces uniqueness only for its own rows.",
				Hint:    "Add " + quoted(key.Name) + " to the index, or drop it."}
		}
	}

	if len(ti.Triggers) > 0 {
		return "", unsupported(fmt.Sprintf("table %s has trigger %s", rel, quoted(ti.Triggers[0])),
			"Triggers are not recreated on the shards.", "Drop the trigger before making the table a tree.")
	}
	return kt, nil
}

// buildDDL writes the statements that build a shard table like ti, with
// "{{table}}" for the shard's qualified name: CREATE TABLE with the columns,
// the primary key, unique and check constraints and storage options, then
// CREATE INDEX for every index not behind a constraint. Index names stay as
// they are: each shard has its own schema.
func buildDDL(ti *tableInfo) ([]string, error) {
	var b strings.Builder
	b.WriteString("CREATE TABLE {{table}} (")
	sep := "\n    "
	for _, col := range ti.Columns {
		b.WriteString(sep)
		sep = ",\n    "
		b.WriteString(quoteIdent(col.Name) + " " + col.Type)
		if col.Collation != "" {
			b.WriteString(" COLLATE " + col.Collation)
		}
		switch {
		case col.Generated != "":
			b.WriteString(" GENERATED ALWAYS AS (" + col.Default + ") STORED")
		case col.Default != "":
			b.WriteString(" DEFAULT " + col.Default)
		}
		if col.NotNull {
			b.WriteString(" NOT NULL")
		}
	}
	for _, con := range ti.Constraints {
		if con.Type == "p" || con.Type == "u" || con.Type == "c" {
			b.WriteString(sep + "CONSTRAINT " + quoteIdent(con.Name) + " " + con.Def)
		}
	}
	b.WriteString("\n)")
	if len(ti.Options) > 0 {
		opts := make([]string, len(ti.Options))
		for i, o := range ti.Options {
			k, v, _ := strings.Cut(o, "=")
			opts[i] = k + " = " + quoteLiteral(v)
		}
		b.WriteString(" WITH (" + strings.Join(opts, ", ") + ")")
	}
	ddl := []string{b.String()}
	for _, ix := range ti.Indexes {
		if ix.Constraint {
			continue
		}
		rest, ok := strings.CutPrefix(ix.Def, ix.Prefix)
		if !ok {
			return nil, fmt.Errorf("index %s: unexpected definition %q", ix.Name, ix.Def)
		}
		stmt := "CREATE INDEX "
		if ix.Unique {
			stmt = "CREATE UNIQUE INDEX "
		}
		ddl = append(ddl, stmt+quoteIdent(ix.Name)+" ON {{table}} USING "+rest)
	}
	return ddl, nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// TreeEmpty reports whether no shard table of t holds a row, one query per
// node. Shards whose table is gone count as empty.
func (c *Cluster) TreeEmpty(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (bool, error) {
	nodes, byNode := shardsByNode(m)
	var mu sync.Mutex
	empty := true
	err := forEachNode(ctx, nodes, func(ctx context.Context, node string) error {
		p, err := c.Admin(ctx, node, t.Tenant)
		if err != nil {
			return err
		}
		var parts []string
		for _, idx := range byNode[node] {
			var exists bool
			if err := p.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, ShardTable(t, idx)).Scan(&exists); err != nil {
				return err
			}
			if exists {
				parts = append(parts, "SELECT EXISTS (SELECT FROM "+ShardTable(t, idx)+")")
			}
		}
		if len(parts) == 0 {
			return nil
		}
		var any bool
		if err := p.QueryRow(ctx, "SELECT bool_or(e) FROM ("+strings.Join(parts, " UNION ALL ")+") s(e)").Scan(&any); err != nil {
			return fmt.Errorf("pgshard: node %s: probe %s: %w", node, t.Name, err)
		}
		if any {
			mu.Lock()
			empty = false
			mu.Unlock()
		}
		return nil
	})
	return empty, err
}
