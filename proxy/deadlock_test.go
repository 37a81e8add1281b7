package proxy

import (
	"testing"
	"time"
)

// TestWaitGraphCycles finds the cycles the detector breaks: those whose
// waits lie on several nodes, through backends of no session of this
// proxy too, and picks as victim the session whose wait began last.
func TestWaitGraphCycles(t *testing.T) {
	a, b, c := &session{}, &session{}, &session{}
	a.key.ProcessID, b.key.ProcessID, c.key.ProcessID = 1, 2, 3
	owners := map[backendKey]owner{
		{"n1", 11}: {a, "p1/1"}, {"n2", 12}: {a, "p1/1"},
		{"n1", 21}: {b, "p1/2"}, {"n2", 22}: {b, "p1/2"},
		{"n1", 31}: {c, "p1/3"}, {"n2", 32}: {c, "p1/3"},
		// A session of another proxy, as it shared its backends.
		{"n1", 41}: {nil, "p2/9"}, {"n2", 42}: {nil, "p2/9"},
	}
	t0 := time.Unix(1000, 0)
	type wait struct {
		node             string
		waiter, blocker  uint32
		sinceSecondsLate int
	}
	for _, tc := range []struct {
		name   string
		waits  []wait
		cycles int
		victim *session
	}{
		{"across two nodes", []wait{{"n1", 11, 21, 0}, {"n2", 22, 12, 1}}, 1, b},
		{"the victim is the later waiter", []wait{{"n1", 11, 21, 5}, {"n2", 22, 12, 1}}, 1, a},
		{"on one node: PostgreSQL's", []wait{{"n1", 11, 21, 0}, {"n1", 21, 11, 1}}, 0, nil},
		{"a chain is no cycle", []wait{{"n1", 11, 21, 0}, {"n2", 22, 32, 1}}, 0, nil},
		{"through another client's backend", []wait{{"n1", 11, 99, 0}, {"n1", 99, 21, 3}, {"n2", 22, 12, 1}}, 1, b},
		{"three sessions", []wait{{"n1", 11, 21, 0}, {"n2", 22, 32, 2}, {"n1", 31, 11, 1}}, 1, b},
		{"through another proxy's session, ours the victim", []wait{{"n1", 11, 41, 2}, {"n2", 42, 12, 1}}, 1, a},
		{"through another proxy's session, its the victim", []wait{{"n1", 11, 41, 0}, {"n2", 42, 12, 1}}, 1, nil},
		{"a cycle beside other waits", []wait{{"n1", 11, 21, 0}, {"n2", 22, 12, 1}, {"n1", 31, 99, 0}, {"n2", 98, 32, 0}}, 1, b},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newWaitGraph()
			for _, w := range tc.waits {
				g.edge(owners, w.node, w.waiter, w.blocker, t0.Add(time.Duration(w.sinceSecondsLate)*time.Second))
			}
			cycles := g.crossNodeCycles()
			if len(cycles) != tc.cycles {
				t.Fatalf("%d cycles, want %d", len(cycles), tc.cycles)
			}
			if tc.cycles == 0 {
				return
			}
			v := cycles[0].victim()
			if v == nil || v.sess != tc.victim {
				t.Fatalf("victim %v, want %p (nil: the other proxy's)", v.name, tc.victim)
			}
			if cycles[0].describe() == "" {
				t.Error("no description")
			}
		})
	}
}
