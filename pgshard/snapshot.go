package pgshard

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// HeldSnapshot is a snapshot exported on one node, valid while its
// exporting transaction stays open (until Close): lattice_snapshot copies
// each shard of the node under it, on a second connection.
type HeldSnapshot struct {
	Node string
	ID   string
	conn *pgx.Conn
}

// OpenSnapshotConn opens the connection a snapshot is exported on later,
// so that the export itself is one round trip inside a write pause.
func (c *Cluster) OpenSnapshotConn(ctx context.Context, node, tenant string) (*HeldSnapshot, error) {
	conn, err := c.connect(ctx, node, tenant)
	if err != nil {
		return nil, err
	}
	return &HeldSnapshot{Node: node, conn: conn}, nil
}

// Export begins the exporting transaction and exports its snapshot.
func (h *HeldSnapshot) Export(ctx context.Context) error {
	rs, err := h.conn.PgConn().Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT pg_export_snapshot()").ReadAll()
	if err != nil {
		return fmt.Errorf("pgshard: export snapshot on %s: %w", h.Node, err)
	}
	if last := rs[len(rs)-1]; len(last.Rows) == 1 {
		h.ID = string(last.Rows[0][0])
		return nil
	}
	return fmt.Errorf("pgshard: export snapshot on %s: no snapshot name", h.Node)
}

// Close ends the exporting transaction (and with it the snapshot).
func (h *HeldSnapshot) Close(ctx context.Context) {
	if h != nil && h.conn != nil {
		h.conn.Close(ctx)
	}
}

