package integration

import (
	"context"
	"sync"
	"testing"

	"github.com/lattice-db/lattice/sqlstate"
)

// TestCancelStaysInItsSession: a CancelRequest of one client never cancels
// another client's statement on the pooled backend the first one just
// released. The proxy keeps a backend it is cancelling out of the pool
// until the node has handled the request (pgx's
// TestConnQueryValuesWhenUnableToDecode failed with 57014 through the
// proxy while other tests canceled their own queries).
func TestCancelStaysInItsSession(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "1")
	ctx := context.Background()
	a := connect(t, p.DSN("lattice"))
	b := connect(t, p.DSN("lattice"))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(3)
	go func() { // a runs short statements
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = a.Exec(ctx, `SELECT pg_sleep(0.0002)`)
		}
	}()
	go func() { // and cancels them, whenever
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = a.PgConn().CancelRequest(ctx)
		}
	}()
	var leaked int
	// b's statements last 5 ms, so that a cancel of a's that reached the
	// node late would find one running on the backend a just released:
	// with the cancel forwarded after the session let its backends go,
	// 34 of these 200 were canceled; with 1,500 instant statements, 0 to 3.
	go func() {
		defer wg.Done()
		defer close(stop)
		for range 200 {
			if _, err := b.Exec(ctx, `SELECT pg_sleep(0.005)`); err != nil {
				if pgCode(err) == sqlstate.QueryCanceled {
					leaked++
					continue
				}
				t.Errorf("b: %v", err)
				return
			}
		}
	}()
	wg.Wait()
	if leaked > 0 {
		t.Fatalf("%d of b's statements were canceled by a's CancelRequests", leaked)
	}
}
