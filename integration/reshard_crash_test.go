package integration

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestReshardCrash kills the proxy that runs the reshard's coordinator
// (SIGKILL, from a test-only hook) once in each phase of a migration:
// shadow copy, drain, freeze, flip, release. A new proxy takes over the
// coordinator lease, the reshard completes, and the ledger check passes,
// while clients on another proxy see no error.
func TestReshardCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("long: one reshard per crash point")
	}
	for _, point := range []string{"copy", "drain", "freeze", "flip", "release"} {
		t.Run(point, func(t *testing.T) {
			resetNodes(t)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			fast := []string{"--reshard-lease", "3s", "--reshard-tick", "200ms"}
			// Clients use b, which runs no coordinator; a runs it and dies.
			b := startProxy(t, 3, append([]string{"--coordinator=false"}, fast...)...)
			a := startProxyEnv(t, 3, []string{"LATTICE_TEST_CRASH_AT=" + point}, fast...)
			pool, err := pgxpool.New(ctx, b.DSN("lattice"))
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			const keys = 20_000
			load := &reshardLoad{keys: keys, pools: []*pgxpool.Pool{pool},
				ledger: &loadLedger{acked: map[string]loadEntry{}, deletes: map[string]int64{}}}
			for _, q := range []string{
				"CREATE TABLE catalogue (k text PRIMARY KEY, v bigint NOT NULL, pad text)",
				"INSERT INTO catalogue SELECT 'c-' || g, 0, md5(g::text) FROM generate_series(0, " + strconv.Itoa(keys-1) + ") g",
				"SELECT lattice_create_tree('catalogue', 'k', shard_count => 8)",
			} {
				if _, err := pool.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			for n := 0; n < keys; n++ {
				load.ledger.acked["c-"+strconv.Itoa(n)] = loadEntry{}
			}
			runCtx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			errs := make(chan error, 6)
			for i := range 4 {
				wg.Add(1)
				go func() { defer wg.Done(); errs <- load.writer(runCtx, i) }()
			}
			for i := range 2 {
				wg.Add(1)
				go func() { defer wg.Done(); errs <- load.reader(runCtx, i) }()
			}
			finish := func() {
				stop()
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			if _, err := pool.Exec(ctx, "SELECT lattice_reshard('catalogue', 12)"); err != nil {
				finish()
				t.Fatal(err)
			}
			if !a.WaitExit(3 * time.Minute) {
				finish()
				t.Fatalf("the coordinator's proxy did not reach crash point %q", point)
			}
			if err := a.crashedAt(point); err != nil {
				finish()
				t.Fatal(err)
			}
			c := startProxy(t, 3, fast...) // takes the coordinator over once the lease expires
			for {
				var done bool
				if err := pool.QueryRow(ctx, "SELECT lattice_reshard_complete('catalogue')").Scan(&done); err != nil {
					finish()
					t.Fatal(err)
				}
				if done {
					break
				}
				select {
				case err := <-errs:
					if err != nil {
						finish()
						t.Fatal(err)
					}
				case <-ctx.Done():
					finish()
					t.Fatalf("the reshard did not complete after the crash at %q", point)
				case <-time.After(200 * time.Millisecond):
				}
			}
			finish()
			if load.writes.Load() == 0 || load.reads.Load() == 0 {
				t.Fatalf("the load did nothing: %d writes, %d reads", load.writes.Load(), load.reads.Load())
			}
			// Each crash point lies inside a migration, which only the new
			// coordinator can have finished.
			if !strings.Contains(c.Log(), `msg="migration done"`) {
				t.Fatalf("the reshard completed, but the restarted proxy finished no migration")
			}
			verifyReshardedTree(t, ctx, pool, load.ledger, 12)
			t.Logf("crash at %s: %d writes, %d reads", point, load.writes.Load(), load.reads.Load())
		})
	}
}

// crashedAt checks that an exited proxy was killed by SIGKILL right after
// its log announced the crash hook at point, not by anything else.
func (p *proxyProc) crashedAt(point string) error {
	var ee *exec.ExitError
	if !errors.As(p.waitErr, &ee) {
		return fmt.Errorf("the coordinator's proxy exited with %v, want SIGKILL from crash point %q", p.waitErr, point)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return fmt.Errorf("the coordinator's proxy exited with %v, want SIGKILL from crash point %q", p.waitErr, point)
	}
	if want := "LATTICE_TEST_CRASH_AT: killing this process point=" + point; !strings.Contains(p.Log(), want) {
		return fmt.Errorf("the coordinator's proxy died of SIGKILL but its log lacks %q", want)
	}
	return nil
}
