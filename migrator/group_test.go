package migrator

import (
	"fmt"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

// join registers a tree named name in the colocation group of the rig's
// tree, which becomes the group's first member.
func (r *testRig) join(name string) *shardmap.Tree {
	r.t.Helper()
	anchor, err := r.store.Tree(r.ctx, r.tree.Tenant, r.tree.Name)
	if err != nil {
		r.t.Fatal(err)
	}
	m := r.mapNow()
	member := *r.tree
	member.Name, member.Group = name, r.tree.Name
	if err := r.store.CreateColocated(r.ctx, &member, anchor, m.Epoch); err != nil {
		r.t.Fatal(err)
	}
	r.tree.Group = r.tree.Name
	return &member
}

// TestRunGroup runs a split, a fold and a move asked of a member of a
// colocation group that is not the tree the group is named after: each is
// recorded under the group's name, and makes, fences and releases the
// table of every member of its shards.
func TestRunGroup(t *testing.T) {
	for _, kind := range []shardmap.MigrationKind{shardmap.Split, shardmap.Fold, shardmap.Move} {
		t.Run(string(kind), func(t *testing.T) {
			r := newRig(t)
			member := r.join("extras")
			run := r.runner("")
			var mig *shardmap.Migration
			var err error
			switch kind {
			case shardmap.Split:
				mig, err = run.StartSplit(r.ctx, member, 0)
			case shardmap.Fold:
				mig, err = run.StartFold(r.ctx, member, 1, 0)
			case shardmap.Move:
				mig, err = run.StartMove(r.ctx, member, 0, "n2")
			}
			if err != nil {
				t.Fatal(err)
			}
			if mig.Tree != "items" {
				t.Fatalf("migration recorded under %q, want the group's name items", mig.Tree)
			}
			if own, err := r.store.Migrations(r.ctx, "app", "extras"); err != nil || len(own) != 0 {
				t.Fatalf("the member has migrations of its own: %v, %v", own, err)
			}
			if _, err := r.run(run, mig); err != nil {
				t.Fatal(err)
			}
			for _, tree := range []string{"items", "extras"} {
				want := []string{"fence " + mig.ID + " " + tree}
				switch kind {
				case shardmap.Split:
					want = append(want, fmt.Sprintf("create %d %s", mig.Target, tree), fmt.Sprintf("delete %d %s", mig.Source, tree))
				case shardmap.Fold:
					want = append(want, fmt.Sprintf("drop %d %s", mig.Source, tree))
				case shardmap.Move:
					want = append(want, "create 0 "+tree, "drop 0 "+tree)
				}
				for _, w := range want {
					if !r.nodes.called(w) {
						t.Errorf("no %q: the %s did not cover member %s", w, kind, tree)
					}
				}
			}
			if len(r.nodes.fences) != 0 || r.stored(mig) != nil {
				t.Errorf("fences %v or the record left", r.nodes.fences)
			}
			if kind == shardmap.Move && r.mapNow().Shards[0].Node != "n2" {
				t.Errorf("shard 0 on %s after the move, want n2", r.mapNow().Shards[0].Node)
			}
		})
	}
}
