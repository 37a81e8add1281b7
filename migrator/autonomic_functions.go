package migrator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// lattice_set_tree_option(tree, option, value): the tree's switches of the
// split monitor and of healing (docs/DESIGN.md section 6.1).
func init() {
	maps.Copy(signatures, map[string][]pgproto3.FieldDescription{
		"lattice_set_tree_option": {field("lattice_set_tree_option", pgtype.TextOID)},
	})
	maps.Copy(argNames, map[string][]string{"lattice_set_tree_option": {"tree", "option", "value"}})
}

// callAutonomic runs this file's function; ok is false for any other name.
func (f *Functions) callAutonomic(ctx context.Context, tenant, name string, args []*string, named map[string]*string) (rows [][]any, ok bool, err error) {
	if name != "lattice_set_tree_option" {
		return nil, false, nil
	}
	a, err := bindArgs(name, args, named, argNames[name]...)
	if err != nil {
		return nil, true, err
	}
	t, err := f.lookupTree(ctx, tenant, a)
	if err != nil {
		return nil, true, err
	}
	option, err := required(a, "option")
	if err != nil {
		return nil, true, err
	}
	if a["value"] == nil {
		return nil, true, sqlstate.New(sqlstate.NullValueNotAllowed, "argument value must not be null")
	}
	on, err := optionalBool(a, "value")
	if err != nil {
		return nil, true, err
	}
	msg, err := f.SetTreeOption(ctx, t.Tenant, t.Name, strings.ToLower(option), on)
	if err != nil {
		return nil, true, err
	}
	return [][]any{{msg}}, true, nil
}

// SetTreeOption stores a switch in the tree's registry entry, by
// compare-and-set so that concurrent DDL keeps its log.
func (f *Functions) SetTreeOption(ctx context.Context, tenant, tree, option string, on bool) (string, error) {
	if option != "autosplit" && option != "autoheal" {
		e := sqlstate.New(sqlstate.InvalidParameterValue, "unknown tree option %q", option)
		e.Hint = "The options are 'autosplit' (the hot-shard split monitor) and 'autoheal' (over-split healing), each true or false."
		return "", e
	}
	for {
		prev, err := f.store.Tree(ctx, tenant, tree)
		if errors.Is(err, shardmap.ErrNotFound) {
			return "", sqlstate.New(sqlstate.UndefinedTable, "tree %q does not exist", tree)
		}
		if err != nil {
			return "", err
		}
		next := *prev
		if option == "autosplit" {
			next.AutosplitOff = !on
		} else {
			next.AutohealOff = !on
		}
		err = f.store.SwapTree(ctx, &next, prev)
		if errors.Is(err, shardmap.ErrConflict) {
			continue
		}
		if err != nil {
			return "", err
		}
		state := "on"
		if !on {
			state = "off"
		}
		return fmt.Sprintf("%s of %s is %s", option, tree, state), nil
	}
}

// autonomicStatus is what t's split monitor and healing do and why, as
// the proxy holding t's lease last stored it.
func (f *Functions) autonomicStatus(ctx context.Context, t *shardmap.Tree) string {
	var st *shardmap.AutonomicStatus
	if s, ok := f.store.(shardmap.AutonomicStatuses); ok {
		var err error
		if st, err = s.Autonomic(ctx, t.Tenant, t.Name); err != nil {
			return "unknown: " + err.Error()
		}
	}
	if st != nil {
		return "monitor " + st.Monitor + "; healing " + st.Healer
	}
	switch {
	case t.Group != "":
		return "off: the trees of a colocation group are not split or healed autonomically"
	case t.AutosplitOff && t.AutohealOff:
		return fmt.Sprintf("off: lattice_set_tree_option('%s', 'autosplit' and 'autoheal', false)", t.Name)
	}
	return "not running: no proxy with --coordinator and --autosplit or --autoheal has passed over the tree"
}
