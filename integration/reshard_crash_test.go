package integration

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestReshardCrash kills the proxy that runs the reshard's coordinator
// (SIGKILL, from a test-only hook) once in each phase of a migration:
// shadow copy, drain, freeze, flip, release, and in the middle of a
// release's sweep (crashRun's small release batches give a source's sweep
// many block ranges, so that crash leaves moved rows). A new proxy takes over the
// coordinator lease, the reshard completes, and the ledger check passes,
// while clients on another proxy see no error.
func TestReshardCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("long: one reshard per crash point")
	}
	for _, point := range []string{"copy", "drain", "freeze", "flip", "release", "sweep"} {
		t.Run(point, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			pool, load := crashRun(t, ctx, point, "SELECT lattice_reshard('catalogue', 12)", "SELECT lattice_reshard_complete('catalogue')")
			verifyReshardedTree(t, ctx, pool, load.ledger, 12)
			t.Logf("crash at %s: %d writes, %d reads", point, load.writes.Load(), load.reads.Load())
		})
	}
}

// crashRun is one crash point of a migration under the ledger load: on a
// tree of 8 shards, op starts the migration on proxy a, which dies of
// SIGKILL at point (the test-only hook); a new proxy takes the
// coordinator lease over and finishes, until the boolean query complete is
// true. Clients use proxy b, which runs no coordinator, and see no error.
// The statements setup run once the tree is made, before the load starts.
// It returns b's pool and the stopped load, for the caller's checks.
func crashRun(t *testing.T, ctx context.Context, point, op, complete string, setup ...string) (*pgxpool.Pool, *reshardLoad) {
	t.Helper()
	resetNodes(t)
	fast := []string{"--reshard-lease", "3s", "--reshard-tick", "200ms", "--release-batch", "100"}
	b := startProxy(t, 3, append([]string{"--coordinator=false"}, fast...)...)
	a := startProxyEnv(t, 3, []string{"LATTICE_TEST_CRASH_AT=" + point}, fast...)
	pool, err := pgxpool.New(ctx, b.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	load := newLoad(t, ctx, []*pgxpool.Pool{pool}, 20_000, 8)
	for _, q := range setup {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	failed, finish := load.run(ctx)
	if _, err := pool.Exec(ctx, op); err != nil {
		finish()
		t.Fatalf("%s: %v", op, err)
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
	waitFor(t, ctx, pool, complete, failed, finish)
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if load.writes.Load() == 0 || load.reads.Load() == 0 {
		t.Fatalf("the load did nothing: %d writes, %d reads", load.writes.Load(), load.reads.Load())
	}
	// Each crash point lies inside a migration, which only the new
	// coordinator can have finished.
	if !strings.Contains(c.Log(), `msg="migration done"`) {
		t.Fatalf("%s completed, but the restarted proxy finished no migration", op)
	}
	return pool, load
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
