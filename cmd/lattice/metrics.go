package main

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lattice-db/lattice/admin"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/proxy"
	"github.com/lattice-db/lattice/shardmap"
)

// registerProxyMetrics exports the proxy's client count and pool use; they
// are read at scrape time, so the request path does no metric work for them.
func registerProxyMetrics(adm *admin.Server, srv *proxy.Server, pools *pgshard.Pools, reg *shardmap.Registration) {
	adm.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lattice_proxy_client_connections",
		Help: "Client connections open now.",
	}, func() float64 { return float64(srv.Clients()) }))
	adm.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lattice_proxy_pinned_sessions",
		Help: "Sessions pinned now to a catalog-node backend by session state the proxy cannot replay (--max-pinned bounds them).",
	}, func() float64 { return float64(srv.Pinned()) }))
	adm.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lattice_proxy_serving_cached",
		Help: "1 while the proxy's registration in Redis has lapsed and it serves from its cached maps (reshards wait for it).",
	}, func() float64 {
		if reg.Cached() {
			return 1
		}
		return 0
	}))
	adm.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lattice_proxy_procs",
		Help: "GOMAXPROCS now: sized to the CPU the proxy uses, unless $GOMAXPROCS fixes it.",
	}, func() float64 { return float64(runtime.GOMAXPROCS(0)) }))
	adm.Registry.MustRegister(poolCollector{pools})
}

type poolCollector struct{ pools *pgshard.Pools }

var (
	poolInUse = prometheus.NewDesc("lattice_pool_backends_in_use", "Backend connections lent to sessions.", []string{"node", "tenant"}, nil)
	poolIdle  = prometheus.NewDesc("lattice_pool_backends_idle", "Idle backend connections.", []string{"node", "tenant"}, nil)
	poolHeld  = prometheus.NewDesc("lattice_pool_backends_held", "Backend connections held by listening sessions (LISTEN), within those in use.", []string{"node", "tenant"}, nil)
	poolWait  = prometheus.NewDesc("lattice_pool_backends_waiting", "Statements waiting now for a free backend.", []string{"node", "tenant"}, nil)
	poolWaits = prometheus.NewDesc("lattice_pool_acquire_waits_total", "Acquires that had to wait for a free backend.", []string{"node", "tenant"}, nil)
	poolErrs  = prometheus.NewDesc("lattice_pool_acquire_errors_total", "Acquires that failed.", []string{"node", "tenant"}, nil)
)

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolInUse
	ch <- poolIdle
	ch <- poolHeld
	ch <- poolWait
	ch <- poolWaits
	ch <- poolErrs
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.pools.Stats() {
		ch <- prometheus.MustNewConstMetric(poolInUse, prometheus.GaugeValue, float64(s.InUse), s.Node, s.Tenant)
		ch <- prometheus.MustNewConstMetric(poolIdle, prometheus.GaugeValue, float64(s.Idle), s.Node, s.Tenant)
		ch <- prometheus.MustNewConstMetric(poolHeld, prometheus.GaugeValue, float64(s.Held), s.Node, s.Tenant)
		ch <- prometheus.MustNewConstMetric(poolWait, prometheus.GaugeValue, float64(s.Waiting), s.Node, s.Tenant)
		ch <- prometheus.MustNewConstMetric(poolWaits, prometheus.CounterValue, float64(s.AcquireWaits), s.Node, s.Tenant)
		ch <- prometheus.MustNewConstMetric(poolErrs, prometheus.CounterValue, float64(s.AcquireErrors), s.Node, s.Tenant)
	}
}
