package pgshard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// DDLOp is what TreeDDL does to a tree.
type DDLOp int

const (
	DDLAlter       DDLOp = iota // ALTER TABLE: template and shards, logged
	DDLCreateIndex              // CREATE INDEX: template and shards, logged
	DDLDropIndex                // DROP INDEX: template and shards, logged
	DDLTruncate                 // TRUNCATE: shards (the template is empty and fenced: only locked), not logged
	DDLDropTable                // DROP TABLE: template, shards and the registry entry
	DDLMaintain                 // VACUUM, ANALYZE, REINDEX TABLE, CLUSTER: shards one by one, outside a transaction, logged only as CLUSTER ... USING's mark
)

func (o DDLOp) String() string {
	switch o {
	case DDLAlter:
		return "alter"
	case DDLCreateIndex:
		return "create-index"
	case DDLDropIndex:
		return "drop-index"
	case DDLTruncate:
		return "truncate"
	case DDLDropTable:
		return "drop-table"
	case DDLMaintain:
		return "maintain"
	}
	return fmt.Sprintf("DDLOp(%d)", int(o))
}

// TreeDDL is one DDL statement on a tree, as the router planned it.
type TreeDDL struct {
	Tenant string
	Tree   string
	Op     DDLOp
	// Concurrently runs CREATE/DROP INDEX CONCURRENTLY table by table,
	// outside a transaction, as PostgreSQL requires.
	Concurrently bool
	// Statement renders the statement for the tree's table in schema
	// ("public" for the template).
	Statement func(schema string) string
	// Log is appended to the tree's DDL log ("" for none): "{{table}}"
	// stands for the shard table and "{{schema}}" for its schema.
	Log string
	// Cascade is DROP TABLE ... CASCADE (on the template: views over it).
	Cascade bool
	// OnNotice, when set, gets the notices of a DDLMaintain statement's
	// shards (VACUUM VERBOSE's INFO lines, a skipped table's WARNING), in
	// order, for the client.
	OnNotice func(*pgconn.Notice)
}

// ddlTarget is one table a DDL statement runs against.
type ddlTarget struct {
	node   string
	schema string // "public" for the template
	shard  int    // -1 for the template
}

// ddlTargets lists the template (first) and every shard that still holds
// a table (retired shards are tombstones), by node then shard.
func (c *Cluster) ddlTargets(m *shardmap.Map) []ddlTarget {
	out := []ddlTarget{{node: c.Catalog().Name, schema: "public", shard: -1}}
	nodes, byNode := shardsByNode(m)
	for _, n := range nodes {
		for _, idx := range byNode[n] {
			if m.Shards[idx].State == shardmap.ShardRetired {
				continue
			}
			out = append(out, ddlTarget{node: n, schema: shardmap.SchemaName(idx), shard: idx})
		}
	}
	return out
}

