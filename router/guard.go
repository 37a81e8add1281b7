package router

import (
	"slices"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lattice-db/lattice/sqlstate"
)

// presencePrefix starts the application_name of the proxies' presence
// sessions on the nodes (pgshard.PresenceName): a client session named so
// would be taken for a proxy cut off from Redis, and every freeze would
// wait for it.
const presencePrefix = "lattice proxy"

// guardSetting refuses a setting no client may make through the proxy:
// lattice.* (lattice.migrator switches the slot fence off for the
// backend), session_replication_role (replica mode skips the fence
// triggers), and an application_name that poses as a proxy's presence.
func guardSetting(name, value string) *sqlstate.Error {
	lname := strings.ToLower(name)
	switch {
	case strings.HasPrefix(lname, "lattice."):
		return &sqlstate.Error{Code: sqlstate.InsufficientPrivilege,
			Message: "setting " + qn(name) + " is reserved for Lattice's own sessions",
			Hint:    "Remove the setting: lattice.* settings belong to the migrator and the proxy, which set them on their own connections."}
	case lname == "session_replication_role":
		return &sqlstate.Error{Code: sqlstate.InsufficientPrivilege,
			Message: "setting session_replication_role is not allowed through the Lattice proxy: it would switch off the triggers that fence moving slots",
			Hint:    "Leave session_replication_role at origin; to load data without triggers, connect to the node directly as its owner."}
	case lname == "application_name" && strings.HasPrefix(strings.ToLower(strings.TrimSpace(value)), presencePrefix):
		return &sqlstate.Error{Code: sqlstate.InsufficientPrivilege,
			Message: "application_name may not start with " + quoteLiteral(presencePrefix) + ": the prefix marks the proxies' presence sessions",
			Hint:    "Choose another application_name."}
	}
	return nil
}

// guardSetConfig refuses a statement that makes a refused setting in a way
// SET's planning does not see: set_config(...) anywhere in it (whatever
// its is_local), or a SET clause of CREATE / ALTER FUNCTION. A set_config
// whose name is not a constant could be any setting, so it is refused too,
// but for the one form whose name is a constant all the same (settingRow):
// those calls are returned, for the statement to name their setting.
// A set_config of search_path other than path (pathConfig) is refused.
// Settings a function body makes at run time are out of the proxy's sight.
func guardSetConfig(n *pg.Node, path *pg.FuncCall) (map[*pg.FuncCall]string, *sqlstate.Error) {
	var err *sqlstate.Error
	named := map[*pg.FuncCall]string{} // set_config calls whose name settingRow fixed
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if err != nil {
			return
		}
		switch x := m.Interface().(type) {
		case *pg.SelectStmt:
			settingRow(x, named)
		case *pg.FuncCall:
			if len(x.Funcname) > 0 && strings.EqualFold(x.Funcname[len(x.Funcname)-1].GetString_().GetSval(), "set_config") && len(x.Args) == 3 {
				name, ok := bareConstant(x.Args[0])
				if fixed, found := named[x]; found {
					name, ok = constant{kind: litString, text: fixed}, true
				}
				if !ok || name.kind != litString {
					err = &sqlstate.Error{Code: sqlstate.CantChangeRuntimeParam,
						Message: "set_config with a setting name that is not a string constant is not supported through the Lattice proxy",
						Hint:    "Name the setting with a string literal, as in set_config('work_mem', $1, false), or use SET."}
					return
				}
				if x != path && strings.EqualFold(name.text, "search_path") {
					err = pathConfigRefused()
					return
				}
				value, _ := bareConstant(x.Args[1])
				if err = guardSetting(name.text, value.text); err != nil {
					return
				}
				if value.kind != litString && strings.EqualFold(name.text, "application_name") {
					err = &sqlstate.Error{Code: sqlstate.CantChangeRuntimeParam,
						Message: "set_config of application_name with a value that is not a string constant is not supported through the Lattice proxy",
						Hint:    "Use a string literal, or SET application_name."}
					return
				}
				err = CheckSetting(name.text, value.text)
				if err != nil && value.kind != litString {
					// The value is a parameter: CheckSetting saw none.
					err = &sqlstate.Error{Code: sqlstate.CantChangeRuntimeParam,
						Message: "set_config of " + name.text + " with a value that is not a string constant is not supported through the Lattice proxy",
						Hint:    "Leave " + name.text + " at its default."}
				}
				if err != nil {
					return
				}
			}
		case *pg.VariableSetStmt:
			// A function's SET clause (proconfig) applies on every call.
			if x.Kind == pg.VariableSetKind_VAR_SET_VALUE {
				value := ""
				if len(x.Args) > 0 {
					c, _ := bareConstant(x.Args[0])
					value = c.text
				}
				if err = guardSetting(x.Name, value); err == nil {
					err = CheckSetting(x.Name, value)
				}
				if err != nil {
					return
				}
			}
		}
		eachChild(m, visit)
	}
	visit(n.ProtoReflect())
	return named, err
}

