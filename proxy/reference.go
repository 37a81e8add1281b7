package proxy

import (
	"context"
	"errors"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Reference tables on the request path (docs/DESIGN.md, "Reference
// tables"). A read of reference tables alone runs on one copy: the node of
// the session's transaction when it holds the copies, else the catalog
// node. A write (router.RefWrite) runs on every copy inside one
// transaction across nodes, which the session's commit finishes by two-phase
// commit; each copy's part first names the copies it writes
// (pgshard.ReferenceNodesSQL) for the fence to check. The client sees the
// catalog node's answer; the other copies' rows and tags are swallowed.
// The catalog copy runs first, to its end (runRefWrite).

// Reference lets the router plan joins of trees with reference tables.
func (t viewTrees) Reference(name string) bool { return t.v.References[name] != nil }

// ReferenceNames lets the router send a statement that names no table but
// changes every table of public (GRANT ... ON ALL TABLES IN SCHEMA) to
// every copy.
func (t viewTrees) ReferenceNames() []string {
	return slices.Sorted(maps.Keys(t.v.References))
}

// referenceRead is the node a Catalog plan runs on: catalogTarget's,
// unless that node lacks a copy of a reference table the plan reads.
func (s *session) referenceRead(v *shardmap.View, p *router.Plan) string {
	node := s.catalogTarget(p)
	for _, name := range p.References {
		if r := v.Reference(name); r == nil || !r.Holds(node) {
			return s.srv.catalogNode
		}
	}
	return node
}

// bindRefWrite binds p, a write of reference tables, on every node that holds
// them, in the session's transaction (an implicit one outside a block, even
// on one node: the fence reads a SET LOCAL).
func (s *session) bindRefWrite(ctx context.Context, v *shardmap.View, p *router.Plan, portal *clientPortal, m *pgproto3.Bind) bool {
	s.noteRefLock(p)
	if p.Copy != nil {
		portal.run = func(ctx context.Context) { s.runRefCopy(ctx, portal) }
		s.bindComplete()
		return true
	}
	r, err := router.Resolve(v, p, nil)
	if err != nil {
		s.fail(err)
		return false
	}
	targets := s.catalogFirst(r.Targets)
	set := pgshard.ReferenceNodesSQL(r.Nodes())
	s.spanNodes(max(2, len(targets)))
	for i, t := range targets {
		be, err := s.backend(ctx, t.Node)
		if err != nil {
			s.fail(unreachableCopy(p.References[0], t.Node, err))
			return false
		}
		s.hiddenSQL(be, set)
		part := &clientPortal{stmt: &clientStmt{sql: t.SQL, oids: portal.stmt.oids, epoch: portal.stmt.epoch}}
		if !s.bindOn(ctx, part, t.Node, t.SQL, m, partPortal(m.DestinationPortal, i), i > 0) {
			return false
		}
		portal.parts = append(portal.parts, part.parts...)
	}
	portal.run = func(ctx context.Context) { s.runRefWrite(portal) }
	return true
}

// runRefWrite runs the catalog node's copy to its end first, its answer
// going to the client, and then the other copies, whose answers are
// swallowed. The catalog copy's row locks so order the writers of a
// reference table: two of them cannot each hold a row on one copy and wait
// for the other's on another, a deadlock no node would see.
func (s *session) runRefWrite(portal *clientPortal) {
	exec := func(part portalPart, hide bool) {
		if s.simple {
			part.be.Send(&pgproto3.Query{String: part.sql})
			s.x.add(step{kind: stepQuery, be: part.be, hide: hide})
			return
		}
		part.be.Send(&pgproto3.Execute{Portal: part.name})
		s.x.add(step{kind: stepExecute, be: part.be, hide: hide})
	}
	exec(portal.parts[0], false)
	if !s.playNow() {
		return
	}
	for _, part := range portal.parts[1:] {
		exec(part, true)
	}
}

// playNow sends what the round holds so far and plays its answers, as a
// client's Flush would. It reports false when that failed: the
// transaction is then rolled back, and nothing more runs.
func (s *session) playNow() bool {
	if !s.simple {
		return s.flushBatch() == nil && !s.x.errored
	}
	s.sendBackends()
	err := s.play(&s.x)
	s.x.steps = s.x.steps[:0]
	if err != nil {
		s.x.errored = true
	}
	return !s.x.errored
}

// unreachableCopy explains a write of a reference table that cannot reach
// one of its copies: it is refused whole rather than leave that copy behind.
func unreachableCopy(table, node string, err error) error {
	var se *sqlstate.Error
	if errors.As(err, &se) && se.Code != sqlstate.ConnectionFailure && se.Code != sqlstate.SQLClientUnableToEstablishSQLConnection {
		return err
	}
	e := sqlstate.New(sqlstate.ConnectionFailure, "cannot write reference table %q: node %s, which holds a copy, is out of reach: %v", table, node, err)
	e.Hint = "A write of a reference table goes to every copy or to none; retry when the node is back, or remove the node (lattice_remove_node)."
	return e
}