// RunTreeDDL runs d on the template and every shard of the tree and records
// it in the registry (store): the DDL log for ALTER and the index
// statements, the column list after ALTER, or the removal of the tree for
// DROP TABLE. A statement PostgreSQL rejects on any table changes nothing
// (except CONCURRENTLY, see concurrentDDL).
func (c *Cluster) RunTreeDDL(ctx context.Context, store DDLStore, d TreeDDL, commit CommitFunc) error {
	if d.Tenant == "" {
		d.Tenant = c.DefaultTenant()
	}
	if d.Op == DDLMaintain {
		// Changes no definition: it may run beside a reshard.
		return c.maintainShards(ctx, store, d)
	}
	if err := refuseDuringReshard(ctx, store, d); err != nil {
		return err
	}
	log := c.log.With("tenant", d.Tenant, "tree", d.Tree)
	start := time.Now()
	var err error
	if d.Concurrently {
		err = c.concurrentDDL(ctx, store, d)
	} else {
		err = c.transactionalDDL(ctx, store, d, commit)
	}
	if err != nil {
		log.Warn("tree DDL failed", "op", d.Op, "err", err)
		return err
	}
	log.Info("tree DDL done", "op", d.Op, "elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// maintainShards runs VACUUM, ANALYZE, REINDEX TABLE or CLUSTER d on every shard
// table of the tree, one at a time and each outside a transaction, as
// PostgreSQL runs VACUUM over a list of tables. The template holds no rows
// and is left alone.
func (c *Cluster) maintainShards(ctx context.Context, store DDLStore, d TreeDDL) error {
	if d.Log != "" {
		// CLUSTER ... USING marks the index, and the mark is logged for the
		// shards made later: it is DDL in that, held and checked as CREATE
		// INDEX CONCURRENTLY is, or a reshard's new shards could miss it.
		unlock, err := c.holdCheckedTreeDDL(ctx, store, d)
		if err != nil {
			return err
		}
		defer unlock()
	}
	t, m, err := readTree(ctx, store, d)
	if err != nil {
		return err
	}
	shards := c.ddlTargets(m)[1:]
	conns := map[string]*pgx.Conn{}
	defer func() {
		for _, conn := range conns {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for i, tg := range shards {
		err := c.maintainShard(ctx, conns, t.Tenant, tg.node, d, tg.schema)
		if err != nil {
			return &sqlstate.Error{Code: sqlstate.As(err).Code, Message: fmt.Sprintf("pgshard: node %s, %s: %v", tg.node, tableName(t, tg), err),
				Detail: fmt.Sprintf("%d of the tree's %d shard tables were done before it.", i, len(shards)),
				Hint:   "Run the statement again once the cause is fixed."}
		}
	}
	// CLUSTER ... USING: shards made later are marked too.
	return appendLog(ctx, store, t, d.Log)
}

// maintainShard runs d on one shard table, on a connection of its own per
// node (conns), whose notices go to d.OnNotice: a pooled connection's
// would go to no one.
func (c *Cluster) maintainShard(ctx context.Context, conns map[string]*pgx.Conn, tenant, node string, d TreeDDL, schema string) error {
	conn := conns[node]
	if conn == nil {
		var err error
		conn, err = c.connectConfig(ctx, node, tenant, func(cfg *pgx.ConnConfig) {
			if d.OnNotice != nil {
				cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { d.OnNotice(n) }
			}
		})
		if err != nil {
			return err
		}
		conns[node] = conn
	}
	_, err := conn.Exec(ctx, d.Statement(schema))
	return err
}

// readTree reads the registry entry and the map of d's tree.
func readTree(ctx context.Context, store shardmap.Store, d TreeDDL) (*shardmap.Tree, *shardmap.Map, error) {
	t, err := store.Tree(ctx, d.Tenant, d.Tree)
	if errors.Is(err, shardmap.ErrNotFound) {
		return nil, nil, &sqlstate.Error{Code: sqlstate.UndefinedTable, Message: fmt.Sprintf("tree %s does not exist", quoted(d.Tree)),
			Hint: "Another session dropped it; run the statement again."}
	}
	if err != nil {
		return nil, nil, err
	}
	m, err := store.Map(ctx, d.Tenant, t.MapName())
	if err != nil {
		return nil, nil, err
	}
	return t, m, nil
}

// nodeTx is the open DDL transaction on one node.
type nodeTx struct {
	node string
	tx   pgx.Tx
	conn *pgxpool.Conn
}

// transactionalDDL runs d in one transaction per node, the catalog node's
// first (its advisory lock serialises DDL on the tree across proxies, and
// the template is changed before any shard), records the change in the
// registry, and then commits the nodes with commitDDL.
func (c *Cluster) transactionalDDL(ctx context.Context, store DDLStore, d TreeDDL, commit CommitFunc) error {
	var txs []*nodeTx
	defer func() {
		for _, n := range txs {
			_ = n.tx.Rollback(context.WithoutCancel(ctx)) // no-op once committed
			n.conn.Release()
		}
	}()
	open := func(node string) (*nodeTx, error) {
		for _, n := range txs {
			if n.node == node {
				return n, nil
			}
		}
		p, err := c.Admin(ctx, node, d.Tenant)
		if err != nil {
			return nil, err
		}
		conn, err := p.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("pgshard: node %s: %w", node, err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			conn.Release()
			return nil, fmt.Errorf("pgshard: node %s: %w", node, err)
		}
		n := &nodeTx{node: node, tx: tx, conn: conn}
		txs = append(txs, n)
		return n, nil
	}
	// The catalog node's transaction holds the tree's DDL lock (ddllock.go)
	// to its commit: a statement reads the registry entry only once it
	// holds it, and a migration's prepare waits for it.
	catPool, err := c.Admin(ctx, c.Catalog().Name, d.Tenant)
	if err != nil {
		return err
	}
	catConn, catTx, err := beginTreeDDL(ctx, catPool, d.Tree)
	if err != nil {
		return err
	}
	txs = append(txs, &nodeTx{node: c.Catalog().Name, tx: catTx, conn: catConn})
	t, m, err := readTree(ctx, store, d)
	if err != nil {
		return err
	}
	var columns []string
	for _, tg := range c.ddlTargets(m) {
		n, err := open(tg.node)
		if err != nil {
			return err
		}
		if err := c.ddlOn(ctx, n.tx, t, d, tg); err != nil {
			return err
		}
		if tg.shard < 0 && (d.Op == DDLAlter || d.Op == DDLCreateIndex) {
			if columns, err = checkTemplate(ctx, n.tx, store, t); err != nil {
				return err
			}
		}
	}

	// Checked again just before the commit: a reshard may have started
	// while the statement ran.
	if err := refuseDuringReshard(ctx, store, d); err != nil {
		return err
	}
	// The registry changes before the nodes commit: a registry failure
	// here still rolls every node back.
	switch {
	case d.Op == DDLDropTable:
		if err := store.DeleteTree(ctx, t.Tenant, t.Name); err != nil {
			return fmt.Errorf("pgshard: unregister tree %s: %w", t.Name, err)
		}
	case d.Log != "" || columns != nil:
		next := *t
		if d.Log != "" {
			next.DDL = append(slices.Clone(t.DDL), d.Log)
		}
		if columns != nil {
			next.Columns = columns
		}
		if err := store.SwapTree(ctx, &next, t); err != nil {
			if errors.Is(err, shardmap.ErrConflict) {
				return &sqlstate.Error{Code: sqlstate.SerializationFailure, Message: fmt.Sprintf("tree %s was changed by another session during this statement", quoted(t.Name)),
					Hint: "Run the statement again."}
			}
			return fmt.Errorf("pgshard: record DDL of tree %s: %w", t.Name, err)
		}
	}
	nodes := make([]string, len(txs))
	commits := make([]pgx.Tx, len(txs))
	for i, n := range txs {
		nodes[i], commits[i] = n.node, n.tx
	}
	return commitDDL(ctx, d.Tenant, t.Name, nodes, commits, commit)
}

// CommitFunc commits per-node transactions of database together: on
// return with a nil error every node committed, otherwise none did. The
// proxy's two-phase commit coordinator provides it.
type CommitFunc func(ctx context.Context, database string, nodes []string, txs []pgx.Tx) error

// commitDDL ends the per-node transactions of one DDL statement: a plain
// COMMIT on one node, commit on several, all or none.
func commitDDL(ctx context.Context, database, tree string, nodes []string, txs []pgx.Tx, commit CommitFunc) error {
	switch {
	case len(txs) == 1:
		return txs[0].Commit(ctx)
	case commit == nil:
		return &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
			Message: fmt.Sprintf("DDL on tree %s runs on nodes %s and needs two-phase commit, which this process lacks", quoted(tree), strings.Join(nodes, ", "))}
	}
	return commit(ctx, database, nodes, txs)
}

// ddlOn runs d against one table inside tx.
func (c *Cluster) ddlOn(ctx context.Context, tx pgx.Tx, t *shardmap.Tree, d TreeDDL, tg ddlTarget) error {
	var stmt string
	switch {
	case d.Op == DDLTruncate && tg.shard < 0:
		// The template is empty, and its fence refuses TRUNCATE; its lock
		// is the one LOCK TABLE on the tree takes (router/plan.go).
		stmt = "LOCK TABLE " + pgx.Identifier{"public", t.Name}.Sanitize() + " IN ACCESS EXCLUSIVE MODE"
	case d.Op == DDLDropTable && tg.shard >= 0:
		return dropShardTx(ctx, tx, t, tg.shard)
	case d.Op == DDLDropTable:
		stmt = "DROP TABLE " + pgx.Identifier{"public", t.Name}.Sanitize()
		if d.Cascade {
			stmt += " CASCADE"
		}
	default:
		stmt = d.Statement(tg.schema)
	}
	if _, err := tx.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("pgshard: node %s, %s: %w", tg.node, tableName(t, tg), err)
	}
	if d.Op == DDLDropTable {
		return forgetTree(ctx, tx, t)
	}
	return nil
}

func tableName(t *shardmap.Tree, tg ddlTarget) string {
	return pgx.Identifier{tg.schema, t.Name}.Sanitize()
}

// checkTemplate reads the template as the statement left it (inside tx)
// and checks it still meets the rules routing relies on, whatever the
// statement did (the router checks the statement; this catches what only
// the catalog knows, such as dropping the primary key by its name). It
// returns the columns in table order.
func checkTemplate(ctx context.Context, tx pgx.Tx, store shardmap.Store, t *shardmap.Tree) ([]string, error) {
	ti, err := inspectTable(ctx, tx, t.Name)
	if err != nil {
		return nil, fmt.Errorf("pgshard: inspect template %s: %w", t.Name, err)
	}
	rel := quoted(t.Name)
	invalid := func(msg, detail, hint string) error {
		return &sqlstate.Error{Code: sqlstate.InvalidTableDefinition, Message: msg, Detail: detail, Hint: hint}
	}
	ki := slices.IndexFunc(ti.Columns, func(c columnInfo) bool { return c.Name == t.KeyColumn })
	if ki < 0 {
		return nil, invalid(fmt.Sprintf("tree %s would lose its shard key column %s", rel, quoted(t.KeyColumn)), "", "")
	}
	key := ti.Columns[ki]
	if kt, err := shardmap.KeyTypeFor(key.Type); err != nil || kt != t.KeyType {
		return nil, &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
			Message: fmt.Sprintf("shard key column %s of tree %s would change its type to %s", quoted(key.Name), rel, key.Type),
			Detail:  "Every row's shard is computed from the key's value as its type hashes it."}
	}
	pk := slices.IndexFunc(ti.Indexes, func(ix indexInfo) bool { return ix.Primary })
	if pk < 0 || !slices.Contains(ti.Indexes[pk].Keys, key.Num) {
		return nil, invalid(fmt.Sprintf("tree %s must keep a primary key that includes %s", rel, quoted(key.Name)),
			"Shards are moved by logical replication, which identifies rows by the primary key.",
			"Add the new primary key in the same ALTER TABLE that drops the old one.")
	}
	for _, ix := range ti.Indexes {
		if ix.Unique && !slices.Contains(ix.Keys, key.Num) {
			return nil, invalid(fmt.Sprintf("unique index %s of tree %s does not include the shard key column %s", quoted(ix.Name), rel, quoted(key.Name)),
				"Each shard enforces uniqueness only for its own rows.", "Add "+quoted(key.Name)+" to the index.")
		}
	}
	for _, con := range ti.Constraints {
		if con.Type == "f" {
			if err := checkForeignKey(ctx, store, t, con); err != nil {
				return nil, err
			}
		}
	}
	if err := refuseReferenceCycle(ctx, tx, t); err != nil {
		return nil, err
	}
	for _, col := range ti.Columns {
		if col.Identity != "" || col.FromSequence {
			return nil, &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
				Message: fmt.Sprintf("column %s of tree %s cannot take its values from a sequence or identity", quoted(col.Name), rel),
				Detail:  "Each shard would draw from its own sequence and hand out the same values twice."}
		}
	}
	cols := make([]string, len(ti.Columns))
	for i, col := range ti.Columns {
		cols[i] = col.Name
	}
	return cols, nil
}

