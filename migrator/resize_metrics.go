package migrator

import "github.com/prometheus/client_golang/prometheus"

// resizeMetrics are lattice_resize's instruments, tagged with tree and
// tenant as the reshard's are.
type resizeMetrics struct {
	ResizeStarted   *prometheus.CounterVec   // tree, tenant
	ResizeCompleted *prometheus.CounterVec   // tree, tenant
	ResizeSeconds   *prometheus.HistogramVec // tree, tenant: from lattice_resize to the last shard released
	// ResizeShards counts shards by outcome: resized (rewritten into a
	// new table), abandoned (a fold retired the shard under the resize).
	ResizeShards *prometheus.CounterVec // tree, tenant, outcome
	// RoutingOnlyFolds counts folds whose donor refused retirement and
	// kept its storage, by reason (resize_in_flight).
	RoutingOnlyFolds *prometheus.CounterVec // tree, tenant, reason
}

func newResizeMetrics(reg prometheus.Registerer) resizeMetrics {
	tt := []string{"tree", "tenant"}
	m := resizeMetrics{
		ResizeStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_resize_started_total", Help: "Resizes started by lattice_resize.",
		}, tt),
		ResizeCompleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_resize_completed_total", Help: "Resizes that rewrote every shard of their tree.",
		}, tt),
		ResizeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lattice_resize_seconds", Help: "Duration of each resize, from lattice_resize to its completion.",
			Buckets: []float64{1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600},
		}, tt),
		ResizeShards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_resize_shards_total", Help: "Shards a resize finished, by outcome: resized, or abandoned (a fold retired the shard first).",
		}, []string{"tree", "tenant", "outcome"}),
		RoutingOnlyFolds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_fold_routing_only_total", Help: "Folds that completed routing-only: the donor refused retirement and kept its storage, by reason.",
		}, []string{"tree", "tenant", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.ResizeStarted, m.ResizeCompleted, m.ResizeSeconds, m.ResizeShards, m.RoutingOnlyFolds)
	}
	return m
}
