package router

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lattice-db/lattice/sqlstate"
)

// A tenant shares its nodes with other tenants, so a client's statement may
// not reach outside its own database: roles and databases, the server's
// configuration and files, programs, other backends, other servers. The
// router refuses those statements wherever they appear in the tree (a
// function call inside a subquery of a statement on a tree counts), with
// 42501. The tenant's PostgreSQL role lacks the privileges too (README,
// "Security"): this is the first wall, which answers with a hint, and the
// role is the second, which also covers what the router cannot see, such as
// a call inside a function body.

// DefaultExtensions are the extensions a client may create: PostgreSQL 15's
// trusted extensions, which a database owner without superuser may create
// anyway, and none of which reads files or opens connections.
var DefaultExtensions = []string{
	"btree_gin", "btree_gist", "citext", "cube", "dict_int", "fuzzystrmatch",
	"hstore", "intarray", "isn", "lo", "ltree", "pg_trgm", "pgcrypto", "seg",
	"tablefunc", "tcn", "tsm_system_rows", "tsm_system_time", "unaccent",
	"uuid-ossp",
}

// allowedExtensions is the process's allow-list, set once at start
// (--allow-extensions) before any statement is planned.
var allowedExtensions atomic.Pointer[[]string]

// AllowExtensions sets the extensions CREATE EXTENSION may name. Plans
// already cached keep the list they were made under: call it before
// serving.
func AllowExtensions(names []string) {
	l := slices.Clone(names)
	allowedExtensions.Store(&l)
}

func extensionAllowed(name string) bool {
	l := DefaultExtensions
	if p := allowedExtensions.Load(); p != nil {
		l = *p
	}
	return slices.Contains(l, name)
}

// outsideFunctions are the built-in functions that read or list the
// server's files, signal other backends, reload the configuration or open
// connections to other servers.
var outsideFunctions = map[string]bool{
	"pg_read_file": true, "pg_read_binary_file": true, "pg_stat_file": true,
	"lo_import": true, "lo_export": true,
	"pg_terminate_backend": true, "pg_cancel_backend": true,
	"pg_reload_conf": true, "pg_rotate_logfile": true, "pg_promote": true,
	"pg_log_backend_memory_contexts": true,
}

// outsideFunction reports whether a function name (folded as PostgreSQL
// folds it) is one a client may not call: those above, pg_ls_dir and its
// siblings (pg_ls_logdir, pg_ls_waldir ...), adminpack's pg_file_*, and
// every dblink function.
func outsideFunction(name string) bool {
	name = strings.ToLower(name)
	return outsideFunctions[name] || strings.HasPrefix(name, "pg_ls_") ||
		strings.HasPrefix(name, "pg_file_") || strings.HasPrefix(name, "dblink")
}

// ownBackend reports a signal to the backend that runs the call,
// pg_terminate_backend(pg_backend_pid()): it reaches no one else (that
// backend serves only this client while it runs the statement), and a
// client may end its own backend on PostgreSQL too (pgx's
// TestBeginTxFatalErrorKillsConn). A tenant's own pg_backend_pid ahead of
// pg_catalog's in its search_path could name another backend, but only
// one of its own role's, which the role may signal on PostgreSQL.
func ownBackend(f *pg.FuncCall) bool {
	name := strings.ToLower(f.Funcname[len(f.Funcname)-1].GetString_().GetSval())
	if name != "pg_terminate_backend" && name != "pg_cancel_backend" || len(f.Args) == 0 || len(f.Args) > 2 {
		return false
	}
	pid := f.Args[0].GetFuncCall()
	if pid == nil || len(pid.Args) > 0 || pid.AggStar || pid.Over != nil || len(pid.Funcname) > 2 {
		return false
	}
	if len(pid.Funcname) == 2 && !strings.EqualFold(pid.Funcname[0].GetString_().GetSval(), "pg_catalog") {
		return false
	}
	return strings.EqualFold(pid.Funcname[len(pid.Funcname)-1].GetString_().GetSval(), "pg_backend_pid")
}

func denied(hint, format string, args ...any) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.InsufficientPrivilege, Message: fmt.Sprintf(format, args...), Hint: hint}
}

const operatorHint = "An operator does this on the node itself, as a role of its own, not through Lattice."