// nameSettings is statement sql[start:end] with the name argument of each
// call in named written as its setting's literal: the statement then sets
// that setting whatever pg_settings and = resolve to on the backend (a
// search_path could put a schema of the client's before pg_catalog).
func nameSettings(sql string, start, end int, named map[*pg.FuncCall]string) (string, bool) {
	type fix struct {
		at   int
		name string
	}
	var fixes []fix
	for f, name := range named {
		fixes = append(fixes, fix{int(f.Args[0].GetColumnRef().Location), name})
	}
	slices.SortFunc(fixes, func(a, b fix) int { return a.at - b.at })
	var b strings.Builder
	at := start
	for _, f := range fixes {
		word := nameWord(sql[f.at:end])
		if f.at < at || word == 0 {
			return "", false
		}
		b.WriteString(sql[at:f.at])
		b.WriteString(quoteLiteral(f.name))
		at = f.at + word
	}
	b.WriteString(sql[at:end])
	return b.String(), true
}

// nameWord is the length of the column reference name at the start of s,
// written bare or quoted; 0 for anything else.
func nameWord(s string) int {
	switch {
	case strings.HasPrefix(s, `"name"`):
		return len(`"name"`)
	case len(s) >= 4 && strings.EqualFold(s[:4], "name") && (len(s) == 4 || !isIdentCont(s[4])):
		return 4
	}
	return 0
}

// settingRow records in named the setting name of each set_config(name,
// ...) in the target list of SELECT ... FROM pg_settings WHERE name =
// 'constant': the statement by which pg_dump sets a setting that older
// servers lack (restrict_nonsystem_relation_kind). The column name is then
// that constant on the one row the call runs for, and it is checked as a
// constant name is.
func settingRow(sel *pg.SelectStmt, named map[*pg.FuncCall]string) {
	if len(sel.FromClause) != 1 {
		return
	}
	rv := sel.FromClause[0].GetRangeVar()
	if rv == nil || rv.Relname != "pg_settings" || rv.Schemaname != "" && rv.Schemaname != "pg_catalog" || rv.Alias != nil {
		return
	}
	eq := sel.WhereClause.GetAExpr()
	if eq == nil || eq.Kind != pg.A_Expr_Kind_AEXPR_OP || len(eq.Name) != 1 || eq.Name[0].GetString_().GetSval() != "=" {
		return
	}
	col, value := eq.Lexpr, eq.Rexpr
	if !isNameColumn(col) {
		col, value = value, col
	}
	c, ok := bareConstant(value)
	if !isNameColumn(col) || !ok || c.kind != litString {
		return
	}
	for _, target := range sel.TargetList {
		f := target.GetResTarget().GetVal().GetFuncCall()
		if f != nil && len(f.Args) == 3 && isNameColumn(f.Args[0]) {
			named[f] = c.text
		}
	}
}

// isNameColumn reports a bare reference to column name.
func isNameColumn(n *pg.Node) bool {
	ref := n.GetColumnRef()
	return ref != nil && len(ref.Fields) == 1 && ref.Fields[0].GetString_().GetSval() == "name"
}

// callsSetConfig reports a statement that calls set_config anywhere: its
// plan is never templated, since the check of its setting reads constants.
func callsSetConfig(n *pg.Node) bool {
	found := false
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if found {
			return
		}
		if f, ok := m.Interface().(*pg.FuncCall); ok && len(f.Funcname) > 0 && strings.EqualFold(f.Funcname[len(f.Funcname)-1].GetString_().GetSval(), "set_config") {
			found = true
			return
		}
		eachChild(m, visit)
	}
	visit(n.ProtoReflect())
	return found
}
