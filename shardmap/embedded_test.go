package shardmap

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestEmbedded checks what Lattice needs from miniredis in the no---redis
// default: scripts (EVALSHA), pub/sub, and keys that expire on the wall clock.
func TestEmbedded(t *testing.T) {
	ctx := context.Background()
	url, stop, err := StartEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	s, err := OpenRedis(ctx, url)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	defer s.Close()

	events, err := s.Subscribe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	testConcurrentSwaps(t, s, "app")
	if ev := recv(t, events); ev.Kind != EventTree {
		t.Errorf("first event %+v, want the tree's creation", ev)
	}
	if ev := recv(t, events); ev.Kind != EventMap || ev.Epoch != 2 {
		t.Errorf("second event %+v, want the map at epoch 2", ev)
	}

	// Leases rely on expiry.
	if err := s.client.Set(ctx, "lease", "p1", 50*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	if n, err := s.client.Exists(ctx, "lease").Result(); err != nil || n != 0 {
		t.Errorf("a key with a 50ms TTL still exists after 150ms (%d, %v)", n, err)
	}

	stop()
	if err := s.client.Ping(ctx).Err(); err == nil {
		t.Errorf("the server still answers after stop")
	}
}

// TestEmbeddedPassword checks that the embedded server listens on loopback
// only and refuses a client without its password, as another local user is.
func TestEmbeddedPassword(t *testing.T) {
	ctx := context.Background()
	raw, stop, err := StartEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.Hostname() != "127.0.0.1" {
		t.Errorf("embedded redis listens on %s, want 127.0.0.1", u.Host)
	}
	if pw, _ := u.User.Password(); len(pw) < 32 {
		t.Fatalf("embedded redis URL %s has no strong password", u.Redacted())
	}
	other := redis.NewClient(&redis.Options{Addr: u.Host})
	defer other.Close()
	if err := other.Set(ctx, "lattice:x", "y", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("a client without the password wrote a key: %v", err)
	}
	s, err := OpenRedis(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.client.Set(ctx, "lattice:x", "y", 0).Err(); err != nil {
		t.Errorf("the proxy's own client, with the password: %v", err)
	}
}
