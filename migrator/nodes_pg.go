package migrator

import (
	"context"
	"log/slog"

	"github.com/jackc/pglogrepl"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// clusterNodes is Nodes on the real cluster.
type clusterNodes struct {
	*pgshard.Cluster
	copyWorkers int // ShadowSpec.Workers
}

var _ Nodes = clusterNodes{}

func (c clusterNodes) WALPosition(ctx context.Context, node, tenant string) (pglogrepl.LSN, error) {
	p, err := c.Admin(ctx, node, tenant)
	if err != nil {
		return 0, err
	}
	var s string
	if err := p.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(s)
}

func (c clusterNodes) Notify(ctx context.Context, tenant, payload string) error {
	p, err := c.Admin(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return err
	}
	_, err = p.Exec(ctx, "SELECT pg_notify($1, $2)", EventsChannel, payload)
	return err
}

func (c clusterNodes) shadowSpec(ts []*shardmap.Tree, mig *shardmap.Migration) (ShadowSpec, error) {
	t := ts[0]
	src, err := c.TenantDSN(mig.SourceNode, t.Tenant)
	if err != nil {
		return ShadowSpec{}, err
	}
	dst, err := c.TenantDSN(mig.TargetNode, t.Tenant)
	if err != nil {
		return ShadowSpec{}, err
	}
	// The stream's writes are the migrator's: the target's write log
	// leaves them out.
	if dst, err = withMigratorSetting(dst); err != nil {
		return ShadowSpec{}, err
	}
	spec := ShadowSpec{ID: mig.ID, Tree: t, SourceDSN: src, TargetDSN: dst, Source: mig.Source, Target: mig.Target, Slots: mig.Slots,
		Whole: mig.Kind == shardmap.Move || mig.Kind == shardmap.Resize, Reindex: mig.Kind == shardmap.Resize, Workers: c.copyWorkers,
		Fresh: mig.Kind != shardmap.Fold}
	if len(ts) > 1 {
		spec.Members = ts
	}
	spec.borrowSource = func(ctx context.Context) (borrowed, error) { return c.borrow(ctx, mig.SourceNode, t.Tenant) }
	spec.borrowTarget = func(ctx context.Context) (borrowed, error) { return c.borrow(ctx, mig.TargetNode, t.Tenant) }
	return spec, nil
}

func (c clusterNodes) StartShadow(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration, log *slog.Logger) (Stream, error) {
	spec, err := c.shadowSpec(ts, mig)
	if err != nil {
		return nil, err
	}
	sh, err := StartShadow(ctx, spec, log)
	if err != nil {
		return nil, err // not a typed nil: the pipeline tests the Stream for nil
	}
	return sh, nil
}

func (c clusterNodes) DropShadow(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration) error {
	spec, err := c.shadowSpec(ts, mig)
	if err != nil {
		return err
	}
	return DropShadow(ctx, spec) // on spare connections
}
