package router

import pg "github.com/pganalyze/pg_query_go/v6"

// Hides says a statement may leave session state on its backend that the
// router cannot see: a function body, a DO block or a procedure can run
// set_config, CREATE TEMP TABLE, pg_advisory_lock or PREPARE, and the
// proxy probes the backend for such state when the statement's transaction
// ends (proxy/untracked.go). Statements that call no function have none,
// so they cost nothing.
type Hides uint8

const (
	// HidesState: a DO block, CALL, or a function other than a known
	// built-in (unqualified and not listed in builtinFuncs, or qualified
	// with a schema other than pg_catalog).
	HidesState Hides = 1 << iota
	// HidesByPath: only built-ins called by unqualified names. They are
	// pg_catalog's while pg_catalog is searched first, which it is unless
	// the search_path names it after another schema: the proxy then counts
	// these calls as HidesState.
	HidesByPath
)

// callHides classifies one function call. A tenant cannot create
// functions in pg_catalog, so a pg_catalog-qualified call is a built-in;
// the built-ins that do make session state (set_config, the session
// advisory locks) are tracked by pins instead.
func callHides(f *pg.FuncCall) Hides {
	// The parser folds unquoted names to lower case; a quoted "NOW" is
	// another function, not the built-in.
	switch len(f.Funcname) {
	case 1:
		name := f.Funcname[0].GetString_().GetSval()
		if _, ok := composable[name]; ok || changing[name] {
			return 0 // lattice functions run in the proxy, not on a backend
		}
		if builtinFuncs[name] {
			return HidesByPath
		}
	case 2:
		if f.Funcname[0].GetString_().GetSval() == "pg_catalog" {
			return 0
		}
	}
	return HidesState
}

// statementHides classifies a statement's own kind: DO and CALL run code
// the router cannot read.
func statementHides(n *pg.Node) Hides {
	switch n.Node.(type) {
	case *pg.Node_DoStmt, *pg.Node_CallStmt:
		return HidesState
	}
	return 0
}

// builtinFuncs are pg_catalog functions commonly called by unqualified
// name. Any other unqualified name may be a tenant's function; the cost of
// a name missing here is one probe, never a leak.
var builtinFuncs = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range []string{
		// aggregates and window functions
		"count", "sum", "avg", "min", "max", "bool_and", "bool_or", "every", "array_agg", "string_agg",
		"json_agg", "jsonb_agg", "json_object_agg", "jsonb_object_agg", "stddev", "stddev_pop", "stddev_samp",
		"variance", "var_pop", "var_samp", "bit_and", "bit_or", "percentile_cont", "percentile_disc", "mode",
		"row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead",
		"first_value", "last_value", "nth_value",
		// time
		"now", "clock_timestamp", "statement_timestamp", "transaction_timestamp", "timeofday", "date_trunc",
		"date_part", "extract", "age", "make_date", "make_time", "make_timestamp", "make_timestamptz",
		"make_interval", "to_timestamp", "to_date", "to_char", "to_number", "date_bin", "justify_days",
		"justify_hours", "justify_interval", "isfinite",
		// strings
		"lower", "upper", "length", "char_length", "character_length", "octet_length", "bit_length",
		"substr", "substring", "position", "strpos", "replace", "concat", "concat_ws", "format", "left",
		"right", "lpad", "rpad", "trim", "btrim", "ltrim", "rtrim", "initcap", "repeat", "reverse",
		"split_part", "starts_with", "translate", "md5", "sha256", "sha512", "encode", "decode", "ascii", "chr",
		"quote_ident", "quote_literal", "quote_nullable", "regexp_replace", "regexp_match", "regexp_matches",
		"regexp_split_to_array", "regexp_split_to_table", "string_to_array", "array_to_string", "overlay",
		// numbers
		"abs", "ceil", "ceiling", "floor", "round", "trunc", "mod", "power", "pow", "sqrt", "cbrt", "exp",
		"ln", "log", "log10", "sign", "div", "greatest", "least", "random", "width_bucket", "gcd", "lcm",
		// arrays, json, misc
		"array_length", "array_position", "array_positions", "array_append", "array_prepend", "array_cat",
		"array_remove", "array_replace", "array_lower", "array_upper", "array_ndims", "array_dims",
		"cardinality", "unnest", "generate_series", "generate_subscripts", "coalesce", "nullif",
		"to_json", "to_jsonb", "row_to_json", "json_build_object", "jsonb_build_object", "json_build_array",
		"jsonb_build_array", "jsonb_set", "jsonb_insert", "jsonb_pretty", "jsonb_typeof", "json_typeof",
		"jsonb_array_length", "json_array_length", "jsonb_each", "json_each", "jsonb_object_keys",
		"jsonb_path_query", "jsonb_path_exists", "jsonb_strip_nulls", "jsonb_extract_path",
		"jsonb_extract_path_text", "json_extract_path", "json_extract_path_text",
		"gen_random_uuid", "uuid_generate_v4", "hashtext", "current_setting", "current_database",
		"current_schema", "current_schemas", "current_user", "session_user", "version", "pg_typeof",
		"txid_current", "pg_current_xact_id", "pg_backend_pid", "pg_sleep", "pg_notify",
		"nextval", "currval", "setval", "lastval", "pg_column_size", "pg_relation_size",
		"pg_total_relation_size", "pg_size_pretty", "pg_table_size", "pg_indexes_size", "format_type",
		"obj_description", "col_description", "has_table_privilege", "has_schema_privilege",
		"pg_get_indexdef", "pg_get_viewdef", "pg_get_constraintdef", "pg_get_functiondef",
		"pg_advisory_xact_lock", "pg_advisory_xact_lock_shared", "pg_try_advisory_xact_lock",
		"pg_try_advisory_xact_lock_shared", "pg_advisory_unlock", "pg_advisory_unlock_shared",
		"pg_advisory_unlock_all",
		// tracked by pins (pin.go): pinned on the catalog node, refused on a tree
		"set_config", "pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock",
		"pg_try_advisory_lock_shared",
	} {
		m[n] = true
	}
	return m
}()
