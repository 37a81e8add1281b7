package integration

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/lattice-db/lattice/localnode"
	"github.com/lattice-db/lattice/pgshard"
)

// TestLapsedLease cuts a proxy off its Redis (the proxy's user is disabled
// and its connections killed) for longer than --proxy-lease. The proxy
// serves on from its cached map while it holds its presence sessions on the
// nodes; once a node ends one, it refuses statements with 57P03 instead of
// routing by a map that may be stale. Meanwhile the tree's map changes
// behind the migrator's back: the key's shard is folded away, and the copy
// of the key on its new shard has another value. Once Redis lets the proxy
// in again, it serves again, by the new map: it read the map again before
// serving.
func TestLapsedLease(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A Redis of its own: the test locks the proxy out of it.
	rs, err := localnode.StartRedis(ctx, filepath.Join(t.TempDir(), "redis"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Stop() })
	opt, err := redis.ParseURL(rs.URL())
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	// The test's own user stays in while the proxy's (default) is off.
	if err := rdb.Do(ctx, "ACL", "SETUSER", "ltest", "on", ">ltest", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	opt.Username, opt.Password = "ltest", "ltest"
	adm := redis.NewClient(opt)
	defer adm.Close()

	p := startProxy(t, 3, "--redis", rs.URL(), "--proxy-lease", "2s")
	c, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	f := newStaleFixture(t, ctx, c, "redis://ltest:ltest@"+rs.Addr+"/0")
	const read = "SELECT v FROM mx WHERE k = $1"
	var v int
	if err := c.QueryRow(ctx, read, f.key).Scan(&v); err != nil || v != 1 {
		t.Fatalf("before the lapse: v = %d (%v), want 1", v, err)
	}

	for _, cmd := range [][]any{{"ACL", "SETUSER", "default", "off"}, {"CLIENT", "KILL", "USER", "default"}} {
		if err := adm.Do(ctx, cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	// Served from the cache past the lease, as long as the proxy holds
	// its presence on the nodes.
	lapsed := time.Now().Add(3 * time.Second)
	for time.Now().Before(lapsed) || !strings.Contains(p.Log(), "serving from the cached maps") {
		if err := c.QueryRow(ctx, read, f.key).Scan(&v); err != nil || v != 1 {
			t.Fatalf("with Redis out of reach, before the presence ended: v = %d (%v), want 1 from the cached map", v, err)
		}
	}
	cluster, err := adm.Get(ctx, "lattice:cluster-id").Result()
	if err != nil {
		t.Fatal(err)
	}
	endPresence(t, ctx, testNodeDSN(t, 0), cluster)
	// Refused from then on, though the proxy opens its presence again.
	for {
		err := c.QueryRow(ctx, read, f.key).Scan(&v)
		if err == nil {
			continue
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "57P03" {
			t.Fatalf("with Redis out of reach and a presence ended: %v, want SQLSTATE 57P03", err)
		}
		break
	}

	// The map moves on without the proxy: the key now lives on dst, as -1.
	f.copyRows(t, ctx)
	dst := nodeConn(t, ctx, f.m.Shards[f.dst].Node)
	if _, err := dst.Exec(ctx, "UPDATE "+pgshard.ShardTable(f.tree, f.dst)+" SET v = -1 WHERE k = $1", f.key); err != nil {
		t.Fatal(err)
	}
	epoch := f.fold(t, ctx)
	if err := adm.Do(ctx, "ACL", "SETUSER", "default", "on").Err(); err != nil {
		t.Fatal(err)
	}

	// Served again, by the new map; until the heartbeat is back, refused.
	for {
		err := c.QueryRow(ctx, read, f.key).Scan(&v)
		if err == nil {
			break
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "57P03" {
			t.Fatalf("after Redis let the proxy in: %v, want success or SQLSTATE 57P03", err)
		}
	}
	if v != -1 {
		t.Fatalf("after the lapse: v = %d, want -1 from the map of epoch %d: the proxy served by the map it had before the lapse", v, epoch)
	}
}
