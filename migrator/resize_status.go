package migrator

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/shardmap"
)

// lattice_resize_status(tree) reports a resize as lattice_reshard_status
// reports a reshard: one row, phase idle when none runs, the progress in
// shards (rewritten of those to rewrite) and an ETA extrapolated from it,
// NULL until a shard is done.

var resizeStatusSignature = []pgproto3.FieldDescription{
	field("tree", pgtype.TextOID), field("phase", pgtype.TextOID), field("layout", pgtype.TextOID),
	field("shards_done", pgtype.Int4OID), field("shards_total", pgtype.Int4OID),
	field("migrations_in_flight", pgtype.Int4OID), field("rows_copied", pgtype.Int8OID), field("rows_total", pgtype.Int8OID),
	field("lag_bytes", pgtype.Int8OID), field("elapsed_seconds", pgtype.Float8OID), field("eta_seconds", pgtype.Float8OID),
	field("last_error", pgtype.TextOID),
}

// ResizeStatus is a resize as lattice_resize_status reports it.
type ResizeStatus struct {
	Tree   string // the tree lattice_resize was called on
	Phase  string // "idle" when none runs
	Layout string
	// ShardsDone of ShardsTotal are rewritten: the shards recorded to
	// rewrite, less those still below the high-water mark and those in a
	// resize migration now.
	ShardsDone, ShardsTotal int
	MigrationsInFlight      int
	RowsCopied, RowsTotal   int64
	LagBytes                int64
	Elapsed                 time.Duration
	// ETASeconds is extrapolated from the shards done; nil until one is.
	ETASeconds *float64
	LastError  string
}

// resizeStatusOf computes op's status from its record, the map now and the
// map's migrations.
func resizeStatusOf(op *shardmap.TreeOp, st resizeState, m *shardmap.Map, migs []*shardmap.Migration, now time.Time) ResizeStatus {
	out := ResizeStatus{Tree: op.Tree, Phase: op.Phase, Layout: st.Layout.String(), ShardsTotal: st.Shards,
		RowsCopied: op.RowsDone, RowsTotal: op.RowsTotal, Elapsed: now.Sub(op.Started), LastError: op.LastError}
	if op.Phase != resizeRewrite {
		return out // the layout is being recorded: nothing to count yet
	}
	var resizing []*shardmap.Migration
	for _, mig := range inFlight(migs) {
		if mig.Kind == shardmap.Resize {
			resizing = append(resizing, mig)
			out.LagBytes += mig.LagBytes
		}
	}
	out.MigrationsInFlight = len(resizing)
	left := len(toRewrite(m, st.HighWater, resizing)) + len(resizing)
	// A member that joined, or a re-pin, can change the count under the
	// record: the total is never below what is done and left.
	out.ShardsTotal = max(st.Shards, left)
	out.ShardsDone = out.ShardsTotal - left
	if out.ShardsDone > 0 {
		eta := out.Elapsed.Seconds() * float64(left) / float64(out.ShardsDone)
		out.ETASeconds = &eta
	}
	return out
}

// ResizeStatus reports the resize of t's map (t's own, or one of its
// colocation group called on another member); Phase idle when none runs.
func (f *Functions) ResizeStatus(ctx context.Context, t *shardmap.Tree) (ResizeStatus, error) {
	ops, err := f.resizesOf(ctx, t)
	if err != nil || len(ops) == 0 {
		return ResizeStatus{Tree: t.Name, Phase: "idle"}, err
	}
	return f.resizeStatusOfOp(ctx, ops[0], time.Now()) // StartTreeOp records one resize per map
}

// resizeStatusOfOp reads what the status of resize op is computed from:
// its record, and the map it rewrites with that map's migrations.
func (f *Functions) resizeStatusOfOp(ctx context.Context, op *shardmap.TreeOp, now time.Time) (ResizeStatus, error) {
	st, err := resizeStateOf(op)
	if err != nil {
		return ResizeStatus{}, err
	}
	m, err := f.store.Map(ctx, op.Tenant, op.TreeMap())
	if err != nil {
		return ResizeStatus{}, err
	}
	migs, err := f.store.Migrations(ctx, op.Tenant, op.TreeMap())
	if err != nil {
		return ResizeStatus{}, err
	}
	return resizeStatusOf(op, st, m, migs, now), nil
}

// resizeStatus is lattice_resize_status.
func (f *Functions) resizeStatus(ctx context.Context, tenant string, a map[string]*string) ([][]any, error) {
	t, err := f.lookupTree(ctx, tenant, a)
	if err != nil {
		return nil, err
	}
	s, err := f.ResizeStatus(ctx, t)
	if err != nil {
		return nil, err
	}
	var layout, eta, lastErr any // NULL when there is nothing to tell
	switch {
	case s.Phase == "idle":
		eta = float64(0)
	case s.ETASeconds != nil:
		eta = *s.ETASeconds
	}
	if s.Phase != "idle" {
		layout = s.Layout
	}
	if s.LastError != "" {
		lastErr = s.LastError
	}
	return [][]any{{s.Tree, s.Phase, layout, int32(s.ShardsDone), int32(s.ShardsTotal), int32(s.MigrationsInFlight),
		s.RowsCopied, s.RowsTotal, s.LagBytes, s.Elapsed.Seconds(), eta, lastErr}}, nil
}
