package pgshard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Reference tables on the nodes (docs/DESIGN.md, "Reference tables").
//
// Every copy, public.<name> in the tenant's database, carries a fence
// trigger. A write passes it only when its transaction set
// lattice.reference_nodes (ReferenceNodesSQL, which the proxy runs before
// every write of a reference table) and, on the catalog node, only when
// that list is the one lattice_meta.reference_tables holds for the table,
// read FOR SHARE. So a proxy that does not know the table is a reference
// table, or knows an old list of copies, gets LT001 (and reads the
// registry again) instead of writing a wrong set of copies; and a copy
// being made (CopyReferences) holds the catalog copy's table lock, under
// which no write reaches the catalog node, until the new list is committed.

const (
	referenceMeta    = "lattice_meta.reference_tables"
	referenceFence   = "lattice_meta.reference_fence()"
	referenceTrigger = "lattice_reference_fence"
	// ReferenceSetting names the copies a write of a reference table goes to.
	ReferenceSetting = "lattice.reference_nodes"
)

// referenceLockKey serializes the creation of the meta objects on a node.
const referenceLockKey = -2

var referenceMetaDDL = []string{
	`CREATE SCHEMA IF NOT EXISTS lattice_meta`,
	`CREATE TABLE IF NOT EXISTS ` + referenceMeta + ` (name text PRIMARY KEY, nodes text[] NOT NULL)`,
	referencePassDDL,
	`CREATE OR REPLACE FUNCTION ` + referenceFence + ` RETURNS trigger
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fence$
BEGIN
    PERFORM ` + referencePass + `(TG_TABLE_NAME);
    RETURN NULL;
END
$fence$`,
	`REVOKE ALL ON ` + referenceMeta + ` FROM PUBLIC`,
}

// ReferenceNodesSQL is what a transaction runs on every node before it
// writes a reference table held by nodes.
func ReferenceNodesSQL(nodes []string) string {
	return "SET LOCAL " + ReferenceSetting + " TO " + quoteLiteral(strings.Join(nodes, ","))
}

// ReferenceCopyLockSQL is what a COPY into reference table name runs on
// the catalog copy before its rows: a lock that waits for every other
// writer of the table to end and holds new ones back (they all take the
// catalog copy first), while reads go on.
func ReferenceCopyLockSQL(name string) string {
	return "LOCK TABLE " + referenceQuoted(name) + " IN SHARE ROW EXCLUSIVE MODE"
}

// ReferenceCheck tells whether an expression (a column default) would
// give another value on each node; it names the offending call, "" if
// none. The router's PerNodeValue is one.
type ReferenceCheck func(sql string) string

func referenceQuoted(name string) string { return pgx.Identifier{"public", name}.Sanitize() }

// ensureReferenceMeta creates the meta table and the fence function in
// tenant's database on node.
func (c *Cluster) ensureReferenceMeta(ctx context.Context, node, tenant string) error {
	if err := c.EnsureTenant(ctx, node, tenant); err != nil {
		return err
	}
	if err := c.EnsureRole(ctx, node, tenant); err != nil {
		return err
	}
	p, err := c.Admin(ctx, node, tenant)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, int32(schemaLockClass), int32(referenceLockKey)); err != nil {
			return err
		}
		// The tenant's writes run the fence, and its DDL on a copy (CREATE
		// INDEX) creates in public, as on the catalog node.
		role := quoteIdent(TenantRole(tenant))
		meta := append(slices.Clone(referenceMetaDDL), referenceGuardDDL(p.Config().ConnConfig.User)...)
		for _, s := range append(meta, "GRANT USAGE ON SCHEMA lattice_meta TO "+role,
			"GRANT EXECUTE ON FUNCTION "+referenceFence+" TO "+role, "GRANT USAGE, CREATE ON SCHEMA public TO "+role) {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("node %s: %w", node, err)
			}
		}
		return nil
	})
}

// referenceSource is the catalog copy held under EXCLUSIVE lock, so that no
// write reaches any copy while it is read, with what building a copy needs.
type referenceSource struct {
	conn  *pgx.Conn
	tx    pgx.Tx
	ti    *tableInfo
	ddl   []string
	owner string
	// grants are the catalog copy's grants to other roles than its owner,
	// table and column ones, as statements: a copy made later (a new
	// reference table, a node added) must allow what the catalog copy
	// allows, as GRANT and REVOKE through the proxy keep it on every copy.
	grants []string
}

