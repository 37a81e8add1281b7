// Package procs sizes GOMAXPROCS to the CPU the proxy uses. A relay's
// goroutines park and wake twice per statement; every wake finds an idle P
// and sends a second thread spinning through the scheduler and the poller
// to find no work, and back to sleep through futex. On 2 cores, one P
// instead of two took a fifth off the proxy's CPU per point select, kernel
// and user time alike, at the same throughput (docs/DESIGN.md, the request
// path). A fixed small GOMAXPROCS would cap a busy proxy on a large
// machine, so the Sizer starts at one P and doubles while the Ps in use are
// nearly always running, and gives back the ones a calm spell shows are
// not needed. $GOMAXPROCS, when set, fixes the count and turns it off.
package procs

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime"
	"time"
)

const (
	// growAt is the share of its Ps' time the process must use, for
	// growTicks intervals in a row, before the Ps double. The raw system
	// calls of the request path hold their P, so kernel time counts, and
	// a P used this much is queueing goroutines.
	growAt    = 0.85
	growTicks = 2
	// shrinkAt is the share of one P fewer under which the process must
	// stay, for shrinkTicks intervals in a row, before Ps are taken away.
	// It lies well under growAt: the second thread's spinning itself uses
	// CPU (a quarter more at two Ps in bench/proxy-cpu.sh), and the count
	// must not flap between two sizes on a steady load.
	shrinkAt    = 0.65
	shrinkTicks = 30
	// Interval is how often Run reads the process's CPU time.
	Interval = 100 * time.Millisecond
)

// Sizer decides the P count from the cores the process used in each
// interval. The zero value is not ready: use NewSizer.
type Sizer struct {
	max, n    int
	hot, cool int
	calmPeak  float64 // the most cores used in the calm intervals so far
}

// NewSizer returns a Sizer that starts at one P and never passes ceiling.
func NewSizer(ceiling int) *Sizer {
	return &Sizer{max: max(1, ceiling), n: 1}
}

// Procs is the P count the Sizer last decided.
func (s *Sizer) Procs() int { return s.n }

// Next takes the cores the process used over the last interval (its CPU
// time over the interval's length) and returns the P count for the next.
func (s *Sizer) Next(busy float64) int {
	n := float64(s.n)
	if busy >= growAt*n && s.n < s.max {
		s.cool, s.calmPeak = 0, 0
		if s.hot++; s.hot >= growTicks {
			s.hot, s.n = 0, min(s.max, 2*s.n)
		}
		return s.n
	}
	s.hot = 0
	if s.n == 1 || busy >= shrinkAt*(n-1) {
		s.cool, s.calmPeak = 0, 0
		return s.n
	}
	s.calmPeak = max(s.calmPeak, busy)
	if s.cool++; s.cool >= shrinkTicks {
		// The fewest Ps under whose grow line the calm spell's peak stays.
		s.n = min(s.n-1, int(math.Floor(s.calmPeak/growAt))+1)
		s.cool, s.calmPeak = 0, 0
	}
	return s.n
}

// Run sizes GOMAXPROCS every Interval until ctx ends, between one P and
// the count the runtime chose at start (the CPUs, or a container's CPU
// limit), unless $GOMAXPROCS fixes it or the platform cannot tell the
// process's CPU time.
func Run(ctx context.Context, log *slog.Logger) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	if _, ok := cpuTime(); !ok {
		return
	}
	s := NewSizer(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(s.Procs())
	go s.run(ctx, log)
}

func (s *Sizer) run(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(Interval)
	defer t.Stop()
	lastCPU, _ := cpuTime()
	lastAt := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cpu, _ := cpuTime()
			wall := now.Sub(lastAt)
			if wall <= 0 {
				continue
			}
			was := s.n
			busy := float64(cpu-lastCPU) / float64(wall)
			if n := s.Next(busy); n != was {
				runtime.GOMAXPROCS(n)
				log.Debug("GOMAXPROCS sized to the CPU used", "procs", n, "was", was, "cores_used", math.Round(busy*100)/100)
			}
			lastCPU, lastAt = cpu, now
		}
	}
}
