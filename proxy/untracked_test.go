package proxy

import "testing"

// TestSettingsForProbe: which settings the probe takes as the session's
// own, and when unqualified built-in names may resolve to a tenant's
// functions (router.HidesByPath).
func TestSettingsForProbe(t *testing.T) {
	cases := []struct {
		startup     map[string]string
		sets        []string
		tracks      []string
		untracked   []string
		catalogLate bool
	}{
		{untracked: []string{"search_path", "role"}},
		{startup: map[string]string{"search_path": "app"}, tracks: []string{"search_path"}},
		{sets: []string{"SET search_path = app, public"}, tracks: []string{"search_path"}, untracked: []string{"work_mem"}},
		{sets: []string{"SET search_path = app, pg_catalog"}, catalogLate: true},
		{sets: []string{`SET search_path TO "$user", PG_CATALOG`}, catalogLate: true},
		{startup: map[string]string{"search_path": "evil, pg_catalog"}, catalogLate: true},
		{sets: []string{"SET search_path = evil, pg_catalog", "RESET search_path"}, untracked: []string{"search_path"}},
		{sets: []string{"SET SCHEMA 'pg_catalog'"}, tracks: []string{"search_path"}, catalogLate: true},
		{sets: []string{"SET work_mem = '64MB'", "RESET ALL"}, untracked: []string{"work_mem"}},
	}
	for i, c := range cases {
		s := newSettings(c.startup, nil)
		for _, stmt := range c.sets {
			s.apply(stmt)
		}
		for _, n := range c.tracks {
			if !s.tracks(n) {
				t.Errorf("case %d: %s not tracked", i, n)
			}
		}
		for _, n := range c.untracked {
			if s.tracks(n) {
				t.Errorf("case %d: %s tracked", i, n)
			}
		}
		if s.catalogLate != c.catalogLate {
			t.Errorf("case %d: catalogLate %v, want %v", i, s.catalogLate, c.catalogLate)
		}
	}
}
