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
	owners := map[backendKey]*session{
		{"n1", 11}: a, {"n2", 12}: a,
		{"n1", 21}: b, {"n2", 22}: b,
		{"n1", 31}: c, {"n2", 32}: c,
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
				t.Fatalf("victim %+v, want session %d", v, tc.victim.key.ProcessID)
			}
			if cycles[0].describe() == "" {
				t.Error("no description")
			}
		})
	}
}
