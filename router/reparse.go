package router

import pg "github.com/pganalyze/pg_query_go/v6"

// reparsed reports whether statement n's result columns are those of
// session state at the moment it is parsed: FETCH reads a cursor's,
// EXECUTE a SQL-level prepared statement's. A backend statement of either
// is only right for the cursor or statement it was parsed under, so the
// proxy parses it anew at each use rather than keeping one per backend for
// everyone (Plan.Reparse). Describing a kept FETCH statement once its
// cursor is gone is worse than stale: PostgreSQL 15 dies of a segfault in
// FetchStatementTargetList.
func reparsed(n *pg.Node) bool {
	switch s := n.Node.(type) {
	case *pg.Node_FetchStmt:
		return !s.FetchStmt.Ismove
	case *pg.Node_ExecuteStmt:
		return true
	}
	return false
}
