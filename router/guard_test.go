package router

import (
	"testing"

	"github.com/lattice-db/lattice/sqlstate"
)

func TestGuardSettings(t *testing.T) {
	cases := []struct {
		sql  string
		code string // "" when allowed
	}{
		{`SET lattice.migrator = on`, sqlstate.InsufficientPrivilege},
		{`SET LOCAL lattice.migrator = on`, sqlstate.InsufficientPrivilege},
		{`SET "Lattice.Anything" TO 'x'`, sqlstate.InsufficientPrivilege},
		{`SET session_replication_role = replica`, sqlstate.InsufficientPrivilege},
		{`SET application_name = 'lattice proxy abc/0123'`, sqlstate.InsufficientPrivilege},
		{`SET application_name = 'Lattice Proxy x'`, sqlstate.InsufficientPrivilege},
		{`SET application_name = 'my lattice proxy'`, ""},
		{`SET application_name = 'app'`, ""},
		{`SET search_path = public`, ""},

		{`SELECT set_config('lattice.migrator', 'on', false)`, sqlstate.InsufficientPrivilege},
		{`SELECT set_config('lattice.migrator', 'on', true)`, sqlstate.InsufficientPrivilege},
		{`SELECT pg_catalog.set_config('LATTICE.migrator', 'on', true)`, sqlstate.InsufficientPrivilege},
		{`SELECT x FROM (SELECT set_config('lattice.migrator', 'on', true) AS x) s`, sqlstate.InsufficientPrivilege},
		{`SELECT set_config('session_replication_role', 'replica', false)`, sqlstate.InsufficientPrivilege},
		{`SELECT set_config('application_name', 'lattice proxy d/1', false)`, sqlstate.InsufficientPrivilege},
		{`SELECT set_config('application_name', $1, false)`, sqlstate.CantChangeRuntimeParam},
		{`SELECT set_config('standard_conforming_strings', 'off', false)`, sqlstate.FeatureNotSupported},
		{`SELECT set_config('standard_conforming_strings', $1, true)`, sqlstate.CantChangeRuntimeParam},
		{`SELECT set_config('client_encoding', 'LATIN1', false)`, sqlstate.FeatureNotSupported},
		{`SELECT set_config($1, 'on', false)`, sqlstate.CantChangeRuntimeParam},
		{`SELECT set_config('lattice.' || 'migrator', 'on', false)`, sqlstate.CantChangeRuntimeParam},
		{`SELECT set_config('lattice.migrator'::text, 'on', false)`, sqlstate.CantChangeRuntimeParam},
		{`SELECT set_config('lattice.migrator', 'on', true), * FROM orders WHERE id = 1`, sqlstate.InsufficientPrivilege},
		// pg_dump's form: the name is the one row's, a constant after all.
		{`SELECT set_config(name, 'view, foreign-table', false) FROM pg_settings WHERE name = 'restrict_nonsystem_relation_kind'`, ""},
		{`SELECT pg_catalog.set_config("name", 'x', false) FROM pg_catalog.pg_settings WHERE 'work_mem' = name`, ""},
		{`SELECT set_config(pg_settings.name, 'x', false) FROM pg_settings WHERE name = 'search_path'`, sqlstate.CantChangeRuntimeParam},
		{`SELECT set_config(name, 'x', false), * FROM pg_settings WHERE name = 'work_mem'`, ""},
		{`SELECT set_config(name, 'on', false) FROM pg_settings WHERE name = 'lattice.migrator'`, sqlstate.InsufficientPrivilege},
		{`SELECT set_config(name, 'replica', false) FROM pg_settings WHERE name = 'session_replication_role'`, sqlstate.InsufficientPrivilege},
		{`SELECT set_config(name, 'off', false) FROM pg_settings WHERE name = 'standard_conforming_strings'`, sqlstate.FeatureNotSupported},
		{`SELECT set_config(name, 'replica', false) FROM pg_settings WHERE name LIKE 'session_repl%'`, sqlstate.CantChangeRuntimeParam},
		{`SELECT set_config(name, 'replica', false) FROM pg_settings WHERE name = 'search_path' OR true`, sqlstate.CantChangeRuntimeParam},
		{`SELECT set_config(name, 'replica', false) FROM pg_settings s WHERE name = 'search_path'`, sqlstate.CantChangeRuntimeParam},
		{`SELECT set_config(name, 'replica', false) FROM pg_settings, pg_class WHERE name = 'search_path'`, sqlstate.CantChangeRuntimeParam},
		{`SELECT set_config(name, 'replica', false) FROM myschema.pg_settings WHERE name = 'search_path'`, sqlstate.CantChangeRuntimeParam},
		{`SELECT (SELECT set_config(name, 'on', false) FROM pg_settings WHERE name = 'work_mem'), set_config(name, 'on', false) FROM pg_settings WHERE name LIKE 'lattice%'`, sqlstate.CantChangeRuntimeParam},
		{`SELECT set_config('search_path', 'x', false)`, ""},
		// search_path only as a statement of its own, with literals (setpath.go).
		{`SELECT set_config('search_path', $1, true)`, sqlstate.FeatureNotSupported},
		{`SELECT set_config('search_path', 'x', true)`, sqlstate.FeatureNotSupported},
		{`SELECT set_config('search_path', 'x', false), 1`, sqlstate.FeatureNotSupported},
		{`SELECT set_config(name, 'x', false) FROM pg_settings WHERE name = 'search_path'`, sqlstate.FeatureNotSupported},
		{`WITH s AS (SELECT set_config('Search_Path', 'x', false)) SELECT * FROM s`, sqlstate.FeatureNotSupported},
		{`SELECT set_config('work_mem', $1, true)`, ""},
		{`SELECT set_config('standard_conforming_strings', 'on', true)`, ""},

		// A function's SET clause applies at every call.
		{`CREATE FUNCTION f() RETURNS int LANGUAGE sql SET lattice.migrator = 'on' AS 'SELECT 1'`, sqlstate.InsufficientPrivilege},
		{`ALTER FUNCTION f() SET session_replication_role = replica`, sqlstate.InsufficientPrivilege},
		{`CREATE FUNCTION f() RETURNS int LANGUAGE sql SET search_path = public AS 'SELECT 1'`, ""},
	}
	for _, c := range cases {
		p := planOne(t, c.sql)
		got := ""
		if p.Kind == Refused {
			got = p.Err.Code
			if p.Err.Hint == "" {
				t.Errorf("%s: refused without a hint", c.sql)
			}
		}
		if got != c.code {
			t.Errorf("%s: refused with %q (%v), want %q", c.sql, got, p.Err, c.code)
		}
	}
}