func (s *referenceSource) close(ctx context.Context) {
	_ = s.tx.Rollback(context.WithoutCancel(ctx))
	closeConn(s.conn)
}

// lockReference opens the catalog copy of tenant's table name under lock.
func (c *Cluster) lockReference(ctx context.Context, tenant, name string) (*referenceSource, error) {
	conn, err := c.connect(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		closeConn(conn)
		return nil, err
	}
	s := &referenceSource{conn: conn, tx: tx}
	fail := func(err error) (*referenceSource, error) {
		s.close(ctx)
		return nil, err
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, referenceQuoted(name)).Scan(&exists); err != nil {
		return fail(err)
	}
	if !exists {
		return fail(sqlstate.New(sqlstate.UndefinedTable, "relation %s does not exist on the catalog node", quoted(name)))
	}
	// The table lock first: a writer takes it before its fence reads the
	// meta row, so taking them in the other order could deadlock.
	if err := lockReferenceTable(ctx, tx, name); err != nil {
		return fail(err)
	}
	if s.ti, err = inspectTable(ctx, tx, name); err != nil {
		return fail(fmt.Errorf("pgshard: inspect %s: %w", name, err))
	}
	if s.ddl, err = buildDDL(s.ti); err != nil {
		return fail(err)
	}
	for i, d := range s.ddl {
		s.ddl[i] = strings.ReplaceAll(d, "{{table}}", referenceQuoted(name))
	}
	if err := tx.QueryRow(ctx, `SELECT pg_catalog.pg_get_userbyid(relowner) FROM pg_catalog.pg_class WHERE oid = $1`, s.ti.OID).Scan(&s.owner); err != nil {
		return fail(err)
	}
	rows, err := tx.Query(ctx, `WITH acl AS (
    SELECT '' AS col, a.* FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a WHERE c.oid = $1
  UNION ALL
    SELECT ' (' || pg_catalog.quote_ident(att.attname) || ')', a.*
    FROM pg_catalog.pg_attribute att, pg_catalog.aclexplode(att.attacl) a
    WHERE att.attrelid = $1 AND att.attnum > 0 AND NOT att.attisdropped
)
SELECT 'GRANT ' || privilege_type || col || ' ON TABLE ' || $2 || ' TO '
    || CASE WHEN grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(grantee)) END
    || CASE WHEN is_grantable THEN ' WITH GRANT OPTION' ELSE '' END
FROM acl WHERE grantee <> (SELECT relowner FROM pg_catalog.pg_class WHERE oid = $1)
ORDER BY 1`, s.ti.OID, referenceQuoted(name))
	if err == nil {
		s.grants, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return fail(fmt.Errorf("pgshard: grants of %s: %w", name, err))
	}
	return s, nil
}

// checkReference applies the rules a reference table must meet: its
// copies must compute the same rows from the same statements.
func checkReference(ti *tableInfo, refs map[string]bool, perNode ReferenceCheck) error {
	refuse := func(hint, format string, args ...any) error {
		e := sqlstate.New(sqlstate.FeatureNotSupported, format, args...)
		e.Hint = hint
		return e
	}
	if ti.Kind != "r" || ti.Inherits {
		return refuse("Make a plain table (not partitioned, inherited, a view or foreign).",
			"%s cannot be a reference table: it is not a plain table", quoted(ti.Name))
	}
	if ti.Persistence != "p" {
		return refuse("Make the table logged (ALTER TABLE ... SET LOGGED).", "%s cannot be a reference table: it is unlogged or temporary", quoted(ti.Name))
	}
	for _, col := range ti.Columns {
		if col.Identity != "" || col.FromSequence {
			return refuse("Drop the default (or identity) and supply the values from the application.",
				"column %s of %s takes its values from a sequence: each node would draw its own", quoted(col.Name), quoted(ti.Name))
		}
		if col.Default != "" && col.Generated == "" {
			if f := perNode("SELECT " + col.Default); f != "" {
				return refuse("Drop the default and supply the value in each statement.",
					"the default of column %s of %s uses %s, whose value would differ between the nodes", quoted(col.Name), quoted(ti.Name), f)
			}
		}
	}
	if len(ti.Triggers) > 0 {
		return refuse("Drop the triggers first: they would run on the catalog node's copy only.",
			"%s cannot be a reference table: it has triggers (%s)", quoted(ti.Name), strings.Join(ti.Triggers, ", "))
	}
	for _, con := range ti.Constraints {
		if con.Type == "f" && con.Outgoing && con.To != ti.Name && !refs[con.To] {
			return refuse("Make "+quoted(con.To)+" a reference table first, or drop the foreign key.",
				"%s has a foreign key to %s, which the other nodes do not hold", quoted(ti.Name), quoted(con.To))
		}
	}
	return nil
}

