package autonomic

import "testing"

func TestMidpoint(t *testing.T) {
	m := identity(64, 2) // shard 0 owns 0..31, shard 1 owns 32..63
	hotTop := make([]float64, 64)
	for s := 24; s < 32; s++ {
		hotTop[s] = 10
	}
	twoSlots := make([]float64, 64)
	twoSlots[3], twoSlots[20] = 50, 50
	cases := []struct {
		name   string
		shard  int
		writes []float64
		from   int
		ok     bool
	}{
		{"even load halves the slots", 0, spread(64, 0, 63, 64), 16, true},
		{"no load halves the slots", 1, make([]float64, 64), 48, true},
		{"nil load halves the slots", 0, nil, 16, true},
		{"load on the top quarter splits inside it", 0, hotTop, 28, true},
		{"two hot slots: the cut between them, nearest the middle", 0, twoSlots, 16, true},
		{"the second shard's own slots", 1, spread(64, 32, 63, 32), 48, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			from, ok := Midpoint(m, c.shard, c.writes)
			if from != c.from || ok != c.ok {
				t.Fatalf("Midpoint = %d, %v; want %d, %v", from, ok, c.from, c.ok)
			}
		})
	}
	one := identity(2, 2)
	if _, ok := Midpoint(one, 0, []float64{5, 5}); ok {
		t.Fatal("a shard of one slot cannot be split")
	}
}

func TestShardWrites(t *testing.T) {
	m := identity(8, 2)
	w := ShardWrites(m, []float64{1, 1, 1, 1, 2, 2, 2}) // shorter than the map: the last slot reads 0
	if w[0] != 4 || w[1] != 6 {
		t.Fatalf("ShardWrites = %v", w)
	}
}
