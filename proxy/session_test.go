package proxy

import (
	"testing"

	"github.com/lattice-db/lattice/sqlstate"
)

func TestSettingsReplay(t *testing.T) {
	s := newSettings(map[string]string{"application_name": "psql", "client_encoding": "UTF8"}, map[string]string{"client_encoding": "UTF8"})
	if got := s.replay(""); got != `RESET ALL; SELECT pg_catalog.set_config('application_name', 'psql', false)` {
		t.Fatalf("startup replay = %q", got)
	}
	s.apply("SET search_path TO a, b")
	s.apply("SET application_name = 'x'")
	fp := s.fp
	if s.replay(fp) != "" {
		t.Fatal("a backend in the same state needs no replay")
	}
	s.apply("RESET search_path")
	if got := s.replay(fp); got != `RESET ALL; SELECT pg_catalog.set_config('application_name', 'psql', false); SET application_name = 'x'` {
		t.Fatalf("after RESET: %q", got)
	}
	s.apply("RESET ALL")
	s.reset()
	if got := s.replay(fp); got != `RESET ALL; SELECT pg_catalog.set_config('application_name', 'psql', false)` {
		t.Fatalf("after RESET ALL: %q", got)
	}
}

func TestSetTarget(t *testing.T) {
	cases := map[string][2]string{
		"SET search_path = a":           {"set", "search_path"},
		"set session TIME ZONE 'UTC'":   {"set", "timezone"},
		"SET NAMES 'UTF8'":              {"set", "client_encoding"},
		`SET "MyApp.Flag" = on`:         {"set", "MyApp.Flag"},
		"SET myapp.flag TO 1":           {"set", "myapp.flag"},
		"RESET ALL":                     {"reset", "all"},
		"SET SESSION AUTHORIZATION bob": {"set", "session_authorization"},
	}
	for stmt, want := range cases {
		verb, name := setTarget(stmt)
		if verb != want[0] || name != want[1] {
			t.Errorf("%s: got %s %s, want %s %s", stmt, verb, name, want[0], want[1])
		}
	}
}

func TestStartupSettings(t *testing.T) {
	cases := []struct {
		name     string
		params   map[string]string
		want     map[string]string
		wantCode string
	}{
		{name: "plain", params: map[string]string{"application_name": "psql", "client_encoding": "UTF8"},
			want: map[string]string{"application_name": "psql", "client_encoding": "UTF8"}},
		{name: "options -c", params: map[string]string{"options": `-c search_path=app -csearch\ x=1 --statement-timeout=5s`},
			want: map[string]string{"search_path": "app", "search x": "1", "statement_timeout": "5s"}},
		{name: "a parameter wins over options", params: map[string]string{"options": "-c client_encoding=LATIN1 -c search_path=x", "client_encoding": "UTF8"},
			want: map[string]string{"client_encoding": "UTF8", "search_path": "x"}},
		{name: "sql_ascii encoding", params: map[string]string{"client_encoding": "sql_ascii"}, want: map[string]string{"client_encoding": "sql_ascii"}},
		{name: "latin1 refused", params: map[string]string{"client_encoding": "LATIN1"}, wantCode: "0A000"},
		{name: "latin1 in options refused", params: map[string]string{"options": "-c client_encoding=LATIN1"}, wantCode: "0A000"},
		{name: "standard strings off refused", params: map[string]string{"standard_conforming_strings": "off"}, wantCode: "0A000"},
		{name: "presence name refused", params: map[string]string{"application_name": "lattice proxy dep/x"}, wantCode: "42501"},
		{name: "lattice setting refused", params: map[string]string{"options": "-c lattice.migrator=on"}, wantCode: "42501"},
		{name: "replica role refused", params: map[string]string{"session_replication_role": "replica"}, wantCode: "42501"},
		{name: "unknown option refused", params: map[string]string{"options": "-B 100"}, wantCode: "0A000"},
		{name: "option without value", params: map[string]string{"options": "-c search_path"}, wantCode: "22023"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := startupSettings(tc.params)
			if tc.wantCode != "" {
				if err == nil || sqlstate.As(err).Code != tc.wantCode {
					t.Fatalf("got %v, %v; want SQLSTATE %s", got, err, tc.wantCode)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}