// buildCopy makes node's copy of the table src holds: the table, its
// owner and grants, its rows and its fence, in that order (the fence would
// refuse the rows).
func (c *Cluster) buildCopy(ctx context.Context, src *referenceSource, node, tenant string) (int64, error) {
	if err := c.ensureReferenceMeta(ctx, node, tenant); err != nil {
		return 0, err
	}
	p, err := c.Admin(ctx, node, tenant)
	if err != nil {
		return 0, err
	}
	table := referenceQuoted(src.ti.Name)
	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		for _, d := range src.ddl {
			if _, err := tx.Exec(ctx, d); err != nil {
				return fmt.Errorf("%q: %w", d, err)
			}
		}
		if _, err := tx.Exec(ctx, "ALTER TABLE "+table+" OWNER TO "+quoteIdent(src.owner)); err != nil {
			return err
		}
		for _, g := range src.grants {
			if _, err := tx.Exec(ctx, g); err != nil {
				return fmt.Errorf("%s: %w", g, err)
			}
		}
		return grantShard(ctx, tx, tenant, "public", table)
	})
	if err != nil {
		return 0, fmt.Errorf("pgshard: create the copy of reference table %s on node %s: %w", src.ti.Name, node, err)
	}
	cols := copyColumns(src.ti)
	n, err := c.pipeCopy(ctx, src.tx.Conn().PgConn(), node, tenant,
		"COPY (SELECT "+cols+" FROM "+table+") TO STDOUT (FORMAT binary)", "COPY "+table+" ("+cols+") FROM STDIN (FORMAT binary)")
	if err != nil {
		return 0, fmt.Errorf("pgshard: copy the rows of reference table %s to node %s: %w", src.ti.Name, node, err)
	}
	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		for _, s := range fenceReferenceSQL(src.ti.Name) {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("pgshard: fence the copy of reference table %s on node %s: %w", src.ti.Name, node, err)
	}
	return n, nil
}

// fenceReferenceSQL makes the fence of a copy, an internal trigger.
func fenceReferenceSQL(name string) []string {
	return []string{
		"CREATE TRIGGER " + referenceTrigger + " BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON " + referenceQuoted(name) +
			" FOR EACH STATEMENT EXECUTE FUNCTION " + referenceFence,
		hideTriggerSQL(referenceQuoted(name), referenceTrigger),
	}
}

