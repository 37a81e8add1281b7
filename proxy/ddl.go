package proxy

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// ddlTree finds the tree a DDL plan changes. A DROP INDEX or ALTER INDEX
// plan names no tree: the catalog node says which table each index belongs
// to, and nil (without error) means none is a tree's, so the statement runs
// on the catalog node like any other, or, when the indexes are reference
// tables' (refs), on every copy. ALTER INDEX, or DROP INDEX of several
// indexes, on a tree's index is refused, as is a statement on the index of
// a reference table and that of an ordinary table at once.
func (s *session) ddlTree(ctx context.Context, v *shardmap.View, p *router.Plan) (_ *shardmap.Tree, refs []string, _ error) {
	if p.Tree != nil {
		return p.Tree, nil, nil
	}
	if s.srv.cfg.IndexTable == nil {
		return nil, nil, nil
	}
	ordinary := ""
	for _, ix := range p.DDL.Indexes {
		table, err := s.srv.cfg.IndexTable(ctx, s.tenant, ix)
		if err != nil {
			return nil, nil, sqlstate.New(sqlstate.SystemError, "cannot find the table of index %q: %v", ix, err)
		}
		t := v.Trees[table]
		switch {
		case t == nil && v.Reference(table) != nil:
			if !slices.Contains(refs, table) {
				refs = append(refs, table)
			}
			continue
		case t == nil:
			if table != "" && ordinary == "" {
				ordinary = table
			}
			continue
		case p.DDL.Op == router.DDLIndexCheck && p.Tag == "DROP INDEX":
			e := sqlstate.New(sqlstate.FeatureNotSupported, "DROP INDEX of index %q of tree %q together with other indexes is not supported", ix, t.Name)
			e.Hint = "Drop the tree's index in a statement of its own."
			return nil, nil, e
		case p.DDL.Op == router.DDLIndexCheck && p.Tag == "REINDEX":
			e := sqlstate.New(sqlstate.FeatureNotSupported, "REINDEX INDEX on index %q of tree %q is not supported", ix, t.Name)
			e.Hint = "Reindex the tree's table: REINDEX TABLE " + t.Name + " rebuilds its indexes on every shard."
			return nil, nil, e
		case p.DDL.Op == router.DDLIndexCheck:
			e := sqlstate.New(sqlstate.FeatureNotSupported, "%s on index %q of tree %q is not supported", p.Tag, ix, t.Name)
			e.Hint = "Drop the index and create it again with the new name or settings."
			return nil, nil, e
		}
		return t, nil, nil
	}
	switch {
	case len(refs) == 0:
	case ordinary != "":
		e := sqlstate.New(sqlstate.FeatureNotSupported, "%s on indexes of reference table %q and of table %q at once is not supported", p.Tag, refs[0], ordinary)
		e.Hint = "Change the reference table's index in a statement of its own: it runs on every node, the other table is only on the catalog node."
		return nil, nil, e
	case p.DDL.Concurrently:
		e := sqlstate.New(sqlstate.FeatureNotSupported, "%s CONCURRENTLY on an index of reference table %q is not supported", p.Tag, refs[0])
		e.Hint = "Drop the index without CONCURRENTLY: a reference table is small, and its DDL runs on every node in one transaction."
		return nil, nil, e
	}
	return nil, refs, nil
}

