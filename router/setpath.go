package router

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/sqlstate"
)

// PathConfigPrefix starts Plan.SetPath: the statement by which the
// proxy replays a session's set_config of search_path.
const PathConfigPrefix = "SELECT pg_catalog.set_config('search_path', "

// pathConfig is the one set_config of search_path the proxy follows, as
// it follows SET search_path: a statement that is nothing but SELECT
// [pg_catalog.]set_config('search_path', 'literal', false), as pg_dump's
// prologue is. The session then records the setting, and the check of
// bare names under it runs (proxy/shadow.go). It returns the call and the
// statement that replays it, or nil.
func pathConfig(n *pg.Node) (*pg.FuncCall, string) {
	sel := n.GetSelectStmt()
	if sel == nil || len(sel.TargetList) != 1 || sel.FromClause != nil || sel.WhereClause != nil ||
		sel.GroupClause != nil || sel.HavingClause != nil || sel.WindowClause != nil || sel.ValuesLists != nil ||
		sel.SortClause != nil || sel.LimitCount != nil || sel.LimitOffset != nil || sel.LockingClause != nil ||
		sel.WithClause != nil || sel.DistinctClause != nil || sel.IntoClause != nil || sel.Op != pg.SetOperation_SETOP_NONE {
		return nil, ""
	}
	f := sel.TargetList[0].GetResTarget().GetVal().GetFuncCall()
	if f == nil || !isSetConfig(f) || len(f.Funcname) == 2 && f.Funcname[0].GetString_().GetSval() != "pg_catalog" ||
		f.AggFilter != nil || f.Over != nil || f.AggDistinct || f.AggStar || f.FuncVariadic || f.AggOrder != nil {
		return nil, ""
	}
	name, _ := bareConstant(f.Args[0])
	value, ok := bareConstant(f.Args[1])
	local, _ := bareConstant(f.Args[2])
	if name.kind != litString || !strings.EqualFold(name.text, "search_path") || !ok || value.kind != litString ||
		local.kind != litBool || local.text != "false" {
		return nil, ""
	}
	return f, PathConfigPrefix + quoteLiteral(value.text) + ", false)"
}

// isSetConfig reports a call of set_config(name, value, is_local), bare
// or pg_catalog-qualified.
func isSetConfig(f *pg.FuncCall) bool {
	return len(f.Funcname) > 0 && len(f.Funcname) <= 2 && len(f.Args) == 3 &&
		strings.EqualFold(f.Funcname[len(f.Funcname)-1].GetString_().GetSval(), "set_config")
}

// pathConfigRefused is the error for any other set_config of search_path:
// inside a larger statement, with a value or is_local that is not a
// literal, or transaction-local, the proxy cannot tell what the session's
// search_path becomes, nor check bare names under it.
func pathConfigRefused() *sqlstate.Error {
	return refused("Use SET search_path = ... (or SET LOCAL search_path = ... inside a transaction), or SELECT set_config('search_path', 'literal', false) as a statement of its own.",
		"set_config of search_path is supported through the Lattice proxy only as SELECT set_config('search_path', 'literal', false) on its own")
}
