package integration

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lattice-db/lattice/localnode"
)

// TestPgbenchTPCBThroughReshard runs pgbench's own TPC-B-like script, an
// outside workload with a ledger of its own, through the proxy while the
// accounts tree is grown and then shrunk on 3 nodes. The tables are made by
// pgbench -i through the proxy, as a new user would. Each TPC-B transaction
// updates an account on some shard and the tellers, branches and history
// on the catalog node, so every commit spans nodes. Afterwards the four
// sums pgbench keeps must agree, history must hold one row per transaction
// pgbench counted, and every account must be present exactly once.
func TestPgbenchTPCBThroughReshard(t *testing.T) {
	resetNodes(t)
	ctx := context.Background()
	p := startProxy(t, 3)
	dsn := p.DSN("lattice")
	pgbench := filepath.Join(localnode.PGBinDir(), "pgbench")
	const scale = 1
	if out, err := exec.CommandContext(ctx, pgbench, "-i", "-q", "-s", strconv.Itoa(scale), dsn).CombinedOutput(); err != nil {
		t.Fatalf("pgbench -i through the proxy: %v\n%s", err, out)
	}
	c := connect(t, dsn)
	defer c.Close(ctx)
	mustExec(t, c, `SELECT lattice_create_tree('pgbench_accounts', 'aid', shard_count => 8)`)

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	reshards := make(chan error, 1)
	go func() {
		for _, n := range []int{16, 4} {
			if _, err := pool.Exec(ctx, "SELECT lattice_reshard('pgbench_accounts', $1)", n); err != nil {
				reshards <- fmt.Errorf("reshard to %d: %w", n, err)
				return
			}
			waitReshardComplete(t, ctx, pool, "pgbench_accounts", 3*time.Minute)
		}
		reshards <- nil
	}()

	// Runs of a few seconds in each protocol in turn, until both reshards
	// are done: pgbench prints its counts only at the end of a run. The
	// rate limit keeps the test's CPU, on a machine that runs others
	// beside it, to what a steady workload needs.
	modes := []string{"simple", "extended", "prepared"}
	var transactions, runs int
	for done := false; !done || runs < len(modes); runs++ {
		mode := modes[runs%len(modes)]
		out, err := exec.CommandContext(ctx, pgbench, "-n", "-M", mode, "-c", "4", "-j", "2", "-R", "100", "-T", "3", dsn).CombinedOutput()
		if err != nil {
			t.Fatalf("pgbench -M %s during the reshard: %v\n%s", mode, err, out)
		}
		m := processedRe.FindSubmatch(out)
		if m == nil {
			t.Fatalf("pgbench -M %s: no transaction count in\n%s", mode, out)
		}
		n, _ := strconv.Atoi(string(m[1]))
		if n == 0 {
			t.Fatalf("pgbench -M %s committed nothing:\n%s", mode, out)
		}
		transactions += n
		t.Logf("pgbench -M %s: %d transactions", mode, n)
		select {
		case err := <-reshards:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		default:
		}
	}
	t.Logf("%d pgbench runs, %d transactions", runs, transactions)

	if got := tpcbInvariant(t, ctx, dsn); !strings.HasPrefix(got, "holds") {
		t.Fatalf("TPC-B invariant: %s", got)
	}
	var history, accounts, distinct int64
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pgbench_history").Scan(&history); err != nil {
		t.Fatal(err)
	}
	if history != int64(transactions) {
		t.Errorf("history holds %d rows, pgbench counted %d transactions", history, transactions)
	}
	if err := c.QueryRow(ctx, "SELECT count(*), count(DISTINCT aid) FROM pgbench_accounts").Scan(&accounts, &distinct); err != nil {
		t.Fatal(err)
	}
	if accounts != scale*100_000 || distinct != accounts {
		t.Errorf("pgbench_accounts holds %d rows with %d distinct keys, want %d", accounts, distinct, scale*100_000)
	}
	var shards int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM lattice_shards('pgbench_accounts') WHERE state = 'active'").Scan(&shards); err != nil {
		t.Fatal(err)
	}
	if shards != 4 {
		t.Errorf("%d active shards after the shrink, want 4", shards)
	}
}