// runDDL runs DDL on tree t: the template and every shard change together
// (pgshard.Cluster.RunTreeDDL), and the proxy's map cache is refreshed so
// that this session's next statement sees the new columns or the dropped
// tree. It answers with the command tag.
func (s *session) runDDL(ctx context.Context, t *shardmap.Tree, p *router.Plan) {
	if s.tx.active || len(s.tx.conns) > 0 {
		// The DDL runs on every node in transactions of its own: inside the
		// client's transaction block it could not be rolled back with it.
		e := sqlstate.New(sqlstate.ActiveSQLTransaction, "%s on tree %q cannot run inside a transaction block", p.Tag, t.Name)
		e.Hint = "Run DDL on a tree outside BEGIN ... COMMIT; it is atomic on its own."
		s.fail(e)
		return
	}
	if len(s.backends()) > 0 {
		// Earlier statements of this batch hold an implicit transaction on
		// a backend: the DDL would run before them, or wait for their locks
		// while they wait for the batch to end.
		e := sqlstate.New(sqlstate.FeatureNotSupported, "%s on tree %q must be sent in a batch of its own", p.Tag, t.Name)
		e.Hint = "Send Sync before the DDL statement (most drivers do this for each statement outside a pipeline)."
		s.fail(e)
		return
	}
	if s.srv.cfg.TreeDDL == nil {
		s.fail(sqlstate.New(sqlstate.FeatureNotSupported, "%s on tree %q is not supported by this proxy", p.Tag, t.Name))
		return
	}
	if err := s.holdForDDL(ctx); err != nil {
		s.fail(err)
		return
	}
	d := pgshard.TreeDDL{
		Tenant:       s.tenant,
		Tree:         t.Name,
		Op:           ddlOps[p.DDL.Op],
		Concurrently: p.DDL.Concurrently,
		Statement:    p.RenderDDL,
		Log:          p.DDL.Log(),
		Cascade:      p.DDL.Cascade,
	}
	var notices relayedNotices
	if d.Op == pgshard.DDLMaintain {
		d.OnNotice = notices.add
	}
	err := s.srv.cfg.TreeDDL(ctx, d)
	if len(notices.msgs) > 0 {
		s.x.synthetic(notices.msgs...)
	}
	if d.Op != pgshard.DDLMaintain {
		// Statements parsed from now on get backend statements of their
		// own, with the tree's new columns (even if the DDL failed
		// part-way).
		pgshard.ResultsChanged()
		if _, rerr := s.srv.cache.Refresh(ctx, s.tenant); rerr != nil {
			s.log.Warn("map refresh after tree DDL failed", "err", rerr)
		}
	}
	if err != nil {
		s.fail(err)
		return
	}
	s.x.synthetic(commandComplete(p.Tag))
}

// holdForDDL takes a view for a tree's DDL until the next release point:
// the empty-tree re-pin, which waits for the acknowledgements of its frozen
// map, then waits for the DDL to end and log itself (migrator tryRepin). The
// view taken at Bind does not cover it when a Flush came in between and
// gave it back. A view the session already holds whole is not held twice.
func (s *session) holdForDDL(ctx context.Context) error {
	if s.srv.cfg.Registration == nil {
		return nil
	}
	_, err := s.acquireView(ctx)
	return err
}

var ddlOps = map[router.DDLOp]pgshard.DDLOp{
	router.DDLAlter:       pgshard.DDLAlter,
	router.DDLCreateIndex: pgshard.DDLCreateIndex,
	router.DDLDropIndex:   pgshard.DDLDropIndex,
	router.DDLTruncate:    pgshard.DDLTruncate,
	router.DDLDropTable:   pgshard.DDLDropTable,
	router.DDLMaintain:    pgshard.DDLMaintain,
}

// bindDDL binds a DDL plan: a tree's DDL runs at Execute; the DROP INDEX of
// a reference table's index runs on every copy, of another table's index
// on the catalog node.
func (s *session) bindDDL(ctx context.Context, v *shardmap.View, portal *clientPortal, m *pgproto3.Bind) bool {
	p := portal.stmt.plan
	t, refs, err := s.ddlTree(ctx, v, p)
	if err != nil {
		s.fail(err)
		return false
	}
	if len(refs) > 0 {
		rp := *p
		rp.Kind, rp.References, rp.DDL = router.RefWrite, refs, nil
		return s.bindRefWrite(ctx, v, &rp, portal, m)
	}
	if t == nil {
		return s.bindOn(ctx, portal, s.catalogTarget(p), p.SQL, m, m.DestinationPortal, false)
	}
	portal.run = func(ctx context.Context) { s.runDDL(ctx, t, p) }
	s.bindComplete()
	return true
}
