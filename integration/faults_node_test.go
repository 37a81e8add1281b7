package integration

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/shardmap"
)

// nodeDownCode reports whether code is what a client may get for a statement
// on a node that is down: a connection exception (class 08) or the server
// shutting down, crashed or starting (57P01, 57P02, 57P03).
func nodeDownCode(code string) bool {
	return strings.HasPrefix(code, "08") || code == "57P01" || code == "57P02" || code == "57P03"
}

// TestNodeDown stops or kills the PostgreSQL node that holds half of a
// tree's shards: statements for its shards fail promptly with a connection
// SQLSTATE, those for the other node's shards are served, a fan-out fails
// with a clear error, and once the node is back every statement is served
// again, although the proxy's pool held connections to the old server.
func TestNodeDown(t *testing.T) {
	fc := startFaultCluster(t, 2)
	for _, tc := range []struct {
		name string
		tree string
		down func() error
	}{
		{"stop", "nd_stop", func() error { return fc.nodes[1].Stop() }},
		{"kill -9", "nd_kill", func() error { return fc.nodes[1].Kill() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if !fc.nodes[1].Running() { // an earlier case failed with it down
				if err := fc.nodes[1].Restart(ctx); err != nil {
					t.Fatal(err)
				}
			}
			p := fc.proxy(t, nil)
			conn, err := pgx.Connect(ctx, p.DSN("lattice"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			createFaultTree(t, ctx, conn, tc.tree, 2000, 8)
			tr, m, err := fc.shardMap(ctx, tc.tree)
			if err != nil {
				t.Fatal(err)
			}
			onNode := func(node string) func(int, shardmap.Shard) bool {
				return func(_ int, sh shardmap.Shard) bool { return sh.Node == node }
			}
			downKeys := keysOn(t, tr, m, "k-", 8, onNode("n2"))
			upKeys := keysOn(t, tr, m, "k-", 8, onNode("n1"))

			// More client connections than statements on n2 while it is
			// down, so that some of the proxy's backends to the old server
			// are still in its pool when the node comes back.
			pool, err := pgxpool.New(ctx, p.DSN("lattice")+"&pool_max_conns=12")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			// Statements that overlap make the proxy's pool open several
			// backends to n2, which stay idle in it across the outage.
			var wg sync.WaitGroup
			errs := make(chan error, len(downKeys))
			for _, k := range downKeys {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := pool.Exec(ctx, "SELECT pg_sleep(0.3), v FROM "+tc.tree+" WHERE k = $1", k)
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("warm-up: %v", err)
				}
			}

			if err := tc.down(); err != nil {
				t.Fatal(err)
			}

			// Each statement gets its own bound: a hang shows up as a
			// context error, which has no SQLSTATE.
			stmt := func(sql string, args ...any) error {
				sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				_, err := pool.Exec(sctx, sql, args...)
				return err
			}
			expectDown := func(what, sql string, args ...any) {
				t.Helper()
				err := stmt(sql, args...)
				if err == nil {
					t.Errorf("%s on the stopped node succeeded", what)
					return
				}
				if code := sqlState(err); !nodeDownCode(code) {
					t.Errorf("%s on the stopped node: SQLSTATE %q (%v), want a connection error", what, code, err)
				}
			}
			expectDown("a read", "SELECT v FROM "+tc.tree+" WHERE k = $1", downKeys[0])
			expectDown("a write", "UPDATE "+tc.tree+" SET v = v + 1 WHERE k = $1", downKeys[1])
			expectDown("a fan-out count", "SELECT count(*) FROM "+tc.tree)
			expectDown("a fan-out update", "UPDATE "+tc.tree+" SET v = v WHERE v < 0")
			for i, k := range upKeys {
				if err := stmt("UPDATE "+tc.tree+" SET v = v + 1 WHERE k = $1", k); err != nil {
					t.Errorf("write of %s on the live node: %v", k, err)
				}
				var v int64
				sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				err := pool.QueryRow(sctx, "SELECT v FROM "+tc.tree+" WHERE k = $1", k).Scan(&v)
				cancel()
				if err != nil {
					t.Errorf("read %d of %s on the live node: %v", i, k, err)
				}
			}
			if t.Failed() {
				return
			}

			if err := fc.nodes[1].Restart(ctx); err != nil {
				t.Fatal(err)
			}
			// Back: every statement is served at once, whatever backends
			// to the old server the proxy's pool still had.
			for round := 0; round < 3; round++ {
				for _, k := range downKeys {
					if err := stmt("UPDATE "+tc.tree+" SET v = v + 1 WHERE k = $1", k); err != nil {
						t.Fatalf("round %d: write of %s after the node came back: %v", round, k, err)
					}
				}
			}
			var n int64
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tc.tree).Scan(&n); err != nil || n != 2000 {
				t.Fatalf("count after the node came back = %d, %v; want 2000", n, err)
			}
		})
	}
}
