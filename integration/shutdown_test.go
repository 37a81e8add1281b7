package integration

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestShutdownCutsStuckBackend: SIGTERM ends the proxy even while a session
// waits on a backend that answers neither its statement nor the cancel
// (its PostgreSQL process stopped with SIGSTOP): after the shutdown grace
// the proxy cuts that backend's socket, and the session and the proxy end.
func TestShutdownCutsStuckBackend(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close(context.Background())
	ran := make(chan error, 1)
	go func() {
		_, err := client.Exec(ctx, "SELECT pg_sleep(60), 'shutdown-stuck'")
		ran <- err
	}()
	node := connect(t, testNodeDSN(t, 0))
	var pid int
	waitUntil(t, ctx, "the statement running on the node", func() bool {
		return node.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE query LIKE '%shutdown-stuck%' AND pid <> pg_backend_pid()`).Scan(&pid) == nil
	})
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stop the backend: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })

	p.killed.Store(true)
	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(25 * time.Second):
		t.Fatalf("the proxy did not exit within 25s of SIGTERM with a session waiting on a stopped backend")
	}
	t.Logf("the proxy exited %s after SIGTERM", time.Since(start).Round(100*time.Millisecond))
	if !strings.Contains(p.Log(), "cutting its backends") {
		t.Errorf("the proxy's log does not say it cut the stuck session's backends")
	}
	if err := <-ran; err == nil {
		t.Errorf("the stuck statement succeeded")
	}
}
