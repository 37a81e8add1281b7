package migrator

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/lattice-db/lattice/shardmap"
)

// TestIntentWakesEveryCoordinator: an intent another proxy stores (one
// without a coordinator, say) wakes this proxy's coordinator through Redis
// at once, with a tick far longer than the test.
func TestIntentWakesEveryCoordinator(t *testing.T) {
	mr := miniredis.RunT(t)
	open := func() *shardmap.RedisStore {
		rs := shardmap.NewRedisStore(redis.NewClient(&redis.Options{Addr: mr.Addr()}), "test")
		t.Cleanup(func() { rs.Close() })
		return rs
	}
	here, other := open(), open()
	c := NewCoordinator("c1", newRunner(newFakeNodes(), here, Options{}, nil, slog.New(slog.DiscardHandler)), CoordinatorOptions{Tick: time.Hour}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		c.followIntents(ctx)
	}()
	defer func() {
		cancel()
		<-followed
	}()
	for deadline := time.Now().Add(10 * time.Second); mr.PubSubNumSub("test:events")["test:events"] == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the coordinator never subscribed to the events")
		}
		time.Sleep(time.Millisecond)
	}
	r := &shardmap.Reshard{OpID: "op1", Tenant: "app", Tree: "items", Target: 8, From: 4, Grow: true, Phase: ReshardMigrating, Started: time.Now().UTC()}
	if _, err := other.StartReshard(ctx, r); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.wake:
	case <-time.After(10 * time.Second):
		t.Fatal("no wake 10 s after another proxy stored an intent, with an hour-long tick")
	}
}
