package migrator

import (
	"errors"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// TestNudgeStartsAtOnce: with a tick far longer than the test, a grow that
// needs two waves of splits still starts, runs both waves and completes,
// because lattice_reshard and each migration's end nudge the coordinator.
// Without the nudges nothing would run past the first tick.
func TestNudgeStartsAtOnce(t *testing.T) {
	tests := []struct {
		name   string
		intent func(r *testRig, c *Coordinator) error
		done   func(r *testRig) bool
	}{
		{
			name: "reshard",
			intent: func(r *testRig, c *Coordinator) error {
				_, err := c.Reshard(r.ctx, "app", "items", 8)
				return err
			},
			done: func(r *testRig) bool { return r.mapNow().DistinctShards() == 8 },
		},
		{
			name: "move",
			intent: func(r *testRig, c *Coordinator) error {
				node := "n2"
				f := &Functions{store: r.store, coord: c}
				_, err := f.moveShard(r.ctx, "app", map[string]*string{"tree": ptr("items"), "shard": ptr("0"), "node": &node})
				return err
			},
			done: func(r *testRig) bool { return r.mapNow().Shards[0].Node == "n2" },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			c := NewCoordinator("c1", r.runner(""), CoordinatorOptions{Tick: time.Hour, MaxConcurrentMigrations: 2}, nil)
			r.runCoordinator(t, c)
			if err := tc.intent(r, c); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				cur, err := r.store.Reshard(r.ctx, "app", "items")
				if errors.Is(err, shardmap.ErrNotFound) {
					if !tc.done(r) {
						t.Fatalf("intent completed, but the map is %v", r.mapNow().Shards)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if time.Now().After(deadline) {
					t.Fatalf("intent still there after 30 s with an hour-long tick: %+v (map %v)", cur, r.mapNow().Shards)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

func ptr(s string) *string { return &s }
