package integration

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// reshardsBeside reshards tree to each count in turn, each to its
// completion, while a test's statements run, so that some of them read
// mixed shards and frozen slots.
type reshardsBeside struct {
	done      chan error
	stopping  chan struct{}
	completed atomic.Int32
}

func startReshardsBeside(ctx context.Context, pool *pgxpool.Pool, tree string, counts ...int) *reshardsBeside {
	r := &reshardsBeside{done: make(chan error, 1), stopping: make(chan struct{})}
	go func() {
		for _, n := range counts {
			if _, err := pool.Exec(ctx, "SELECT lattice_reshard($1, $2)", tree, n); err != nil {
				r.done <- err
				return
			}
			for {
				var complete bool
				if err := pool.QueryRow(ctx, "SELECT lattice_reshard_complete($1)", tree).Scan(&complete); err != nil {
					r.done <- err
					return
				}
				if complete {
					r.completed.Add(1)
					break
				}
				select {
				case <-r.stopping:
					r.done <- nil
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
		r.done <- nil
	}()
	return r
}

// count is how many reshards have completed so far.
func (r *reshardsBeside) count() int { return int(r.completed.Load()) }

// stop ends the reshards after the one running and returns how many
// completed, and the first error.
func (r *reshardsBeside) stop() (int, error) {
	close(r.stopping)
	err := <-r.done
	return r.count(), err
}
