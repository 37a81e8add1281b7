package pgshard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lattice-db/lattice/sqlstate"
)

func TestRetryLockTimeouts(t *testing.T) {
	lockTimeout := sqlstate.New(sqlstate.LockNotAvailable, "canceling statement due to lock timeout")
	other := errors.New("boom")
	for _, c := range []struct {
		name       string
		fails      int   // attempts that time out on the lock first
		last       error // what the attempt after them returns
		backoffMax time.Duration
		want       error
		attempts   int
	}{
		{"at once", 0, nil, time.Millisecond, nil, 1},
		{"after lock timeouts, backing off", 3, nil, 4 * time.Millisecond, nil, 4},
		{"after lock timeouts, at once", 3, nil, 0, nil, 4},
		{"another error ends it", 2, other, time.Millisecond, other, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := 0
			err := RetryLockTimeouts(context.Background(), time.Millisecond, c.backoffMax, func() error {
				n++
				if n <= c.fails {
					return lockTimeout
				}
				return c.last
			})
			if !errors.Is(err, c.want) || n != c.attempts {
				t.Fatalf("got %v after %d attempts, want %v after %d", err, n, c.want, c.attempts)
			}
		})
	}
	t.Run("context ends it", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		n := 0
		err := RetryLockTimeouts(ctx, time.Millisecond, time.Millisecond, func() error {
			if n++; n == 2 {
				cancel()
			}
			return lockTimeout
		})
		if !sqlstate.Is(err, sqlstate.LockNotAvailable) || n != 2 {
			t.Fatalf("got %v after %d attempts, want the lock timeout after 2", err, n)
		}
	})
}
