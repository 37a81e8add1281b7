package migrator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

var snapshotSignatures = map[string][]pgproto3.FieldDescription{
	"lattice_snapshot":          {field("lattice_snapshot", pgtype.TextOID)},
	"lattice_snapshot_complete": {field("lattice_snapshot_complete", pgtype.BoolOID)},
	"lattice_snapshot_status": {
		field("tree", pgtype.TextOID), field("new_tree", pgtype.TextOID), field("phase", pgtype.TextOID),
		field("rows_done", pgtype.Int8OID), field("rows_total", pgtype.Int8OID),
		field("elapsed_seconds", pgtype.Float8OID), field("eta_seconds", pgtype.Float8OID),
		field("pause_ms", pgtype.Float8OID), field("pauses", pgtype.Int4OID),
	},
}

var snapshotArgNames = map[string][]string{
	"lattice_snapshot":          {"tree", "new_tree"},
	"lattice_snapshot_complete": {"new_tree"},
	"lattice_snapshot_status":   {"tree"},
}

func init() {
	maps.Copy(signatures, snapshotSignatures)
	maps.Copy(argNames, snapshotArgNames)
}

// SetSnapshotter lets the functions start snapshots, and registers s as
// the handler of snapshot operations on the runner SetTreeOps gave.
func (f *Functions) SetSnapshotter(s *Snapshotter) {
	f.snaps = s
	f.ops.Handle(shardmap.OpSnapshot, s.Run)
}

// callSnapshot runs the functions of this file; ok is false for any other name.
func (f *Functions) callSnapshot(ctx context.Context, tenant, name string, args []*string, named map[string]*string) (rows [][]any, ok bool, err error) {
	params, ok := snapshotArgNames[name]
	if !ok {
		return nil, false, nil
	}
	a, err := bindArgs(name, args, named, params...)
	if err != nil {
		return nil, true, err
	}
	switch name {
	case "lattice_snapshot":
		var msg string
		msg, err = f.snapshot(ctx, tenant, a)
		rows = [][]any{{msg}}
	case "lattice_snapshot_complete":
		var done bool
		done, err = f.snapshotComplete(ctx, tenant, a)
		rows = [][]any{{done}}
	case "lattice_snapshot_status":
		rows, err = f.snapshotStatus(ctx, tenant, a)
	}
	if err != nil {
		return nil, true, err
	}
	return rows, true, nil
}

// snapshot is lattice_snapshot: it checks the names and records the
// operation; a coordinator carries it out.
func (f *Functions) snapshot(ctx context.Context, tenant string, a map[string]*string) (string, error) {
	t, err := f.lookupTree(ctx, tenant, a)
	if err != nil {
		return "", err
	}
	name, err := required(a, "new_tree")
	if err != nil {
		return "", err
	}
	name = foldName(name)
	if name == t.Name {
		return "", sqlstate.New(sqlstate.DuplicateTable, "relation %q already exists", name)
	}
	if len(name) > 63 {
		return "", sqlstate.New(sqlstate.InvalidParameterValue, "new tree name %q is longer than 63 bytes", name)
	}
	if _, err := f.store.Tree(ctx, tenant, name); err == nil {
		return "", sqlstate.New(sqlstate.DuplicateTable, "relation %q is already a tree", name)
	} else if !errors.Is(err, shardmap.ErrNotFound) {
		return "", err
	}
	if exists, err := f.cluster.TableExists(ctx, tenant, name); err != nil {
		return "", err
	} else if exists {
		e := sqlstate.New(sqlstate.DuplicateTable, "relation %q already exists", name)
		e.Hint = "Choose another name for the snapshot, or drop the table."
		return "", e
	}
	if f.snaps == nil {
		return "", sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "this proxy cannot take snapshots")
	}
	op := &shardmap.TreeOp{Tenant: tenant, Kind: shardmap.OpSnapshot, Tree: t.Name, Map: t.MapName(), Target: name}
	other, err := f.ops.Start(ctx, op)
	if err != nil {
		return "", err
	}
	if other != nil {
		e := sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "a %s of %s%s is running", other.Kind, other.Tree, targetText(other))
		e.Hint = "Wait for it: lattice_snapshot_status shows its progress."
		return "", e
	}
	f.snaps.metrics.Initiated.WithLabelValues(t.Name, tenant).Inc()
	return fmt.Sprintf("snapshot of %s into %s started (operation %s)", t.Name, name, op.ID), nil
}

