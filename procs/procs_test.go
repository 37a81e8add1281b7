package procs

import "testing"

// spell is a run of intervals in which the process used the same cores.
type spell struct {
	busy      float64
	intervals int
}

func TestSizer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		max    int
		spells []spell
		want   int
	}{
		{"idle stays at one P", 8, []spell{{0, 100}}, 1},
		{"under the grow line stays", 8, []spell{{0.84, 1000}}, 1},
		{"one hot interval is not enough", 8, []spell{{0.9, 1}}, 1},
		{"two hot intervals double", 8, []spell{{0.9, 2}}, 2},
		{"a cool interval between hot ones resets", 8, []spell{{0.9, 1}, {0.5, 1}, {0.9, 1}}, 1},
		{"a saturated process doubles each two intervals", 8, []spell{{1, 2}, {2, 2}, {4, 1}}, 4},
		{"doubling stops at the ceiling", 6, []spell{{1, 2}, {2, 2}, {4, 2}, {6, 10}}, 6},
		{"a ceiling of one never grows", 1, []spell{{1, 100}}, 1},
		{"a load that grew the Ps keeps them", 8, []spell{{0.9, 2}, {1.15, 1000}}, 2},
		{"a load just over the grow line does not flap", 8, []spell{{0.86, 2}, {0.8, 1000}}, 2},
		{"a calm spell one interval short keeps the Ps", 8, []spell{{0.9, 2}, {0.5, shrinkTicks - 1}}, 2},
		{"a calm spell gives a P back", 8, []spell{{0.9, 2}, {0.5, shrinkTicks}}, 1},
		{"a busier interval restarts the calm spell", 8, []spell{{0.9, 2}, {0.5, shrinkTicks - 1}, {0.7, 1}, {0.5, shrinkTicks - 1}}, 2},
		{"the calm spell's peak sets how many go", 8, []spell{{1, 2}, {2, 2}, {4, 2}, {3, 10}, {3.5, 1}, {3, shrinkTicks - 11}}, 5},
		{"an idle spell after a burst goes back to one P", 8, []spell{{1, 2}, {2, 2}, {4, 2}, {0.1, shrinkTicks}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSizer(tc.max)
			var got int
			for _, sp := range tc.spells {
				for range sp.intervals {
					got = s.Next(sp.busy)
				}
			}
			if got != tc.want || s.Procs() != got {
				t.Fatalf("got %d Ps (Procs %d), want %d", got, s.Procs(), tc.want)
			}
		})
	}
}

// TestSizerNeverLeavesItsBounds feeds every load from idle to twice the
// ceiling and checks each decision.
func TestSizerNeverLeavesItsBounds(t *testing.T) {
	s := NewSizer(4)
	for i := range 10000 {
		busy := float64(i%97) / 97 * 8
		if n := s.Next(busy); n < 1 || n > 4 {
			t.Fatalf("interval %d, busy %.2f: %d Ps", i, busy, n)
		}
	}
}