// concurrentDDL runs CREATE or DROP INDEX CONCURRENTLY table by table. If
// CREATE fails on one table, the indexes it made on the tables before, and
// the invalid one it left where it failed, are dropped again, so the tree
// is as it was. A DROP that fails leaves the index dropped on the tables
// before; running DROP INDEX CONCURRENTLY IF EXISTS again finishes it.
func (c *Cluster) concurrentDDL(ctx context.Context, store DDLStore, d TreeDDL) error {
	unlock, err := c.holdCheckedTreeDDL(ctx, store, d)
	if err != nil {
		return err
	}
	defer unlock()
	t, m, err := readTree(ctx, store, d)
	if err != nil {
		return err
	}
	targets := c.ddlTargets(m)
	type made struct {
		tg    ddlTarget
		added []string // qualified names of the indexes CREATE INDEX added
	}
	var done []made
	for _, tg := range targets {
		p, err := c.Admin(ctx, tg.node, t.Tenant)
		if err != nil {
			return err
		}
		var before []string
		if d.Op == DDLCreateIndex {
			if before, err = tableIndexes(ctx, p, t, tg); err != nil {
				return err
			}
		}
		_, runErr := p.Exec(ctx, d.Statement(tg.schema))
		m := made{tg: tg}
		if d.Op == DDLCreateIndex {
			after, err := tableIndexes(ctx, p, t, tg)
			if err != nil {
				return errors.Join(runErr, err)
			}
			for _, ix := range after {
				if !slices.Contains(before, ix) {
					m.added = append(m.added, ix)
				}
			}
		}
		if runErr == nil {
			done = append(done, m)
			continue
		}
		runErr = fmt.Errorf("pgshard: node %s, %s: %w", tg.node, tableName(t, tg), runErr)
		if d.Op != DDLCreateIndex {
			if len(done) == 0 {
				return runErr
			}
			return &sqlstate.Error{Code: sqlstate.As(runErr).Code, Message: runErr.Error(),
				Detail: fmt.Sprintf("The index was already dropped from %d of the tree's %d tables.", len(done), len(targets)),
				Hint:   "Run DROP INDEX CONCURRENTLY IF EXISTS again once the cause is fixed."}
		}
		// Undo on a context that outlives a cancelled statement.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		var undoErrs []error
		for _, u := range append(done, m) {
			up, err := c.Admin(uctx, u.tg.node, t.Tenant)
			if err != nil {
				undoErrs = append(undoErrs, err)
				continue
			}
			for _, ix := range u.added {
				if _, err := up.Exec(uctx, "DROP INDEX CONCURRENTLY IF EXISTS "+ix); err != nil {
					undoErrs = append(undoErrs, fmt.Errorf("node %s: drop %s: %w", u.tg.node, ix, err))
				}
			}
		}
		if len(undoErrs) > 0 {
			return &sqlstate.Error{Code: sqlstate.As(runErr).Code, Message: runErr.Error(),
				Detail: "Dropping the indexes it created on the other tables failed too: " + errors.Join(undoErrs...).Error(),
				Hint:   "Drop those indexes on the nodes by hand."}
		}
		return runErr
	}
	// The index is on every table: the log must get it.
	return appendLog(ctx, store, t, d.Log)
}

