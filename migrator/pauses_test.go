package migrator

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// TestPausesHold: a hold waits for a pause on a node it names, only for
// that, and at most its limit; a pause entered after the limit counts.
func TestPausesHold(t *testing.T) {
	for _, tc := range []struct {
		name   string
		frozen []string // the freeze in flight
		hold   []string
		waits  bool
	}{
		{"same node", []string{"n1", "n2"}, []string{"n2"}, true},
		{"one node of two", []string{"n1"}, []string{"n3", "n1"}, true},
		{"other nodes", []string{"n1", "n2"}, []string{"n3"}, false},
		{"none in flight", nil, []string{"n1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p pauses
			ctx := context.Background()
			if tc.frozen != nil {
				leave, waited, err := p.enter(ctx, tc.frozen, time.Second)
				if err != nil || waited {
					t.Fatalf("first freeze: waited %v, %v", waited, err)
				}
				time.AfterFunc(100*time.Millisecond, leave)
			}
			start := time.Now()
			if err := p.hold(ctx, tc.hold, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if held := time.Since(start); tc.waits != (held >= 100*time.Millisecond) {
				t.Errorf("held %s; want a wait for the freeze: %v", held, tc.waits)
			}
		})
	}

	var p pauses
	ctx := context.Background()
	first, _, _ := p.enter(ctx, []string{"n1"}, time.Second)
	defer first()
	start := time.Now()
	if err := p.hold(ctx, []string{"n1"}, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if held := time.Since(start); held < 50*time.Millisecond || held > 5*time.Second {
		t.Errorf("a hold past its limit took %s, want about 50ms", held)
	}
	second, waited, err := p.enter(ctx, []string{"n1"}, 10*time.Millisecond)
	if err != nil || !waited {
		t.Fatalf("a freeze past its limit: waited %v, %v", waited, err)
	}
	first()
	first() // a second call changes nothing
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := p.hold(cctx, []string{"n1"}, 10*time.Second); err == nil {
		t.Fatal("the freeze entered past the limit did not count")
	}
	second()
	if _, waited, _ := p.enter(ctx, []string{"n1"}, time.Second); waited {
		t.Error("a freeze waited with none in flight")
	}
}

// TestStepsWaitForAPause: a migration's shadow copy, its freeze's
// preparation and its own pause wait while another pause of the process
// is in flight on one of its nodes.
func TestStepsWaitForAPause(t *testing.T) {
	for _, tc := range []struct {
		step string // the first call that must come after the other pause
		at   string // when the other pause starts: before the run, at a crash point, or as the snapshots open
	}{
		{"copy", ""},
		{"writelog", "drain"},
		{"fence", "opened"},
	} {
		t.Run(tc.step, func(t *testing.T) {
			r := newRig(t)
			r.opts.FreezeBudget = 10 * time.Second // no hold runs out
			mig := r.start(shardmap.Split)
			run := r.runner("")
			other := func() {
				leave, _, err := run.pauses.enter(r.ctx, []string{mig.SourceNode}, time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				time.AfterFunc(300*time.Millisecond, func() {
					r.nodes.mu.Lock()
					r.nodes.call("other pause ended")
					r.nodes.mu.Unlock()
					leave()
				})
			}
			switch tc.at {
			case "":
				other()
			case "opened":
				r.nodes.opened = other
			default:
				run.crash = func(p string) {
					if p == tc.at {
						other()
					}
				}
			}
			if _, err := r.run(run, mig); err != nil {
				t.Fatal(err)
			}
			r.checkMoved(mig)
			r.nodes.mu.Lock()
			defer r.nodes.mu.Unlock()
			ended := slices.Index(r.nodes.calls, "other pause ended")
			step := slices.IndexFunc(r.nodes.calls, func(c string) bool { return strings.HasPrefix(c, tc.step+" ") })
			if ended < 0 || step < ended {
				t.Errorf("%s did not wait for the other pause: calls %q", tc.step, r.nodes.calls)
			}
		})
	}
}
