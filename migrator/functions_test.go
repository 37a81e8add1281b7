package migrator

import (
	"testing"

	"github.com/lattice-db/lattice/router"
)

// TestComposableSignatures keeps the router's list of functions that
// compose into a larger SELECT true to the signatures: a function composes
// as a value only when it has one column, and the functions that change
// the cluster never compose.
func TestComposableSignatures(t *testing.T) {
	changes := map[string]bool{"lattice_create_tree": true, "lattice_reshard": true, "lattice_add_node": true, "lattice_remove_node": true,
		"lattice_move_shard": true, "lattice_rebalance": true, "lattice_drain_node": true,
		"lattice_repair_migration": true, "lattice_create_reference_table": true, "lattice_undistribute_table": true}
	for name, sig := range signatures {
		ok, value := router.Composable(name)
		switch {
		case changes[name] && ok:
			t.Errorf("%s changes the cluster but composes", name)
		case !changes[name] && !ok:
			t.Errorf("%s only reads but does not compose", name)
		case ok && value != (len(sig) == 1):
			t.Errorf("%s has %d columns; composes as a value: %v", name, len(sig), value)
		}
	}
}