// TestSettingRowNamed: the set_config of SELECT ... FROM pg_settings WHERE
// name = 'constant' reaches the backend with the constant as its name, so
// no pg_settings or = of the client's can make it set another setting.
func TestSettingRowNamed(t *testing.T) {
	for _, c := range []struct{ sql, want string }{
		{`SELECT set_config(name, 'view, foreign-table', false) FROM pg_settings WHERE name = 'restrict_nonsystem_relation_kind'`,
			`SELECT set_config('restrict_nonsystem_relation_kind', 'view, foreign-table', false) FROM pg_settings WHERE name = 'restrict_nonsystem_relation_kind'`},
		{`select set_config(NAME, 'a', false), set_config("name", 'b', true) from pg_settings where name = 'work_mem';`,
			`select set_config('work_mem', 'a', false), set_config('work_mem', 'b', true) from pg_settings where name = 'work_mem'`},
		{`SELECT 1; SELECT set_config(name, 'x', false) FROM pg_settings WHERE name = 'it''s'`,
			`SELECT set_config('it''s', 'x', false) FROM pg_settings WHERE name = 'it''s'`},
	} {
		plans, err := NewPlanner(100).Plan(c.sql, moreTrees(), 1)
		if err != nil {
			t.Fatal(err)
		}
		p := plans[len(plans)-1]
		if p.Kind != Catalog || p.SQL != c.want {
			t.Errorf("%s: %v %q, want Catalog %q", c.sql, p.Kind, p.SQL, c.want)
		}
	}
}

// TestGuardNotDerivedFromShape: a set_config of an allowed setting must not
// leave a template through which a refused one passes.
func TestGuardNotDerivedFromShape(t *testing.T) {
	pl := NewPlanner(100)
	for i, sql := range []string{
		`SELECT set_config('work_mem', 'a', true)`,
		`SELECT set_config('work_mem', 'b', true)`,
		`SELECT set_config('lattice.migrator', 'on', true)`,
	} {
		plans, err := pl.Plan(sql, moreTrees(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if refused := plans[0].Kind == Refused; refused != (i == 2) {
			t.Fatalf("%s: kind %v", sql, plans[0].Kind)
		}
	}
}

// TestCheckReported: the values a backend may report for the settings the
// proxy reads statements by; anything else it reports is not the proxy's.
func TestCheckReported(t *testing.T) {
	for _, c := range []struct {
		name, value string
		refused     bool
	}{
		{"standard_conforming_strings", "on", false},
		{"standard_conforming_strings", "off", true},
		{"client_encoding", "UTF8", false},
		{"client_encoding", "SQL_ASCII", false},
		{"client_encoding", "LATIN1", true},
		{"application_name", "lattice proxy d/1", false}, // presence is told by role
		{"TimeZone", "UTC", false},
	} {
		e := CheckReported(c.name, c.value)
		if (e != nil) != c.refused {
			t.Errorf("%s = %s: %v, want refused %v", c.name, c.value, e, c.refused)
		}
		if e != nil && (e.Code != sqlstate.FeatureNotSupported || e.Hint == "" || e.Detail == "") {
			t.Errorf("%s = %s: %+v, want 0A000 with a hint and a detail", c.name, c.value, e)
		}
	}
}