// outsideStatement returns the refusal of a statement that acts on
// something other than the tenant's own database, or nil.
func outsideStatement(n *pg.Node) *sqlstate.Error {
	switch s := n.Node.(type) {
	case *pg.Node_CreateRoleStmt, *pg.Node_AlterRoleStmt, *pg.Node_AlterRoleSetStmt,
		*pg.Node_DropRoleStmt, *pg.Node_GrantRoleStmt, *pg.Node_ReassignOwnedStmt:
		return denied(operatorHint, "permission denied: Lattice does not run role statements for a tenant (%s)", reachName(n))
	case *pg.Node_CreatedbStmt, *pg.Node_AlterDatabaseStmt, *pg.Node_AlterDatabaseSetStmt,
		*pg.Node_AlterDatabaseRefreshCollStmt, *pg.Node_DropdbStmt:
		return denied("Lattice makes a tenant's database on first use; anything else about databases is the operator's, on the node itself.",
			"permission denied: Lattice does not run database statements for a tenant (%s)", reachName(n))
	case *pg.Node_AlterSystemStmt:
		return denied(operatorHint, "permission denied: ALTER SYSTEM changes the configuration of every tenant on the node")
	case *pg.Node_CreateTableSpaceStmt, *pg.Node_DropTableSpaceStmt, *pg.Node_AlterTableSpaceOptionsStmt,
		*pg.Node_CreateSubscriptionStmt, *pg.Node_AlterSubscriptionStmt, *pg.Node_DropSubscriptionStmt,
		*pg.Node_LoadStmt, *pg.Node_CreatePlangStmt:
		return denied(operatorHint, "permission denied: %s reaches outside the tenant's database", reachName(n))
	case *pg.Node_RenameStmt:
		if t := s.RenameStmt.RenameType; t == pg.ObjectType_OBJECT_DATABASE || t == pg.ObjectType_OBJECT_ROLE || t == pg.ObjectType_OBJECT_TABLESPACE {
			return denied(operatorHint, "permission denied: Lattice does not rename databases, roles or tablespaces for a tenant")
		}
	case *pg.Node_AlterOwnerStmt:
		if t := s.AlterOwnerStmt.ObjectType; t == pg.ObjectType_OBJECT_DATABASE || t == pg.ObjectType_OBJECT_TABLESPACE {
			return denied(operatorHint, "permission denied: Lattice does not change the owner of a database or tablespace for a tenant")
		}
	case *pg.Node_CreateExtensionStmt:
		if name := s.CreateExtensionStmt.Extname; !extensionAllowed(name) {
			return denied("The proxy's --allow-extensions lists the extensions a tenant may create; an operator installs others on the node itself.",
				"permission denied: extension %s is not allowed for tenants", qn(name))
		}
	case *pg.Node_CopyStmt:
		c := s.CopyStmt
		switch {
		case c.IsProgram:
			return denied("Use COPY ... FROM STDIN or TO STDOUT (psql's \\copy) and run the program on the client.",
				"permission denied: COPY to or from a program runs it on the node")
		case c.Filename != "":
			return denied("Use COPY ... FROM STDIN or TO STDOUT (psql's \\copy) to move the file from the client.",
				"permission denied: COPY to or from a file reads or writes the node's files")
		}
	}
	var bad string
	var meta bool
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if bad != "" {
			return
		}
		if rv, ok := m.Interface().(*pg.RangeVar); ok && strings.EqualFold(rv.Schemaname, "lattice_meta") {
			bad, meta = rv.Relname, true
			return
		}
		if f, ok := m.Interface().(*pg.FuncCall); ok && len(f.Funcname) > 0 {
			name := f.Funcname[len(f.Funcname)-1].GetString_().GetSval()
			if outsideFunction(name) && !ownBackend(f) {
				bad = name
				return
			}
			// lattice_meta holds the proxy's own records and functions: the
			// commit decisions are made by the proxy alone.
			if strings.EqualFold(name, "decide_commit") || len(f.Funcname) > 1 && strings.EqualFold(f.Funcname[len(f.Funcname)-2].GetString_().GetSval(), "lattice_meta") {
				bad, meta = name, true
				return
			}
		}
		eachChild(m, visit)
	}
	visit(n.ProtoReflect())
	if meta {
		return denied("lattice_meta holds the proxy's own records (tree records, commit decisions): read the trees with lattice_trees() and commit with COMMIT.",
			"permission denied for %s: lattice_meta is the proxy's", bad)
	}
	if bad != "" {
		return denied("A tenant may not read the node's files, signal other backends or connect out from the node: an operator does that on the node itself.",
			"permission denied for function %s", bad)
	}
	return nil
}

// reachName names the statements above for a message, where stmtName's
// words from the node type would not read as SQL.
func reachName(n *pg.Node) string {
	switch n.Node.(type) {
	case *pg.Node_AlterRoleSetStmt:
		return "ALTER ROLE"
	case *pg.Node_GrantRoleStmt:
		return "GRANT or REVOKE of a role"
	case *pg.Node_CreatedbStmt:
		return "CREATE DATABASE"
	case *pg.Node_AlterDatabaseSetStmt, *pg.Node_AlterDatabaseRefreshCollStmt:
		return "ALTER DATABASE"
	case *pg.Node_DropdbStmt:
		return "DROP DATABASE"
	case *pg.Node_CreatePlangStmt:
		return "CREATE LANGUAGE"
	}
	return stmtName(n)
}

// applyReach refuses, on pl, a statement that reaches outside the tenant,
// or past a tree to its shards' tables (shardtables.go).
// It runs after every other classification, so that nothing a statement
// also is (a tree statement, a pin) lets it through.
func applyReach(pl *Plan, n *pg.Node) {
	e := outsideStatement(n)
	if e == nil {
		e = shardTableStatement(n)
	}
	if e != nil {
		*pl = Plan{Kind: Refused, SQL: pl.SQL, Err: e}
	}
}