// dropCopies drops the copies of name on nodes.
func (c *Cluster) dropCopies(ctx context.Context, tenant, name string, nodes []string) error {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for _, node := range nodes {
		if _, ok := c.Node(node); !ok {
			c.log.Info("reference table: a copy left on a node no longer registered", "tenant", tenant, "table", name, "node", node)
			continue
		}
		var err error
		// A pooled control connection the node has closed (a restart) fails
		// once: try again, past every connection the pool may hold.
		for attempt := 0; attempt <= adminMaxConns; attempt++ {
			var p *pgxpool.Pool
			if p, err = c.Admin(ctx, node, tenant); err == nil {
				_, err = p.Exec(ctx, "DROP TABLE IF EXISTS "+referenceQuoted(name))
			}
			if err == nil {
				break
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", node, err))
		}
	}
	return errors.Join(errs...)
}

// referenceNames are the names of refs, as a set.
func referenceNames(refs []*shardmap.Reference) map[string]bool {
	out := map[string]bool{}
	for _, r := range refs {
		out[r.Name] = true
	}
	return out
}

// CreateReference makes tenant's ordinary table name a reference table: a
// copy of it, with its rows, on every node, each fenced, recorded on the
// catalog node and registered in store. It returns the entry and the rows
// copied to each node.
func (c *Cluster) CreateReference(ctx context.Context, store shardmap.ReferenceStore, trees shardmap.Store, tenant, name string, perNode ReferenceCheck) (*shardmap.Reference, int64, error) {
	switch _, err := trees.Tree(ctx, tenant, name); {
	case err == nil:
		return nil, 0, sqlstate.New(sqlstate.DuplicateTable, "%s is a tree, not an ordinary table", quoted(name))
	case !errors.Is(err, shardmap.ErrNotFound):
		return nil, 0, err
	}
	refs, err := store.References(ctx, tenant)
	if err != nil {
		return nil, 0, err
	}
	if referenceNames(refs)[name] {
		return nil, 0, sqlstate.New(sqlstate.DuplicateObject, "%s is a reference table already", quoted(name))
	}
	catalog := c.Catalog().Name
	if err := c.ensureReferenceMeta(ctx, catalog, tenant); err != nil {
		return nil, 0, err
	}
	src, err := c.lockReference(ctx, tenant, name)
	if err != nil {
		return nil, 0, err
	}
	defer src.close(ctx)
	if err := checkReference(src.ti, referenceNames(refs), perNode); err != nil {
		return nil, 0, err
	}
	nodes := slices.Sorted(slices.Values(c.NodeNames()))
	var built []string
	undo := func(err error) (*shardmap.Reference, int64, error) {
		if derr := c.dropCopies(ctx, tenant, name, built); derr != nil {
			c.log.Error("could not drop the copies of a reference table that failed", "table", name, "err", derr)
		}
		return nil, 0, err
	}
	var rows int64
	if err := src.tx.QueryRow(ctx, "SELECT count(*) FROM "+referenceQuoted(name)).Scan(&rows); err != nil {
		return undo(err)
	}
	for _, node := range nodes {
		if node == catalog {
			continue
		}
		built = append(built, node)
		if _, err = c.buildCopy(ctx, src, node, tenant); err != nil {
			return undo(err)
		}
	}
	for _, s := range append(fenceReferenceSQL(name), `INSERT INTO `+referenceMeta+` (name, nodes) VALUES ($1, $2)`) {
		var args []any
		if strings.HasPrefix(s, "INSERT") {
			args = []any{name, nodes}
		}
		if _, err := src.tx.Exec(ctx, s, args...); err != nil {
			return undo(fmt.Errorf("pgshard: record reference table %s on the catalog node: %w", name, err))
		}
	}
	if err := src.tx.Commit(ctx); err != nil {
		return undo(fmt.Errorf("pgshard: record reference table %s on the catalog node: %w", name, err))
	}
	ref := &shardmap.Reference{Tenant: tenant, Name: name, Nodes: nodes}
	if err := store.PutReference(ctx, ref, nil); err != nil {
		// Writes are fenced on every copy until the registry has the table:
		// take it back to an ordinary table.
		if uerr := c.unrecord(ctx, tenant, name); uerr != nil {
			return nil, 0, fmt.Errorf("pgshard: register reference table %s: %w (and undoing it failed: %v)", name, err, uerr)
		}
		return undo(fmt.Errorf("pgshard: register reference table %s: %w", name, err))
	}
	c.log.Info("reference table created", "tenant", tenant, "table", name, "nodes", nodes, "rows", rows)
	return ref, rows, nil
}

// unrecord drops the catalog copy's fence and its meta row, under the
// table lock: the catalog copy is then the ordinary table.
func (c *Cluster) unrecord(ctx context.Context, tenant, name string) error {
	ctx = context.WithoutCancel(ctx)
	p, err := c.Admin(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		if err := lockReferenceTable(ctx, tx, name); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DROP TRIGGER IF EXISTS "+referenceTrigger+" ON "+referenceQuoted(name)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM `+referenceMeta+` WHERE name = $1`, name)
		return err
	})
}

// referenceLockWait bounds a change's wait for the catalog copy's table
// lock. A transaction that holds a lock on the table (one left open after
// it wrote the table or locked rows of it) would keep the change waiting,
// and behind the change's queued lock every new write of the table, with
// the writes the proxies hold for the change until their hold ends (10 s)
// and they meet the fence after it. Past this wait, shorter than the hold
// less the settling, the change gives up: its entry is unmarked, which
// lets the held writes go to the copies that have not changed.
const referenceLockWait = 5 * time.Second

// lockReferenceTable takes the catalog copy's table lock in tx, waiting at
// most referenceLockWait, and fails with 55P03 past it.
func lockReferenceTable(ctx context.Context, tx pgx.Tx, name string) error {
	_, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", referenceLockWait.Milliseconds()))
	if err == nil {
		_, err = tx.Exec(ctx, "LOCK TABLE "+referenceQuoted(name)+" IN EXCLUSIVE MODE")
	}
	if sqlstate.Is(err, sqlstate.LockNotAvailable) {
		e := sqlstate.New(sqlstate.LockNotAvailable, "reference table %s: transactions held a lock on its catalog copy for %s; nothing was changed", quoted(name), referenceLockWait)
		e.Hint = "End the transactions that hold table " + name + " on the catalog node (pg_locks; pg_stat_activity shows those idle in a transaction) and run the statement again. A move or a node's first shard tries again by itself."
		return e
	}
	if err == nil {
		_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = 0")
	}
	return err
}

