package router

import (
	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/sqlstate"
)

// A temporary relation named like a tree or reference table would hide it
// in the session that made it: PostgreSQL looks a bare name up in the
// session's temporary schema first (unless the search_path names pg_temp
// later), while the router always takes the name to be the table in
// public. DELETE FROM orders meant for a scratch table would delete the
// tree's rows. So no statement through the proxy may make one.

// madeTemp is the relation a statement makes, or renames, when it is or
// may be temporary.
type madeTemp struct {
	name  string       // its name once made
	kind  string       // "table", "view", "sequence", or "relation" for a rename
	maybe bool         // temporary only if it reads (a view) or is (a rename) a temporary relation
	from  *pg.RangeVar // a rename: the relation renamed
}

// tempMade finds the relation n makes, or gives a new name, that is
// temporary (TEMP, or in pg_temp or pg_temp_N) or, named without a schema,
// may be: a view over a temporary relation is made temporary, and a
// renamed relation may be one. ok is false when there is none.
func tempMade(n *pg.Node) (m madeTemp, ok bool) {
	switch s := n.Node.(type) {
	case *pg.Node_CreateStmt:
		return madeTemp{name: s.CreateStmt.Relation.GetRelname(), kind: "table"}, tempRel(s.CreateStmt.Relation)
	case *pg.Node_CreateTableAsStmt:
		rel := s.CreateTableAsStmt.Into.GetRel()
		return madeTemp{name: rel.GetRelname(), kind: "table"}, tempRel(rel)
	case *pg.Node_SelectStmt:
		rel := s.SelectStmt.IntoClause.GetRel()
		return madeTemp{name: rel.GetRelname(), kind: "table"}, tempRel(rel)
	case *pg.Node_CreateSeqStmt:
		return madeTemp{name: s.CreateSeqStmt.Sequence.GetRelname(), kind: "sequence"}, tempRel(s.CreateSeqStmt.Sequence)
	case *pg.Node_ViewStmt:
		v := s.ViewStmt.View
		return madeTemp{name: v.GetRelname(), kind: "view", maybe: !tempRel(v)}, tempRel(v) || v.GetSchemaname() == ""
	case *pg.Node_RenameStmt:
		r := s.RenameStmt
		switch r.RenameType {
		case pg.ObjectType_OBJECT_TABLE, pg.ObjectType_OBJECT_VIEW, pg.ObjectType_OBJECT_SEQUENCE:
			m := madeTemp{name: r.Newname, kind: "relation", maybe: !tempRel(r.Relation), from: r.Relation}
			return m, tempRel(r.Relation) || r.Relation.GetSchemaname() == ""
		}
	}
	return madeTemp{}, false
}

// tempShadow refuses a statement (or the statement EXPLAIN ANALYZE runs)
// that makes, or may make, a temporary relation named like a tree or
// reference table.
func (p *planner) tempShadow(n *pg.Node) *sqlstate.Error {
	if e := n.GetExplainStmt(); e != nil {
		n = e.Query
	}
	m, ok := tempMade(n)
	if !ok || m.from != nil && p.distributed(m.from) != "" {
		// Renaming a tree or reference table itself is planned as such.
		return nil
	}
	what := p.distributed(&pg.RangeVar{Relname: m.name})
	if what == "" {
		return nil
	}
	var e *sqlstate.Error
	if m.maybe {
		subject, renamed := m.kind+" "+qn(m.name), ""
		if m.from != nil {
			subject, renamed = m.kind+" "+qn(m.from.Relname), " renamed to "+qn(m.name)
		}
		e = refused("Use another name; to give it to a relation of another schema, qualify that relation with its schema.",
			"%s, named without a schema, may be temporary, and%s would then hide %s %s: not supported through the Lattice proxy", subject, renamed, what, qn(m.name))
	} else {
		e = refused("Use another name for the temporary "+m.kind+".",
			"temporary %s %s would hide %s %s: not supported through the Lattice proxy", m.kind, qn(m.name), what, qn(m.name))
	}
	e.Detail = "PostgreSQL looks a bare name up in the session's temporary schema first, so " + qn(m.name) +
		" would mean the temporary " + m.kind + " there, while the proxy always takes it to be public." + qn(m.name) + "."
	return e
}

// distributed says what rv names: "tree", "reference table", or "".
func (p *planner) distributed(rv *pg.RangeVar) string {
	if t, _ := p.lookup(rv); t != nil {
		return "tree"
	}
	if p.isReference(rv) {
		return "reference table"
	}
	return ""
}
