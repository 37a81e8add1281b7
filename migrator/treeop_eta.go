package migrator

import (
	"context"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// TreeOpETA is the seconds a running tree operation has left at now, as its
// kind's status function (lattice_snapshot_status, lattice_merge_status,
// lattice_resize_status) reports them; nil while there is nothing to
// extrapolate from. The admin API shows it beside each operation, so that
// the page and the SQL functions tell one estimate.
func (f *Functions) TreeOpETA(ctx context.Context, op *shardmap.TreeOp, now time.Time) (*float64, error) {
	switch op.Kind {
	case shardmap.OpSnapshot:
		return snapshotETA(op, now), nil
	case shardmap.OpMerge:
		return mergeETA(op, mergeStateOf(op), now), nil
	case shardmap.OpResize:
		s, err := f.resizeStatusOfOp(ctx, op, now)
		return s.ETASeconds, err
	}
	return nil, nil // a kind of another build: no estimate
}