// UndistributeReference turns tenant's reference table name back into an
// ordinary table on the catalog node, as a change of its copies
// (markChanging): the proxies hold its writes while the catalog copy's
// fence and meta row go, under the table lock; then the entry lists the
// catalog node alone, so that once every proxy has acknowledged it no
// statement reads another copy; then the entry goes, which lets the held
// writes go to the catalog node; the other copies go last. Without the
// hold, a write between the entry's removal and the fence's met the fence
// (LT001) in the middle of its transaction.
func (c *Cluster) UndistributeReference(ctx context.Context, store shardmap.ReferenceStore, tenant, name string, refresh func(context.Context) error) error {
	ref, err := referenceEntry(ctx, store, tenant, name)
	if err != nil {
		return err
	}
	if ref == nil {
		return sqlstate.New(sqlstate.WrongObjectType, "%s is not a reference table", quoted(name))
	}
	if err := c.refuseTreeReferences(ctx, tenant, name); err != nil {
		return err
	}
	c.refChanges.Lock()
	defer c.refChanges.Unlock()
	marked, err := c.markChanging(ctx, store, ref)
	if err != nil {
		return err
	}
	if err := c.unrecord(ctx, tenant, name); err != nil {
		return errors.Join(fmt.Errorf("pgshard: reference table %s keeps its fence: %w", name, err), c.unmark(ctx, store, marked, ref.Nodes))
	}
	alone := *marked
	alone.Nodes = []string{c.Catalog().Name}
	alone.Dropping = leaving(ref, c.Catalog().Name)
	if err := store.PutReference(ctx, &alone, marked); err != nil {
		return fmt.Errorf("pgshard: reference table %s has no fence any more, but its registry entry was not changed; run lattice_undistribute_table again: %w", name, err)
	}
	if err := c.settleChange(ctx, &alone); err != nil {
		return fmt.Errorf("pgshard: reference table %s has no fence any more, but the proxies were not seen to read its catalog copy alone; run lattice_undistribute_table again: %w", name, err)
	}
	// The other copies go while the entry still names them, so that a
	// failed drop is tried again by the next call rather than forgotten.
	if err := c.dropCopies(ctx, tenant, name, alone.Dropping); err != nil {
		// Nothing reads or writes them any more: until that call, the
		// table's writes go on, unheld, to its catalog copy alone.
		kept := alone
		kept.ChangingSince = time.Time{}
		return errors.Join(undistributeDropError(name, err), store.PutReference(context.WithoutCancel(ctx), &kept, &alone))
	}
	if err := store.DeleteReference(ctx, &alone); err != nil {
		return fmt.Errorf("pgshard: reference table %s has no fence any more, but its registry entry was not removed; run lattice_undistribute_table again: %w", name, err)
	}
	if refresh != nil {
		if err := refresh(ctx); err != nil {
			return err
		}
	}
	c.log.Info("reference table made ordinary", "tenant", tenant, "table", name)
	return nil
}

