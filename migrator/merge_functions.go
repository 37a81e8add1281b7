package migrator

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

var mergeSignatures = map[string][]pgproto3.FieldDescription{
	"lattice_merge":          {field("lattice_merge", pgtype.TextOID)},
	"lattice_merge_complete": {field("lattice_merge_complete", pgtype.BoolOID)},
	"lattice_merge_status": {
		field("merge", pgtype.TextOID), field("source_tree", pgtype.TextOID), field("phase", pgtype.TextOID),
		field("on_conflict", pgtype.TextOID), field("shards_done", pgtype.Int4OID), field("shards_total", pgtype.Int4OID),
		field("rows_merged", pgtype.Int8OID), field("redrains", pgtype.Int4OID), field("elapsed_seconds", pgtype.Float8OID),
		field("eta_seconds", pgtype.Float8OID), field("last_error", pgtype.TextOID),
	},
}

var mergeArgNames = map[string][]string{
	"lattice_merge":          {"source_tree", "target_tree", "on_conflict"},
	"lattice_merge_complete": {"target_tree"},
	"lattice_merge_status":   {"target_tree"},
}

func init() {
	maps.Copy(signatures, mergeSignatures)
	maps.Copy(argNames, mergeArgNames)
}

// SetMerger wires lattice_merge and its status functions to m.
func (f *Functions) SetMerger(m *Merger) { f.merger = m }

// callMerge runs the functions of this file; ok is false for any other name.
func (f *Functions) callMerge(ctx context.Context, tenant, name string, args []*string, named map[string]*string) (rows [][]any, ok bool, err error) {
	params, ok := mergeArgNames[name]
	if !ok {
		return nil, false, nil
	}
	if f.merger == nil {
		return nil, true, sqlstate.New(sqlstate.FeatureNotSupported, "%s is not available in this process", name).
			WithHint("Call it through a proxy (lattice serve).")
	}
	a, err := bindArgs(name, args, named, params...)
	if err != nil {
		return nil, true, err
	}
	switch name {
	case "lattice_merge":
		src, err := required(a, "source_tree")
		if err != nil {
			return nil, true, err
		}
		dst, err := required(a, "target_tree")
		if err != nil {
			return nil, true, err
		}
		rule := MergeSourceWins
		if v := a["on_conflict"]; v != nil {
			rule = strings.TrimSpace(*v)
			if rule != MergeSourceWins && rule != MergeTargetWins {
				rule = foldName(rule)
			}
		}
		id, err := f.merger.Start(ctx, tenant, foldName(src), foldName(dst), rule)
		if err != nil {
			return nil, true, err
		}
		return [][]any{{id}}, true, nil
	case "lattice_merge_complete":
		dst, err := required(a, "target_tree")
		if err != nil {
			return nil, true, err
		}
		done, err := f.merger.Complete(ctx, tenant, foldName(dst))
		if err != nil {
			return nil, true, err
		}
		return [][]any{{done}}, true, nil
	}
	dst, err := required(a, "target_tree")
	if err != nil {
		return nil, true, err
	}
	rows, err = f.merger.Status(ctx, tenant, foldName(dst))
	return rows, true, err
}

// Status is lattice_merge_status(target): a row per running merge into
// target; one idle row when none runs, as lattice_reshard_status and
// lattice_snapshot_status have.
func (mg *Merger) Status(ctx context.Context, tenant, target string) ([][]any, error) {
	if _, err := mg.tree(ctx, tenant, target); err != nil {
		return nil, err
	}
	ops, err := mg.merges(ctx, tenant, target)
	if err != nil {
		return nil, err
	}
	if len(ops) == 0 {
		return [][]any{{nil, nil, "idle", nil, int32(0), int32(0), int64(0), int32(0), float64(0), float64(0), nil}}, nil
	}
	var rows [][]any
	for _, op := range ops {
		st := mergeStateOf(op)
		var lastErr any
		if op.LastError != "" {
			lastErr = op.LastError
		}
		var eta any // NULL until a shard of the pass is drained
		if e := mergeETA(op, st, time.Now()); e != nil {
			eta = *e
		}
		rows = append(rows, []any{op.ID, op.Tree, op.Phase, st.OnConflict, int32(len(st.Done)), int32(len(st.Sources)),
			op.RowsDone, int32(st.Redrains), time.Since(op.Started).Seconds(), eta, lastErr})
	}
	return rows, nil
}

// mergeStateOf is op's merge state; a record of another build that does
// not decode shows its common fields only.
func mergeStateOf(op *shardmap.TreeOp) MergeState {
	var st MergeState
	_ = json.Unmarshal(op.State, &st)
	return st
}

// mergeETA extrapolates the seconds a merge has left from the source
// shards its pass drained, as lattice_reshard_status does from shards; nil
// until one is. A re-drain starts a new pass, so the ETA is NULL again
// until the new pass drains a shard. A failed merge has none.
func mergeETA(op *shardmap.TreeOp, st MergeState, now time.Time) *float64 {
	done, total := len(st.Done), len(st.Sources)
	if done == 0 || total == 0 || op.Phase == shardmap.OpFailed {
		return nil
	}
	eta := now.Sub(op.Started).Seconds() * float64(max(total-done, 0)) / float64(done)
	return &eta
}
