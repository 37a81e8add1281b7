package router

import (
	pg "github.com/pganalyze/pg_query_go/v6"
)

// ReferenceLister is implemented by a Trees that can name every reference
// table of the tenant (colocate.go's References answers for one name).
type ReferenceLister interface {
	ReferenceNames() []string
}

// grantAllInSchema plans GRANT or REVOKE ... ON ALL TABLES IN SCHEMA
// public when the tenant has reference tables. PostgreSQL expands the
// schema on the node it runs on, so on the catalog node alone it would
// change the catalog copies and leave the others as they were. It runs
// unchanged as a write of every reference table instead, on every node
// holding copies: the other nodes' public schema holds only the copies,
// so each node changes what PostgreSQL would (the catalog node its
// ordinary tables and templates too). It reports false when the
// statement is to be planned as usual.
func (p *planner) grantAllInSchema(pl *Plan, s *pg.GrantStmt, start, end int) bool {
	if s.Targtype != pg.GrantTargetType_ACL_TARGET_ALL_IN_SCHEMA || s.Objtype != pg.ObjectType_OBJECT_TABLE {
		return false
	}
	l, ok := p.trees.(ReferenceLister)
	if !ok {
		return false
	}
	public := false
	for _, o := range s.Objects {
		public = public || o.GetString_().GetSval() == "public"
	}
	refs := l.ReferenceNames()
	switch {
	case !public || len(refs) == 0:
		return false
	case len(s.Objects) > 1:
		return p.refuse(pl, refused("Name the schema public in a statement of its own: its reference tables have a copy on every node, the other schemas only the catalog node's tables.",
			"%s on all tables in schema public and other schemas is not supported", stmtName(&pg.Node{Node: &pg.Node_GrantStmt{GrantStmt: s}})))
	}
	p.apply(pl, route{kind: RefWrite, refs: refs}, start, end)
	return true
}
