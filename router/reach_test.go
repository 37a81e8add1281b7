package router

import (
	"testing"

	"github.com/lattice-db/lattice/sqlstate"
)

// The allow-list of --allow-extensions replaces the default one; the
// golden file covers the refusals under the default.
func TestAllowExtensions(t *testing.T) {
	defer AllowExtensions(DefaultExtensions)
	AllowExtensions([]string{"postgis"})
	for _, c := range []struct {
		sql  string
		kind Kind
	}{
		{"CREATE EXTENSION postgis", Catalog},
		{"CREATE EXTENSION pg_trgm", Refused},
		{"CREATE EXTENSION dblink", Refused},
	} {
		plans, err := NewPlanner(0).Plan(c.sql, nil, 1)
		if err != nil {
			t.Fatal(err)
		}
		if pl := plans[0]; pl.Kind != c.kind || (c.kind == Refused && pl.Err.Code != sqlstate.InsufficientPrivilege) {
			t.Errorf("%s: %v %v, want %v", c.sql, pl.Kind, pl.Err, c.kind)
		}
	}
}
