package migrator

import (
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// TestForgetReservedKeepsSameTree: the start of a migration (another
// split of the same tree) keeps what was reserved for that tree, so a
// freeze's or a flip's map write inside a write pause does not wait for
// the catalog node; a tree created again, or a colocation group (a member
// may have joined), is reserved afresh.
func TestForgetReservedKeepsSameTree(t *testing.T) {
	created := time.Date(2026, 12, 2, 14, 0, 0, 123456000, time.UTC)
	for _, tc := range []struct {
		name        string
		forget      func(t *shardmap.Tree) // what the starting migration's registry entry differs in
		wantCatalog int                    // catalog upserts of the second map write
	}{
		{"same tree", func(*shardmap.Tree) {}, 0},
		{"created again", func(t *shardmap.Tree) { t.Created = created.Add(time.Microsecond) }, 1},
		{"no creation time", func(t *shardmap.Tree) { t.Created = time.Time{} }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			tree := *r.tree
			tree.Created = created
			if err := r.store.SwapTree(r.ctx, &tree, r.tree); err != nil {
				t.Fatal(err)
			}
			run := r.runner("")
			m := r.mapNow()
			if err := run.reserve(r.ctx, m, m.Epoch+1); err != nil {
				t.Fatal(err)
			}
			first := r.nodes.reserves
			starting := tree
			tc.forget(&starting)
			if starting.Created.IsZero() {
				// The cache holds the zero time too: nothing to tell
				// incarnations apart by.
				if err := r.store.SwapTree(r.ctx, &starting, &tree); err != nil {
					t.Fatal(err)
				}
				run.forgetReserved(&starting)
				if err := run.reserve(r.ctx, m, m.Epoch+1); err != nil {
					t.Fatal(err)
				}
				first = r.nodes.reserves
			}
			run.forgetReserved(&starting)
			if err := run.reserve(r.ctx, m, m.Epoch+2); err != nil {
				t.Fatal(err)
			}
			if got := r.nodes.reserves - first; got != tc.wantCatalog {
				t.Fatalf("the map write after a start went to the catalog node %d times, want %d", got, tc.wantCatalog)
			}
		})
	}
}