// appendLog appends entry ("" for none) to t's DDL log, for a statement
// that has already run on every table outside a transaction: a lost
// compare-and-set is retried on the fresh entry.
func appendLog(ctx context.Context, store shardmap.Store, t *shardmap.Tree, entry string) error {
	if entry == "" {
		return nil
	}
	for attempt := 0; ; attempt++ {
		cur, err := store.Tree(ctx, t.Tenant, t.Name)
		if err != nil {
			return fmt.Errorf("pgshard: record DDL of tree %s: %w", t.Name, err)
		}
		next := *cur
		next.DDL = append(slices.Clone(cur.DDL), entry)
		err = store.SwapTree(ctx, &next, cur)
		if err == nil {
			return nil
		}
		if !errors.Is(err, shardmap.ErrConflict) || attempt >= 10 {
			return fmt.Errorf("pgshard: record DDL of tree %s: %w", t.Name, err)
		}
	}
}

// tableIndexes lists the qualified names of the indexes of one table.
func tableIndexes(ctx context.Context, p *pgxpool.Pool, t *shardmap.Tree, tg ddlTarget) ([]string, error) {
	rows, err := p.Query(ctx, `SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(ic.relname)
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
JOIN pg_catalog.pg_namespace n ON n.oid = ic.relnamespace
WHERE i.indrelid = $1::regclass`, tableName(t, tg))
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: indexes of %s: %w", tg.node, tableName(t, tg), err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: indexes of %s: %w", tg.node, tableName(t, tg), err)
	}
	return out, nil
}

// IndexTable returns the table that index public.<index> belongs to on the
// catalog node, or "" when there is no such index.
func (c *Cluster) IndexTable(ctx context.Context, tenant, index string) (string, error) {
	if tenant == "" {
		tenant = c.DefaultTenant()
	}
	p, err := c.Admin(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return "", err
	}
	var table string
	err = p.QueryRow(ctx, `SELECT c.relname::text FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
JOIN pg_catalog.pg_class c ON c.oid = i.indrelid
JOIN pg_catalog.pg_namespace n ON n.oid = ic.relnamespace
WHERE n.nspname = 'public' AND ic.relname = $1`, index).Scan(&table)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("pgshard: table of index %s: %w", index, err)
	}
	return table, nil
}
