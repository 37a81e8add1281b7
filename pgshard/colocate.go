package pgshard

import (
	"context"
	"errors"
	"fmt"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// colocation is what creating a tree in another tree's colocation group
// (TreeSpec.ColocateWith) builds on: the registry entry of the tree it names
// and the group's map as read, without its retired tombstones (they have no
// tables to match).
type colocation struct {
	anchor *shardmap.Tree
	epoch  uint64 // of the map as read: the registration is checked against it
}

// colocateWith reads the group of spec.ColocateWith and the map the new
// tree's shards are built by: every active shard of the group, on its node,
// with its slots. A group in a migration, or a slot or shard count that is
// not the group's, is refused before anything is built.
func colocateWith(ctx context.Context, store shardmap.Store, spec TreeSpec, given TreeSpec) (*colocation, *shardmap.Map, error) {
	anchor, err := store.Tree(ctx, spec.Tenant, spec.ColocateWith)
	if errors.Is(err, shardmap.ErrNotFound) {
		return nil, nil, &sqlstate.Error{Code: sqlstate.UndefinedTable,
			Message: fmt.Sprintf("tree %s named by colocate_with does not exist", quoted(spec.ColocateWith)),
			Hint:    "colocate_with names an existing tree; SELECT * FROM lattice_trees() lists them."}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("pgshard: colocate %s with %s: %w", spec.Table, spec.ColocateWith, err)
	}
	if given.SlotCount != 0 && given.SlotCount != anchor.SlotCount {
		return nil, nil, slotMismatch(spec.Table, given.SlotCount, anchor)
	}
	gm, err := store.Map(ctx, spec.Tenant, anchor.MapName())
	if err != nil {
		return nil, nil, fmt.Errorf("pgshard: colocate %s with %s: %w", spec.Table, spec.ColocateWith, err)
	}
	m := gm.Clone()
	for idx, sh := range m.Shards {
		switch {
		case sh.State == shardmap.ShardRetired:
			delete(m.Shards, idx)
		case sh.State != shardmap.ShardActive || sh.Mixed:
			return nil, nil, groupBusy(spec.Table, anchor)
		}
	}
	if len(m.Frozen) > 0 {
		return nil, nil, groupBusy(spec.Table, anchor)
	}
	if given.ShardCount != 0 && given.ShardCount != m.DistinctShards() {
		return nil, nil, &sqlstate.Error{Code: sqlstate.InvalidParameterValue,
			Message: fmt.Sprintf("shard count %d differs from the %d shards of the colocation group of %s", given.ShardCount, m.DistinctShards(), quoted(anchor.Name)),
			Hint:    "Leave shard_count out: a colocated tree takes its group's shards."}
	}
	m.Tree = spec.Table
	return &colocation{anchor: anchor, epoch: gm.Epoch}, m, nil
}

// check refuses a new tree whose key does not hash like the group's.
func (co *colocation) check(t *shardmap.Tree) error {
	err := shardmap.Colocatable(t, co.anchor)
	switch {
	case errors.Is(err, shardmap.ErrKeyMismatch):
		return &sqlstate.Error{Code: sqlstate.DatatypeMismatch,
			Message: fmt.Sprintf("shard key %s of %s (%s) does not hash like shard key %s of %s (%s)",
				quoted(t.KeyColumn), quoted(t.Name), t.KeyType, quoted(co.anchor.KeyColumn), quoted(co.anchor.Name), co.anchor.KeyType),
			Detail: "Colocated trees need keys that hash alike: smallint, integer and bigint together; text and varchar together; uuid alone.",
			Hint:   "Key the table by a column of a type that hashes like its group's key, or create it without colocate_with."}
	case errors.Is(err, shardmap.ErrSlotMismatch):
		return slotMismatch(t.Name, t.SlotCount, co.anchor)
	}
	return err
}

// register stores t as a member of the group, refusing it if the group's
// map moved on since colocateWith read it (t's shards follow that map).
func (co *colocation) register(ctx context.Context, store shardmap.Store, t *shardmap.Tree) error {
	err := store.CreateColocated(ctx, t, co.anchor, co.epoch)
	switch {
	case errors.Is(err, shardmap.ErrConflict):
		return &sqlstate.Error{Code: sqlstate.SerializationFailure,
			Message: fmt.Sprintf("the colocation group of %s changed while %s was made a tree", quoted(co.anchor.Name), quoted(t.Name)),
			Hint:    "Run lattice_create_tree again."}
	case errors.Is(err, shardmap.ErrGroupBusy):
		return groupBusy(t.Name, co.anchor)
	}
	return err
}

func slotMismatch(table string, slots int, anchor *shardmap.Tree) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.DatatypeMismatch,
		Message: fmt.Sprintf("slot count %d of %s differs from the %d slots of %s", slots, quoted(table), anchor.SlotCount, quoted(anchor.Name)),
		Detail:  "The trees of a colocation group share one slot map.",
		Hint:    "Leave slot_count out: a colocated tree takes its group's."}
}

func groupBusy(table string, anchor *shardmap.Tree) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.ObjectNotInPrerequisiteState,
		Message: fmt.Sprintf("cannot colocate %s with %s while its colocation group is being resharded or moved", quoted(table), quoted(anchor.Name)),
		Hint:    fmt.Sprintf("Wait until SELECT lattice_reshard_complete('%s') and lattice_rebalance_complete('%s') are true, then run it again.", anchor.Name, anchor.Name)}
}
