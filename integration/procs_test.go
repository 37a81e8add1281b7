package integration

import (
	"runtime"
	"testing"
	"time"
)

// TestProcsSized checks that the proxy sizes GOMAXPROCS to its load (the
// procs package decides how; its unit tests hold the decisions): an idle
// proxy settles on one P, and $GOMAXPROCS fixes the count.
func TestProcsSized(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("one CPU: a sized and an unsized proxy both run on one P")
	}
	idle := startProxy(t, 1)
	// A start busy enough to grow gives the Ps back after a calm 3 s.
	deadline := time.Now().Add(30 * time.Second)
	for got := metricSum(t, idle, "lattice_proxy_procs", nil); got != 1; got = metricSum(t, idle, "lattice_proxy_procs", nil) {
		if time.Now().After(deadline) {
			t.Fatalf("an idle proxy runs on %v Ps after 30 s, want 1", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	fixed := startProxyEnv(t, 1, []string{"GOMAXPROCS=2"})
	time.Sleep(time.Second) // ten of the sizer's intervals, were it running
	if got := metricSum(t, fixed, "lattice_proxy_procs", nil); got != 2 {
		t.Fatalf("a proxy started with GOMAXPROCS=2 runs on %v Ps", got)
	}
}
