package migrator

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the specification's reshard instruments (names with dots as
// underscores, docs/DESIGN.md section 8) and the migrator's own.
type Metrics struct {
	ReshardInitiated        *prometheus.CounterVec   // tree, tenant
	ReshardCompleted        *prometheus.CounterVec   // tree, tenant
	ReshardRejected         *prometheus.CounterVec   // tree, tenant, reason
	ReshardInFlight         *prometheus.HistogramVec // tree, tenant: 0 or 1 at every lattice_reshard call
	ConsolidationsCommitted *prometheus.CounterVec   // tree, tenant, shard (the retired donor)
	CoordinatorCompleted    *prometheus.CounterVec   // tree, tenant, kind
	RowsCopied              *prometheus.CounterVec   // tree, tenant
	BytesCopied             *prometheus.CounterVec   // tree, tenant: COPY data of shadow copies
	FreezeSeconds           *prometheus.HistogramVec // tree, tenant, outcome (flipped, rolled_back)
	MigrationsInFlight      *prometheus.GaugeVec     // tree, tenant
	ReplicationLagBytes     *prometheus.GaugeVec     // tree, tenant: the largest of the tree's migrations here, 0 when none
	Verifications           *prometheus.CounterVec   // tree, tenant, outcome (passed, failed, repaired)
	VerifySeconds           *prometheus.HistogramVec // tree, tenant: time of each move's comparison
	VerifyRows              *prometheus.CounterVec   // tree, tenant: rows compared
	resizeMetrics

	lagMu sync.Mutex
	lags  map[[2]string]map[string]int64 // tenant, tree -> migration id -> lag
}

// Reasons a reshard is rejected before a coordinator starts.
const (
	ReasonMin            = "argument_out_of_range_min"
	ReasonMax            = "argument_out_of_range_max"
	ReasonInProgress     = "already_in_progress"
	ReasonResizeInFlight = "resize_in_flight"
	ReasonStateWrite     = "state_write_failed"
)

// NewMetrics creates the instruments and registers them with reg (nil: not
// registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	tt := []string{"tree", "tenant"}
	m := &Metrics{
		ReshardInitiated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_shard_root_reshard_initiated_total", Help: "Reshards started (the empty-tree re-pin included).",
		}, tt),
		ReshardCompleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_shard_root_reshard_completed_total", Help: "Reshards finished (the empty-tree re-pin included).",
		}, tt),
		ReshardRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_shard_root_reshard_rejected_total", Help: "Reshard requests refused before a coordinator started.",
		}, []string{"tree", "tenant", "reason"}),
		ReshardInFlight: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lattice_shard_root_reshard_in_flight", Help: "1 if a reshard was running at a lattice_reshard call, else 0.",
			Buckets: []float64{0, 1},
		}, tt),
		ConsolidationsCommitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_shard_consolidations_committed_total", Help: "Folds committed, by retired donor shard.",
		}, []string{"tree", "tenant", "shard"}),
		CoordinatorCompleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_coordinator_completed_total", Help: "Coordinator runs completed, by kind.",
		}, []string{"tree", "tenant", "kind"}),
		RowsCopied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_migrator_rows_copied_total", Help: "Rows copied by shadow copies.",
		}, tt),
		BytesCopied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_migrator_bytes_copied_total", Help: "Bytes of binary COPY data moved by shadow copies.",
		}, tt),
		FreezeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lattice_migrator_freeze_seconds", Help: "Write pause of each freeze, from freeze to flip or roll-back.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 5},
		}, []string{"tree", "tenant", "outcome"}),
		MigrationsInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lattice_migrator_migrations_in_flight", Help: "Migrations this proxy is running.",
		}, tt),
		ReplicationLagBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "lattice_migrator_replication_lag_bytes", Help: "Source WAL not yet applied to the target: the largest of the tree's migrations this proxy runs, 0 when it runs none.",
		}, tt),
		Verifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_migrator_verifications_total", Help: "Verifications of moves before their release, by outcome: passed, failed (verify_failed), repaired.",
		}, []string{"tree", "tenant", "outcome"}),
		VerifySeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lattice_migrator_verify_seconds", Help: "Time of each move's comparison of source and target, after the flip.",
			Buckets: []float64{.01, .05, .1, .5, 1, 5, 10, 30, 60, 300},
		}, tt),
		VerifyRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_migrator_verify_rows_total", Help: "Rows compared by the verifications of moves.",
		}, tt),
		lags: map[[2]string]map[string]int64{},
	}
	m.resizeMetrics = newResizeMetrics(reg)
	if reg != nil {
		reg.MustRegister(m.ReshardInitiated, m.ReshardCompleted, m.ReshardRejected, m.ReshardInFlight,
			m.ConsolidationsCommitted, m.CoordinatorCompleted, m.RowsCopied, m.BytesCopied, m.FreezeSeconds,
			m.MigrationsInFlight, m.ReplicationLagBytes, m.Verifications, m.VerifySeconds, m.VerifyRows)
	}
	return m
}

// setLag records the replication lag of migration id of a tree and shows
// the tree's largest; a negative lag forgets the migration (it is done).
// Per tree rather than per migration, so that the series outlives the
// migrations and a dashboard keeps one line per tree.
func (m *Metrics) setLag(tenant, tree, id string, lag int64) {
	m.lagMu.Lock()
	defer m.lagMu.Unlock()
	k := [2]string{tenant, tree}
	by := m.lags[k]
	if by == nil {
		by = map[string]int64{}
		m.lags[k] = by
	}
	if lag < 0 {
		delete(by, id)
	} else {
		by[id] = lag
	}
	var most int64
	for _, l := range by {
		most = max(most, l)
	}
	if len(by) == 0 {
		delete(m.lags, k)
	}
	m.ReplicationLagBytes.WithLabelValues(tree, tenant).Set(float64(most))
}
