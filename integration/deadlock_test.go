package integration

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestDeadlockAcrossNodes: two transactions each change a row on one node,
// then the row the other changed, on the other node. Each node sees one
// wait and no cycle; without the proxy's detector both wait for ever (as
// sysbench oltp_read_write with 4 threads did). One of them must get
// 40P01 within a few seconds, and the other commit once it rolls back.
// Then a cycle on one node, PostgreSQL's own to break, is left to it.
func TestDeadlockAcrossNodes(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE dl (k bigint PRIMARY KEY, v int NOT NULL)`)
	mustExec(t, c, `INSERT INTO dl SELECT i, 0 FROM generate_series(1, 200) i`)
	mustExec(t, c, `SELECT lattice_create_tree('dl', 'k', shard_count => 4)`)
	k1, k2 := keyOnNode(t, 0, "dl", "k"), keyOnNode(t, 1, "dl", "k")

	run := func(t *testing.T, first, second int64, crossNode bool, other *proxyProc) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		a, b := connect(t, p.DSN("lattice")), connect(t, other.DSN("lattice"))
		for _, x := range []struct {
			c *pgx.Conn
			k int64
		}{{a, first}, {b, second}} {
			if _, err := x.c.Exec(ctx, `BEGIN`); err != nil {
				t.Fatal(err)
			}
			if _, err := x.c.Exec(ctx, `UPDATE dl SET v = v + 1 WHERE k = $1`, x.k); err != nil {
				t.Fatal(err)
			}
		}
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, x := range []struct {
			c *pgx.Conn
			k int64
		}{{a, second}, {b, first}} {
			wg.Go(func() {
				_, err := x.c.Exec(ctx, `UPDATE dl SET v = v + 1 WHERE k = $1`, x.k)
				if err != nil {
					// The victim rolls back, as a client does on 40P01.
					_, _ = x.c.Exec(context.Background(), `ROLLBACK`)
				} else {
					_, err = x.c.Exec(ctx, `COMMIT`)
				}
				errs[i] = err
			})
			time.Sleep(100 * time.Millisecond)
		}
		wg.Wait()
		victims := 0
		for i, err := range errs {
			var pe *pgconn.PgError
			switch {
			case err == nil:
			case errors.As(err, &pe) && pe.Code == "40P01":
				victims++
				if crossNode && !strings.Contains(pe.Detail, "on node n2") {
					t.Errorf("transaction %d: detail %q, want the cycle's waits", i+1, pe.Detail)
				}
			default:
				t.Fatalf("transaction %d: %v, want 40P01 or a commit", i+1, err)
			}
		}
		if victims != 1 {
			t.Fatalf("%d transactions got 40P01, want exactly 1: %v", victims, errs)
		}
	}

	// checkValues: each deadlock's committed transaction added 1 to both rows.
	checkValues := func(t *testing.T, want int) {
		t.Helper()
		var v1, v2 int
		for _, x := range []struct {
			k int64
			v *int
		}{{k1, &v1}, {k2, &v2}} {
			if err := c.QueryRow(context.Background(), `SELECT v FROM dl WHERE k = $1`, x.k).Scan(x.v); err != nil {
				t.Fatal(err)
			}
		}
		if v1 != want || v2 != want {
			t.Fatalf("v = %d, %d, want %d: one transaction of each deadlock commits, one rolls back", v1, v2, want)
		}
	}

	t.Run("across nodes", func(t *testing.T) {
		run(t, k1, k2, true, p)
		checkValues(t, 1)
	})
	// Each proxy sees the other's session through the backends it shares
	// in Redis; both pick the same victim, and its proxy cancels it.
	t.Run("across proxies", func(t *testing.T) {
		run(t, k1, k2, true, startProxy(t, 2))
		checkValues(t, 2)
	})
	t.Run("on one node", func(t *testing.T) {
		n1 := connect(t, testNodeDSN(t, 0))
		ctx := context.Background()
		// keyOnNode's k1 is the least key of the first shard schema there.
		var schema string
		var other int64
		if err := n1.QueryRow(ctx, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relname = 'dl' AND n.nspname LIKE 'lattice\_s%' ORDER BY 1 LIMIT 1`).Scan(&schema); err != nil {
			t.Fatal(err)
		}
		if err := n1.QueryRow(ctx, `SELECT k FROM `+schema+`.dl WHERE k <> $1 LIMIT 1`, k1).Scan(&other); err != nil {
			t.Fatal(err)
		}
		run(t, k1, other, false, p)
	})
}
