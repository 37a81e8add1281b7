package router

import (
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
// whose name is not a constant could be any setting, so it is refused too.
// Settings a function body makes at run time are out of the proxy's sight.
func guardSetConfig(n *pg.Node) *sqlstate.Error {
	var err *sqlstate.Error
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if err != nil {
			return
		}
		switch x := m.Interface().(type) {
		case *pg.FuncCall:
			if len(x.Funcname) > 0 && strings.EqualFold(x.Funcname[len(x.Funcname)-1].GetString_().GetSval(), "set_config") && len(x.Args) == 3 {
				name, ok := bareConstant(x.Args[0])
				if !ok || name.kind != litString {
					err = &sqlstate.Error{Code: sqlstate.CantChangeRuntimeParam,
						Message: "set_config with a setting name that is not a string constant is not supported through the Lattice proxy",
						Hint:    "Name the setting with a string literal, as in set_config('search_path', $1, false), or use SET."}
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
	return err
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