// PreparedWriters counts the locks that prepared transactions, not yet
// committed or rolled back, hold on the shard tables of idxs of t on node.
// A snapshot is exported only once it is zero on every node: such a
// transaction is part of a two-phase commit whose other parts may already
// be committed elsewhere.
func (c *Cluster) PreparedWriters(ctx context.Context, node string, t *shardmap.Tree, idxs []int) (int, error) {
	p, err := c.Admin(ctx, node, t.Tenant)
	if err != nil {
		return 0, err
	}
	tables := make([]string, len(idxs))
	for i, idx := range idxs {
		tables[i] = ShardTable(t, idx)
	}
	var n int
	// pid is null for a lock a prepared transaction holds.
	err = p.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_locks l
WHERE l.pid IS NULL AND l.locktype = 'relation'
  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
  AND l.relation IN (SELECT to_regclass(x) FROM unnest($1::text[]) x)`, tables).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("pgshard: prepared transactions on %s: %w", node, err)
	}
	return n, nil
}

// CopyShardUnder copies the rows of slots of shard idx of src into the
// same shard of dst, on node, in one transaction under the exported
// snapshot: INSERT ... SELECT, on the node, with no row leaving it. It
// returns the rows copied.
func (c *Cluster) CopyShardUnder(ctx context.Context, node, snapshot string, src, dst *shardmap.Tree, idx int, slots [][2]int) (int64, error) {
	conn, err := c.connect(ctx, node, src.Tenant)
	if err != nil {
		return 0, err
	}
	defer closeConn(conn)
	var n int64
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snapshot)); err != nil {
			return err
		}
		// Generated columns are computed on insert.
		var cols string
		if err := tx.QueryRow(ctx, `SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_catalog.pg_attribute
WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = ''`, ShardTable(src, idx)).Scan(&cols); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, "INSERT INTO "+ShardTable(dst, idx)+" ("+cols+") SELECT "+cols+" FROM "+ShardTable(src, idx)+" x WHERE "+
			btreeindex.SlotPredicate(src, "x", slots))
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("pgshard: copy shard %d of %s into %s on %s: %w", idx, src.Name, dst.Name, node, err)
	}
	return n, nil
}

// TableExists reports whether public.<name> exists in the tenant's
// database on the catalog node.
func (c *Cluster) TableExists(ctx context.Context, tenant, name string) (bool, error) {
	p, err := c.Admin(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return false, err
	}
	var ok bool
	err = p.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{"public", name}.Sanitize()).Scan(&ok)
	return ok, err
}

// RegisterTreeCopy registers t, whose shards are made and filled already,
// with its map m: on the catalog node its empty, fenced template (built
// from its DDL log) and its record, then the registry entry in store, in
// the catalog transaction, so that a failure leaves neither. A table of
// the name is refused with 42P07. await, when set, then waits as
// TreeSpec.AwaitProxies does.
func (c *Cluster) RegisterTreeCopy(ctx context.Context, store shardmap.Store, t *shardmap.Tree, m *shardmap.Map,
	await func(context.Context, *shardmap.Tree, *shardmap.Map) error) error {
	conn, err := c.connect(ctx, c.Catalog().Name, t.Tenant)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	template := pgx.Identifier{"public", t.Name}.Sanitize()
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		r := strings.NewReplacer("{{table}}", template, "{{schema}}", quoteIdent("public"))
		for _, stmt := range t.DDL {
			if _, err := tx.Exec(ctx, r.Replace(stmt)); err != nil {
				if sqlstate.Is(err, sqlstate.DuplicateTable) {
					return &sqlstate.Error{Code: sqlstate.DuplicateTable, Message: fmt.Sprintf("relation %s already exists", quoted(t.Name)),
						Hint: "Choose another name for the snapshot."}
				}
				return fmt.Errorf("pgshard: template of %s: %w", t.Name, err)
			}
		}
		if err := fenceTemplate(ctx, tx, t.Name); err != nil {
			return err
		}
		if err := recordTree(ctx, tx, t, m); err != nil {
			return err
		}
		if err := store.CreateTree(ctx, t, m); err != nil {
			if errors.Is(err, shardmap.ErrExists) {
				return alreadyTree(t.Name)
			}
			return err
		}
		return nil
	})
	if err != nil || await == nil {
		return err
	}
	if err := await(ctx, t, m); err != nil {
		return fmt.Errorf("pgshard: tree %s is registered, but not every proxy routes by it yet: %w", t.Name, err)
	}
	return nil
}

// CopyDDL is the DDL log of a tree named name shaped like tree src: the
// statements buildDDL writes for a table made LIKE src's template
// INCLUDING ALL, in a catalog transaction that is rolled back, and src's
// foreign keys to reference tables and to itself. Index and
// constraint names then follow the new name, as PostgreSQL chooses them,
// so that the copy's shard tables can share the shard schemas with src's.
func (c *Cluster) CopyDDL(ctx context.Context, tenant, src, name string) ([]string, error) {
	conn, err := c.connect(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return nil, err
	}
	defer closeConn(conn)
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "CREATE TABLE "+pgx.Identifier{"public", name}.Sanitize()+" (LIKE "+pgx.Identifier{"public", src}.Sanitize()+" INCLUDING ALL)"); err != nil {
		if sqlstate.Is(err, sqlstate.DuplicateTable) {
			return nil, &sqlstate.Error{Code: sqlstate.DuplicateTable, Message: fmt.Sprintf("relation %s already exists", quoted(name)),
				Hint: "Choose another name for the snapshot."}
		}
		return nil, fmt.Errorf("pgshard: DDL of %s like %s: %w", name, src, err)
	}
	ti, err := inspectTable(ctx, tx, name)
	if err != nil {
		return nil, fmt.Errorf("pgshard: DDL of %s like %s: %w", name, src, err)
	}
	ddl, err := buildDDL(ti)
	if err != nil {
		return nil, err
	}
	// LIKE copies no foreign key. The copy keeps src's to reference tables
	// (every node holding its shards has their copies) and to src itself
	// (then to the copy, which has every row src had), not those to
	// another tree: the copy stands alone, and that tree's rows are not
	// copied with it.
	sti, err := inspectTable(ctx, tx, src)
	if err != nil {
		return nil, fmt.Errorf("pgshard: DDL of %s like %s: %w", name, src, err)
	}
	fks, err := templateForeignKeys(ctx, tx, sti)
	if err != nil {
		return nil, fmt.Errorf("pgshard: DDL of %s like %s: %w", name, src, err)
	}
	for _, fk := range fks {
		if fk.to.tree == nil {
			ddl = append(ddl, foreignKeyStatement(fk.con, fk.to))
		}
	}
	return ddl, nil
}
