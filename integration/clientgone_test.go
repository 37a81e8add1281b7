package integration

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestClientGoneCancelsItsStatement: a client that goes away while its
// statement runs (a point read, a read of every shard) has the statement
// cancelled on the backends within a few seconds, not when it would have
// ended; the proxy counts it, and the pool serves the next client.
func TestClientGoneCancelsItsStatement(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	admin := connect(t, p.DSN("lattice"))
	mustExec(t, admin, "CREATE TABLE gone (k int PRIMARY KEY, v int NOT NULL)")
	mustExec(t, admin, "INSERT INTO gone SELECT g, g FROM generate_series(1, 8) g")
	mustExec(t, admin, "SELECT lattice_create_tree('gone', 'k', shard_count => 4)")
	for _, c := range []struct{ name, sql string }{
		{"point", "SELECT pg_sleep(120), v FROM gone WHERE k = 1"},
		{"fan-out", "SELECT count(*) FROM gone WHERE pg_sleep(60) IS NOT NULL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// psql, killed: its socket goes without a Terminate or a
			// CancelRequest (pgx would send one on a broken connection).
			cl := exec.Command("psql", "-X", "-q", "-d", p.DSN("lattice"), "-c", c.sql)
			if err := cl.Start(); err != nil {
				t.Fatal(err)
			}
			pollUntil(t, 30*time.Second, "the statement running on a node", func() (bool, error) { n, err := sleeping(t); return n > 0, err })
			if err := cl.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cl.Wait()
			left := time.Now()
			pollUntil(t, 10*time.Second, "no node running the statement", func() (bool, error) { n, err := sleeping(t); return n == 0, err })
			t.Logf("cancelled %s after the client left", time.Since(left).Round(time.Millisecond))
		})
	}
	if got := metricSum(t, p, "lattice_proxy_client_connections_total", map[string]string{"outcome": "gone_mid_statement"}); got != 2 {
		t.Fatalf("gone_mid_statement = %v, want 2", got)
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM gone").Scan(&n); err != nil || n != 8 {
		t.Fatalf("after: count %d, %v; want 8", n, err)
	}
}

// sleeping counts the backends of the test's nodes running pg_sleep.
func sleeping(t *testing.T) (int, error) {
	ctx := context.Background()
	total := 0
	for i := range 2 {
		c, err := pgx.Connect(ctx, testNodeDSN(t, i))
		if err != nil {
			return 0, err
		}
		var n int
		err = c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE state = 'active' AND query LIKE '%pg_sleep(%' AND pid <> pg_backend_pid()`).Scan(&n)
		c.Close(ctx)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}
