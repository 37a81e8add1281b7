package migrator

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// TestInReferenceOrder builds trees whose tables reference others (refs:
// tree -> the trees it references) as CreateShard would: a tree fails
// with 42P01 until the trees it references are built.
func TestInReferenceOrder(t *testing.T) {
	cases := []struct {
		name  string
		refs  map[string][]string
		order string // "" when it must fail
	}{
		{"none", nil, "a,b,c"},
		{"child sorts first", map[string][]string{"a": {"c"}}, "b,c,a"},
		{"chain", map[string][]string{"a": {"b"}, "b": {"c"}}, "c,b,a"},
		{"self", map[string][]string{"a": {"a"}}, "a,b,c"},
		{"cycle", map[string][]string{"a": {"b"}, "b": {"a"}}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var trees []*shardmap.Tree
			for _, n := range []string{"a", "b", "c"} {
				trees = append(trees, &shardmap.Tree{Name: n})
			}
			built := map[string]bool{}
			var order []string
			err := inReferenceOrder(trees, sqlstate.UndefinedTable, func(tr *shardmap.Tree) error {
				for _, r := range tc.refs[tr.Name] {
					if r != tr.Name && !built[r] {
						return &pgconn.PgError{Code: sqlstate.UndefinedTable, Message: "relation " + r + " does not exist"}
					}
				}
				built[tr.Name] = true
				order = append(order, tr.Name)
				return nil
			})
			got := strings.Join(order, ",")
			switch {
			case tc.order == "" && !sqlstate.Is(err, sqlstate.UndefinedTable):
				t.Fatalf("built %s, err %v; want 42P01", got, err)
			case tc.order != "" && (err != nil || got != tc.order):
				t.Fatalf("built %s, err %v; want %s", got, err, tc.order)
			}
		})
	}
	other := errors.New("node down")
	if err := inReferenceOrder([]*shardmap.Tree{{Name: "a"}, {Name: "b"}}, sqlstate.UndefinedTable, func(*shardmap.Tree) error { return other }); err != other {
		t.Fatalf("another error: %v, want it returned at once", err)
	}
}
