package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/redis/go-redis/v9"

	"github.com/lattice-db/lattice/shardmap"
)

// TestAckAfterApply: a proxy acknowledges an epoch on the arrival of its
// map event, but only once it routes by a map of that epoch. Events that
// announce an epoch the store does not hold (one without its map, one whose
// map was written for an earlier tree of the same name) come first; then a
// real map write. Events are handled in order, so once the proxy has
// acknowledged the real write it has handled the others: its
// acknowledgement must be the real epoch, not the announced one.
func TestAckAfterApply(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, q := range []string{
		"CREATE TABLE acked (k text PRIMARY KEY, v int)",
		"SELECT lattice_create_tree('acked', 'k', shard_count => 2)",
		"INSERT INTO acked VALUES ('a', 1)",
	} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	store, err := shardmap.OpenRedis(ctx, testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	opt, err := redis.ParseURL(testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	tree, err := store.Tree(ctx, "lattice", "acked")
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name    string
		carried func(m *shardmap.Map) map[string]any // extra fields of the event
	}{
		{"an epoch the store does not hold", func(*shardmap.Map) map[string]any { return nil }},
		{"a map of an earlier tree of the name", func(m *shardmap.Map) map[string]any {
			return map[string]any{"created": tree.Created.Add(-time.Hour), "map": m}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := store.Map(ctx, "lattice", "acked")
			if err != nil {
				t.Fatal(err)
			}
			announced := m.Epoch + 100
			forged := *m
			forged.Epoch = announced
			ev := map[string]any{"kind": shardmap.EventMap, "tenant": "lattice", "tree": "acked", "epoch": announced}
			for k, v := range tc.carried(&forged) {
				ev[k] = v
			}
			payload, _ := json.Marshal(ev)
			if err := rdb.Publish(ctx, "lattice:events", payload).Err(); err != nil {
				t.Fatal(err)
			}
			if err := store.SwapMap(ctx, m, m.Epoch); err != nil {
				t.Fatal(err)
			}
			for {
				acks, err := store.Acks(ctx, "lattice", "acked")
				if err != nil {
					t.Fatal(err)
				}
				var top uint64
				for _, e := range acks {
					top = max(top, e)
				}
				if top > m.Epoch {
					t.Fatalf("acknowledged epoch %d, announced but never stored; the store holds %d", top, m.Epoch)
				}
				if top == m.Epoch {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("epoch %d not acknowledged (acks %v)", m.Epoch, acks)
				}
				time.Sleep(5 * time.Millisecond)
			}
			// The proxy routes by the map it acknowledged.
			var v int
			if err := c.QueryRow(ctx, "SELECT v FROM acked WHERE k = 'a'").Scan(&v); err != nil || v != 1 {
				t.Fatalf("after the acknowledgement: v = %d (%v), want 1", v, err)
			}
		})
	}
}

// TestAckRecreatedTree: a tree dropped and made again under its name
// starts its epochs over, and the drop took its acknowledgements. The
// proxy acknowledges the new tree's epochs from the first. Before, it kept
// the old tree's last epoch as already acknowledged and stayed silent
// until the new tree's epochs passed it: each freeze of the new tree
// waited its whole budget for the proxy, paused writes that long and
// rolled back (six freezes in a row for each split of a reshard after
// 2 -> 4 -> 2 -> 4, drop and create).
func TestAckRecreatedTree(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	observedTree(t, c, 100, 2)
	reshardAndWait(t, c, 4)
	mustExec(t, c, `DROP TABLE items`)
	observedTree(t, c, 100, 2)
	store, err := shardmap.OpenRedis(ctx, testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	// A map write as a freeze makes one: the epoch moves on by one.
	m, err := store.Map(ctx, "lattice", "items")
	if err != nil {
		t.Fatal(err)
	}
	if err := store.SwapMap(ctx, m, m.Epoch); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 30*time.Second, fmt.Sprintf("the proxy to acknowledge epoch %d of the new tree", m.Epoch), func() (bool, error) {
		acks, err := store.Acks(ctx, "lattice", "items")
		return len(acks) == 1 && slices.Collect(maps.Values(acks))[0] == m.Epoch, err
	})
}

// TestAckWaitsForTreeDDL: a tree DDL statement holds a view of the maps
// while it runs, so a proxy acknowledges a newer epoch only once it ended:
// the empty-tree re-pin, which waits for those acknowledgements, then reads
// a DDL log that records it (migrator tryRepin). The DDL waits for a lock on one
// shard table while the map is written again. Bound and executed in one
// batch, it kept its view to the batch's end; bound before a Flush and
// executed after it, it ran holding none, and the proxy acknowledged the
// new epoch while it still ran.
func TestAckWaitsForTreeDDL(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, "CREATE TABLE ddlack (k text PRIMARY KEY, v int)")
	mustExec(t, c, "SELECT lattice_create_tree('ddlack', 'k', shard_count => 2)")
	store, err := shardmap.OpenRedis(ctx, testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	m, err := store.Map(ctx, "lattice", "ddlack")
	if err != nil {
		t.Fatal(err)
	}
	shardNode := testNodeDSN(t, int(m.Shards[0].Node[1]-'1'))
	onShardNode := connect(t, shardNode)
	acked := func() uint64 {
		acks, err := store.Acks(ctx, "lattice", "ddlack")
		if err != nil {
			t.Fatal(err)
		}
		return slices.Max(append(slices.Collect(maps.Values(acks)), 0))
	}

	for i, tc := range []struct {
		name  string
		flush bool // Flush between Bind and Execute
	}{
		{"one batch", false},
		{"flush before execute", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := lockTable(t, ctx, shardNode, shardmap.SchemaName(0)+".ddlack", "ACCESS SHARE")
			w := dialWire(t, p.DSN("lattice"))
			w.send(&pgproto3.Parse{Query: fmt.Sprintf("ALTER TABLE ddlack ADD COLUMN c%d int", i)}, &pgproto3.Bind{})
			if tc.flush {
				w.send(&pgproto3.Flush{})
				if got := w.read(isMsg[*pgproto3.BindComplete]); got != "ParseComplete BindComplete" {
					t.Fatalf("before the Flush: %s", got)
				}
			}
			w.send(&pgproto3.Execute{}, &pgproto3.Sync{})
			pollUntil(t, 20*time.Second, "the DDL to wait for the shard's lock", func() (bool, error) {
				var n int
				err := onShardNode.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").Scan(&n)
				return n > 0, err
			})

			m, err := store.Map(ctx, "lattice", "ddlack")
			if err != nil {
				t.Fatal(err)
			}
			if err := store.SwapMap(ctx, m, m.Epoch); err != nil { // m.Epoch is now the new one
				t.Fatal(err)
			}
			// The proxy installs the map at once (a map event); a proxy
			// that held no view for the DDL acknowledged it as quickly.
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				if e := acked(); e >= m.Epoch {
					t.Fatalf("epoch %d acknowledged while the DDL still runs", e)
				}
			}
			release()
			if got := w.read(isMsg[*pgproto3.ReadyForQuery]); got != "ParseComplete BindComplete CommandComplete ReadyForQuery:I" && got != "CommandComplete ReadyForQuery:I" {
				t.Fatalf("the DDL answered %s", got)
			}
			pollUntil(t, 20*time.Second, "the acknowledgement once the DDL ended", func() (bool, error) {
				return acked() >= m.Epoch, nil
			})
		})
	}
}

func isMsg[T pgproto3.BackendMessage](m pgproto3.BackendMessage) bool {
	_, ok := m.(T)
	return ok
}
