package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/lattice-db/lattice/admin"
	"github.com/lattice-db/lattice/migrator"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// version is the build's version, set with -ldflags "-X main.version=...".
var version = "dev"

// Size estimates are cached this long, and one read of them may take this
// long, so that the page's polling does not hammer the nodes.
const (
	sizeCacheTTL     = 5 * time.Second
	sizeFetchTimeout = 2 * time.Second
)

// newAdminAPI wires the admin API to the proxy's parts.
func newAdminAPI(cfg serveConfig, id string, store *shardmap.RedisStore, cache *shardmap.Cache, reg *shardmap.Registration,
	cluster *pgshard.Cluster, fns *migrator.Functions, log *slog.Logger) *admin.API {
	sizes := func(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (map[int]admin.ShardSize, error) {
		s, err := cluster.ShardSizes(ctx, t, m)
		if err != nil {
			return nil, err
		}
		out := make(map[int]admin.ShardSize, len(s))
		for i, x := range s {
			out[i] = admin.ShardSize{Rows: x.Rows, Bytes: x.Bytes}
		}
		return out, nil
	}
	return &admin.API{
		Catalog:   store,
		Resharder: adminResharder{fns},
		Self:      &adminSelf{id: id, coordinator: cfg.Coordinator, store: store, cache: cache, reg: reg, cluster: cluster},
		Sizes:     admin.NewSizeCache(sizes, sizeCacheTTL, sizeFetchTimeout, log),
		Log:       log,
		Load:      store,
		ETA:       fns,
	}
}

// adminResharder serves the API's reshards with the SQL functions' code.
type adminResharder struct{ f *migrator.Functions }

func (r adminResharder) Reshard(ctx context.Context, tenant, tree string, n int) (string, error) {
	return r.f.Reshard(ctx, tenant, tree, n)
}

func (r adminResharder) Status(ctx context.Context, tenant, tree string) (admin.ReshardStatus, error) {
	st, err := r.f.ReshardStatus(ctx, tenant, tree)
	if err != nil {
		return admin.ReshardStatus{}, err
	}
	return toAdminStatus(st), nil
}

func (r adminResharder) Running(ctx context.Context) ([]admin.ReshardStatus, error) {
	rs, err := r.f.Reshards(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]admin.ReshardStatus, len(rs))
	for i, st := range rs {
		out[i] = toAdminStatus(st)
	}
	return out, nil
}

func toAdminStatus(st *migrator.ReshardStatus) admin.ReshardStatus {
	out := admin.ReshardStatus{Tenant: st.Tenant, Tree: st.Tree, Phase: st.Phase, From: st.From, Target: st.Target,
		Shards: st.Shards, MigrationsInFlight: st.MigrationsInFlight, RowsCopied: st.RowsCopied, LagBytes: st.LagBytes,
		ETASeconds: st.ETASeconds, VerifyFailed: st.VerifyFailed, VerifyFailedSlots: st.VerifyFailedSlots}
	if !st.Started.IsZero() {
		out.StartedAt = &st.Started
	}
	return out
}

// adminSelf describes this proxy to the API.
type adminSelf struct {
	id          string
	coordinator bool
	store       *shardmap.RedisStore
	cache       *shardmap.Cache
	reg         *shardmap.Registration
	cluster     *pgshard.Cluster
}

func (s *adminSelf) Info() admin.ProxyInfo {
	return admin.ProxyInfo{ID: s.id, Version: version, Coordinator: s.coordinator, Live: s.reg.Live(), ServingCached: s.reg.Cached()}
}

func (s *adminSelf) DefaultTenant() string { return s.cluster.DefaultTenant() }

func (s *adminSelf) Tenants() []string { return s.cache.Tenants() }

func (s *adminSelf) CachedEpoch(tenant, tree string) (uint64, bool) {
	return s.cache.CachedEpoch(tenant, tree)
}

func (s *adminSelf) Proxies(ctx context.Context) ([]admin.ProxyLease, error) {
	ls, err := s.store.ProxyLeases(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]admin.ProxyLease, len(ls))
	for i, l := range ls {
		out[i] = admin.ProxyLease{ID: l.ID, LeaseExpires: l.Expires}
	}
	return out, nil
}