func targetText(op *shardmap.TreeOp) string {
	if op.Target == "" {
		return ""
	}
	return " into " + op.Target
}

// runningSnapshots are the snapshot operations touching tree.
func (f *Functions) runningSnapshots(ctx context.Context, tenant, tree string) ([]*shardmap.TreeOp, error) {
	ops, err := f.store.TreeOps(ctx, tenant, tree)
	if err != nil {
		return nil, err
	}
	var out []*shardmap.TreeOp
	for _, op := range ops {
		if op.Kind == shardmap.OpSnapshot {
			out = append(out, op)
		}
	}
	return out, nil
}

// snapshotComplete is lattice_snapshot_complete: true once the new tree is
// registered and no snapshot into it runs.
func (f *Functions) snapshotComplete(ctx context.Context, tenant string, a map[string]*string) (bool, error) {
	name, err := required(a, "new_tree")
	if err != nil {
		return false, err
	}
	name = foldName(name)
	ops, err := f.runningSnapshots(ctx, tenant, name)
	if err != nil {
		return false, err
	}
	for _, op := range ops {
		if op.Target == name {
			return false, nil
		}
	}
	if _, err := f.store.Tree(ctx, tenant, name); errors.Is(err, shardmap.ErrNotFound) {
		e := sqlstate.New(sqlstate.UndefinedTable, "tree %q does not exist and no snapshot makes it", name)
		e.Hint = "lattice_snapshot(tree, new_tree) makes one."
		return false, e
	} else if err != nil {
		return false, err
	}
	// The caller's next statement routes the new tree, as after
	// lattice_create_tree; the other proxies read it within a second.
	if f.cache != nil {
		if _, err := f.cache.Refresh(ctx, tenant); err != nil {
			return false, err
		}
	}
	return true, nil
}

// snapshotStatus is lattice_snapshot_status: a row per snapshot of the
// tree or into it, or one idle row.
func (f *Functions) snapshotStatus(ctx context.Context, tenant string, a map[string]*string) ([][]any, error) {
	name, err := required(a, "tree")
	if err != nil {
		return nil, err
	}
	name = foldName(name)
	ops, err := f.runningSnapshots(ctx, tenant, name)
	if err != nil {
		return nil, err
	}
	if len(ops) == 0 {
		if _, err := f.lookupTree(ctx, tenant, a); err != nil {
			return nil, err
		}
		return [][]any{{name, nil, "idle", int64(0), int64(0), float64(0), float64(0), nil, int32(0)}}, nil
	}
	var rows [][]any
	for _, op := range ops {
		st, err := decodeSnapshotState(op)
		if err != nil {
			return nil, err
		}
		now := time.Now()
		var eta, pause any // NULL until there is something to tell
		if e := snapshotETA(op, now); e != nil {
			eta = *e
		}
		if st.Map != nil {
			pause = st.PauseSeconds * 1000
		}
		rows = append(rows, []any{op.Tree, op.Target, op.Phase, op.RowsDone, op.RowsTotal, now.Sub(op.Started).Seconds(), eta, pause, int32(st.Pauses)})
	}
	return rows, nil
}

// snapshotETA extrapolates the seconds a snapshot has left from the rows
// its copy did: nil before the copy copied a row, 0 once only the
// registration is left.
func snapshotETA(op *shardmap.TreeOp, now time.Time) *float64 {
	var eta float64
	switch {
	case op.Phase == SnapshotRegister:
	case op.Phase == SnapshotCopy && op.RowsDone > 0:
		eta = now.Sub(op.Started).Seconds() / float64(op.RowsDone) * float64(max(op.RowsTotal-op.RowsDone, 0))
	default:
		return nil
	}
	return &eta
}
