package migrator

import (
	"fmt"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// groupRefusal refuses to move the shards of a member of a colocation
// group: the migrations here move one tree's table, and moving one member
// without the others would part rows of equal keys. nil for a tree alone.
func groupRefusal(t *shardmap.Tree, what string) error {
	if t.Group == "" {
		return nil
	}
	e := sqlstate.New(sqlstate.FeatureNotSupported, "cannot %s: tree %s is in colocation group %s, whose trees move only together", what, t.Name, t.Group)
	e.Hint = "Resharding and moving a colocation group is not supported yet; create the trees without colocate_with to reshard them."
	return e
}

// groupsOf names the colocation groups among trees, for a refusal that
// covers a whole drain.
func groupsOf(trees []*shardmap.Tree) error {
	for _, t := range trees {
		if err := groupRefusal(t, fmt.Sprintf("drain shards of %s", t.Name)); err != nil {
			return err
		}
	}
	return nil
}