// leaving are the nodes whose copies of ref an undistribution drops: every
// node but the catalog, with those an earlier call left to drop.
func leaving(ref *shardmap.Reference, catalog string) []string {
	out := slices.Clone(ref.Dropping)
	for _, n := range ref.Nodes {
		if n != catalog && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// undistributeDropError is the error of an undistribution whose other
// copies could not all be dropped, with the failure's SQLSTATE.
func undistributeDropError(name string, err error) error {
	e := sqlstate.New(sqlstate.As(err).Code, "reference table %s is read and written on the catalog node alone, but dropping its other copies failed: %v", quoted(name), err)
	e.Hint = "Remove what keeps the copy from being dropped on that node, then run SELECT lattice_undistribute_table(" + quoteLiteral(name) + ") again."
	return e
}

// refuseTreeReferences refuses to make reference table name ordinary while
// a tree's foreign key references it: every shard table's key references
// its own node's copy, which the other copies' drop would then fail on
// (2BP01), leaving the shards checked against copies no write reaches.
// A foreign key added between this check and the registry's change fails
// that drop the same way; checkTemplate refuses one after it.
func (c *Cluster) refuseTreeReferences(ctx context.Context, tenant, name string) error {
	p, err := c.Admin(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return err
	}
	var child, con string
	err = p.QueryRow(ctx, `SELECT c.conrelid::regclass::text, c.conname FROM pg_catalog.pg_constraint c
WHERE c.contype = 'f' AND c.confrelid = $1::regclass AND c.conrelid <> c.confrelid
  AND EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t WHERE t.tgrelid = c.conrelid AND t.tgname = $2)
ORDER BY 1, 2 LIMIT 1`, referenceQuoted(name), fenceTrigger).Scan(&child, &con)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("pgshard: foreign keys to %s: %w", name, err)
	}
	e := sqlstate.New(sqlstate.FeatureNotSupported, "reference table %s is referenced by foreign key %s of tree %s", quoted(name), quoted(con), child)
	e.Detail = "Every shard of the tree checks its rows against its node's copy."
	e.Hint = "Drop the foreign key through the proxy first: ALTER TABLE " + child + " DROP CONSTRAINT " + quoteIdent(con) + "."
	return e
}

// CopyReferences gives node a copy of each of tenant's reference tables it
// lacks, before the node serves the tenant (a shard is created there).
// The entry is marked changing first, so that the proxies hold the table's
// writes (markChanging). Each copy is taken under the catalog copy's table
// lock, which holds every write back; the node joins the table's list on
// the catalog node in the same transaction, and in store after it: until
// then the fence refuses the writes of proxies that know the old list
// (LT001), so no write misses the new copy.
func (c *Cluster) CopyReferences(ctx context.Context, store shardmap.ReferenceStore, tenant, node string) error {
	return c.changeReferences(ctx, store, tenant,
		func(ref *shardmap.Reference) bool { return !ref.Holds(node) },
		func(ctx context.Context, ref *shardmap.Reference) error {
			return c.copyReference(ctx, store, ref, node)
		})
}

// changeAttempts bounds the tries of one table's change that keeps meeting
// other writes of its entry.
const changeAttempts = 5

// changeReferences runs change on each of tenant's reference tables that
// need it, one change at a time in this process: the migrations that
// place a node's first shards of several trees at once all give it the
// same copies, and each would otherwise mark the entries the others
// marked. A change that meets another's write of the entry (another
// proxy's, shardmap.ErrConflict) reads the entry again and goes on from
// there.
func (c *Cluster) changeReferences(ctx context.Context, store shardmap.ReferenceStore, tenant string,
	need func(*shardmap.Reference) bool, change func(context.Context, *shardmap.Reference) error) error {
	c.refChanges.Lock()
	defer c.refChanges.Unlock()
	refs, err := store.References(ctx, tenant)
	if err != nil {
		return err
	}
	for _, ref := range refs {
		for attempt := 1; ref != nil && need(ref); attempt++ {
			err := change(ctx, ref)
			if err == nil {
				break
			}
			if !errors.Is(err, shardmap.ErrConflict) || attempt == changeAttempts {
				return err
			}
			if ref, err = referenceEntry(ctx, store, tenant, ref.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// referenceEntry reads the entry of tenant's reference table name, nil
// when there is none any more.
func referenceEntry(ctx context.Context, store shardmap.ReferenceStore, tenant, name string) (*shardmap.Reference, error) {
	refs, err := store.References(ctx, tenant)
	if err != nil {
		return nil, err
	}
	for _, r := range refs {
		if r.Name == name {
			return r, nil
		}
	}
	return nil, nil
}

func (c *Cluster) copyReference(ctx context.Context, store shardmap.ReferenceStore, ref *shardmap.Reference, node string) (err error) {
	marked, err := c.markChanging(ctx, store, ref)
	if err != nil {
		return err
	}
	recorded := false
	defer func() {
		if err != nil && !recorded {
			err = errors.Join(err, c.unmark(ctx, store, marked, ref.Nodes))
		}
	}()
	src, err := c.lockReference(ctx, ref.Tenant, ref.Name)
	if err != nil {
		return err
	}
	defer src.close(ctx)
	var have []string
	if err := src.tx.QueryRow(ctx, `SELECT nodes FROM `+referenceMeta+` WHERE name = $1 FOR UPDATE`, ref.Name).Scan(&have); err != nil {
		return fmt.Errorf("pgshard: read the copies of reference table %s: %w", ref.Name, err)
	}
	// The catalog node's list is the one the fences check.
	nodes := slices.Sorted(slices.Values(have))
	if !slices.Contains(have, node) {
		nodes = slices.Sorted(slices.Values(append(have, node)))
		// A copy left by an attempt that failed before it was recorded is
		// not known to be complete: build it again.
		if err := c.dropCopies(ctx, ref.Tenant, ref.Name, []string{node}); err != nil {
			return err
		}
		n, err := c.buildCopy(ctx, src, node, ref.Tenant)
		if err != nil {
			_ = c.dropCopies(ctx, ref.Tenant, ref.Name, []string{node})
			return err
		}
		if _, err := src.tx.Exec(ctx, `UPDATE `+referenceMeta+` SET nodes = $2 WHERE name = $1`, ref.Name, nodes); err != nil {
			return err
		}
		if err := src.tx.Commit(ctx); err != nil {
			return err
		}
		c.log.Info("reference table copied to a node", "tenant", ref.Tenant, "table", ref.Name, "node", node, "rows", n)
	}
	recorded = true
	grown := *marked
	grown.Nodes, grown.ChangingSince = nodes, time.Time{}
	if err := store.PutReference(ctx, &grown, marked); err != nil {
		return fmt.Errorf("pgshard: node %s has its copy of reference table %s, but the registry was not updated (writes are refused until it is): %w", node, ref.Name, err)
	}
	return nil
}

type referenceStore struct {
	shardmap.ReferenceStore
	settle ReferenceSettler
}

// ReferenceSettler waits until every proxy has acknowledged ref's entry
// and no write planned on an older entry runs (migrator.Runner's
// SettleReference).
type ReferenceSettler func(ctx context.Context, ref *shardmap.Reference) error

// SetReferences makes CreateShard give a node its copies of the tenant's
// reference tables before the node's first shard of a tree, so that a
// join of the tree with a reference table finds the copy there. settle
// (nil: none) is what a change of a table's copies waits for after marking
// them changing (markChanging).
func (c *Cluster) SetReferences(store shardmap.ReferenceStore, settle ReferenceSettler) {
	c.refs.Store(&referenceStore{store, settle})
}

// settleBudget bounds the wait for the proxies' acknowledgement of a
// changing entry, well within the proxies' hold of the table's writes. A
// statement planned before the mark that waits for a row lock of a
// transaction whose write is held keeps the acknowledgement back until
// then.
const settleBudget = 2 * time.Second

// markChanging writes ref's entry as Changing and waits until every proxy
// holds the table's new writes (docs/DESIGN.md 4.3): the copies are then
// changed with no write in flight that carries the old list, which the
// fence would refuse with LT001 in the middle of its transaction. It
// returns the entry as stored now. A proxy that does not acknowledge
// within settleBudget is not waited for longer: the fence keeps its writes
// from a wrong set of copies, at worst with that LT001.
func (c *Cluster) markChanging(ctx context.Context, store shardmap.ReferenceStore, ref *shardmap.Reference) (*shardmap.Reference, error) {
	rs := c.refs.Load()
	if rs == nil || rs.settle == nil {
		return ref, nil
	}
	marked := *ref
	marked.ChangingSince = time.Now().UTC()
	if err := store.PutReference(ctx, &marked, ref); err != nil {
		return nil, err
	}
	if err := c.settleChange(ctx, &marked); err != nil {
		return nil, errors.Join(err, c.unmark(ctx, store, &marked, ref.Nodes))
	}
	return &marked, nil
}

// settleChange waits, at most settleBudget, until every proxy has
// acknowledged ref's entry. It fails only when ctx ends or the wait
// cannot be made; past the budget it logs and lets the change go on.
func (c *Cluster) settleChange(ctx context.Context, ref *shardmap.Reference) error {
	rs := c.refs.Load()
	if rs == nil || rs.settle == nil {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, settleBudget)
	defer cancel()
	err := rs.settle(sctx, ref)
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		c.log.Warn("reference table: not every proxy acknowledged that its copies are changing; going on", "tenant", ref.Tenant, "table", ref.Name, "err", err)
		return nil
	}
	return err
}

// unmark puts back the entry of a change that did not happen, with nodes.
func (c *Cluster) unmark(ctx context.Context, store shardmap.ReferenceStore, marked *shardmap.Reference, nodes []string) error {
	if marked.ChangingSince.IsZero() {
		return nil
	}
	back := *marked
	back.ChangingSince, back.Nodes = time.Time{}, nodes
	return store.PutReference(context.WithoutCancel(ctx), &back, marked)
}

func (c *Cluster) referencesFor(ctx context.Context, node, tenant string) error {
	rs := c.refs.Load()
	if rs == nil {
		return nil
	}
	if err := c.CopyReferences(ctx, rs.ReferenceStore, tenant, node); err != nil {
		return fmt.Errorf("pgshard: give node %s the reference tables of %s before a shard: %w", node, tenant, err)
	}
	return nil
}

// ReleaseReferences takes node out of every reference table of tenant
// before the node is removed (it holds no shard, so no statement needs its
// copies). For each table, under the catalog copy's table lock (which waits
// for the writers in flight and holds new ones back), node leaves the
// table's list on the catalog node, then the registry entry; between the
// two the fence refuses the writes of proxies that know the old list
// (LT001), so none is acknowledged after writing only some copies. The
// copy itself is dropped last, and only logged when the node does not
// answer: nothing reads or writes it any more.
func (c *Cluster) ReleaseReferences(ctx context.Context, store shardmap.ReferenceStore, tenant, node string) error {
	if node == c.Catalog().Name {
		return sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "node %s is the catalog node and keeps every reference table", node)
	}
	return c.changeReferences(ctx, store, tenant,
		func(ref *shardmap.Reference) bool { return ref.Holds(node) || slices.Contains(ref.Dropping, node) },
		func(ctx context.Context, ref *shardmap.Reference) error {
			if !ref.Holds(node) {
				return c.forgetDropping(ctx, store, ref, node)
			}
			if err := c.releaseReference(ctx, store, ref, node); err != nil {
				return fmt.Errorf("pgshard: take node %s out of reference table %s of %s: %w", node, ref.Name, tenant, err)
			}
			return nil
		})
}

// forgetDropping drops the copy of ref on node, which an undistribution
// that failed there left to drop, before the node is removed, and takes
// the node out of the entry's dropping list: once it is removed, no later
// undistribution can reach it. A copy that cannot be dropped is logged, to
// be dropped by hand.
func (c *Cluster) forgetDropping(ctx context.Context, store shardmap.ReferenceStore, ref *shardmap.Reference, node string) error {
	if err := c.dropCopies(ctx, ref.Tenant, ref.Name, []string{node}); err != nil {
		c.log.Warn("a copy of a table that is no longer a reference table stays on a node being removed; drop it there by hand",
			"tenant", ref.Tenant, "table", ref.Name, "node", node, "err", err)
	}
	kept := *ref
	kept.Dropping = slices.DeleteFunc(slices.Clone(ref.Dropping), func(n string) bool { return n == node })
	return store.PutReference(ctx, &kept, ref)
}

func (c *Cluster) releaseReference(ctx context.Context, store shardmap.ReferenceStore, ref *shardmap.Reference, node string) error {
	p, err := c.Admin(ctx, c.Catalog().Name, ref.Tenant)
	if err != nil {
		return err
	}
	marked, err := c.markChanging(ctx, store, ref)
	if err != nil {
		return err
	}
	var nodes []string
	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		// The table lock first, in the order a writer takes them.
		if err := lockReferenceTable(ctx, tx, ref.Name); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `UPDATE `+referenceMeta+` SET nodes = array_remove(nodes, $2) WHERE name = $1 RETURNING nodes`, ref.Name, node).Scan(&nodes)
	})
	if err != nil {
		return errors.Join(err, c.unmark(ctx, store, marked, ref.Nodes))
	}
	shrunk := *marked
	shrunk.Nodes, shrunk.ChangingSince = slices.Sorted(slices.Values(nodes)), time.Time{}
	if err := store.PutReference(ctx, &shrunk, marked); err != nil {
		return fmt.Errorf("the catalog node no longer lists node %s, but the registry was not updated (writes are refused until it is): %w", node, err)
	}
	if err := c.dropCopies(ctx, ref.Tenant, ref.Name, []string{node}); err != nil {
		c.log.Warn("could not drop a released copy of a reference table", "tenant", ref.Tenant, "table", ref.Name, "node", node, "err", err)
	}
	c.log.Info("reference table released from a node", "tenant", ref.Tenant, "table", ref.Name, "node", node, "nodes", shrunk.Nodes)
	return nil
}
