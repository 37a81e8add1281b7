package migrator

import "github.com/prometheus/client_golang/prometheus"

// SnapshotMetrics are lattice_snapshot's instruments, tagged tree (the
// source) and tenant.
type SnapshotMetrics struct {
	Initiated    *prometheus.CounterVec   // snapshots recorded by lattice_snapshot
	Completed    *prometheus.CounterVec   // snapshots registered as trees
	Seconds      *prometheus.HistogramVec // from lattice_snapshot to completion
	PauseSeconds *prometheus.HistogramVec // outcome: held, rolled_back
	Rows         *prometheus.CounterVec   // rows copied
}

// NewSnapshotMetrics creates the instruments and registers them with reg
// (nil: not registered).
func NewSnapshotMetrics(reg prometheus.Registerer) *SnapshotMetrics {
	tt := []string{"tree", "tenant"}
	m := &SnapshotMetrics{
		Initiated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_snapshot_initiated_total", Help: "Snapshots started by lattice_snapshot.",
		}, tt),
		Completed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_snapshot_completed_total", Help: "Snapshots completed: the new tree registered.",
		}, tt),
		Seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lattice_snapshot_duration_seconds", Help: "Time of each snapshot, from lattice_snapshot to the new tree's registration.",
			Buckets: []float64{.1, .5, 1, 5, 10, 30, 60, 300, 1800},
		}, tt),
		PauseSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lattice_snapshot_pause_seconds", Help: "Write pause of each snapshot's freeze, from the frozen map to the thaw, by outcome (held, rolled_back).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 5},
		}, []string{"tree", "tenant", "outcome"}),
		Rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lattice_snapshot_rows_copied_total", Help: "Rows copied by snapshots.",
		}, tt),
	}
	if reg != nil {
		reg.MustRegister(m.Initiated, m.Completed, m.Seconds, m.PauseSeconds, m.Rows)
	}
	return m
}
