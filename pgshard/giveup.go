package pgshard

import (
	"context"
	"errors"
	"net"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
)

// ResetOnGiveUp wraps a pgconn dial function so that a TCP connection whose
// read or write timed out (pgconn cancels a statement's context that way)
// while the server had not acknowledged all it was sent is reset at once,
// and any other connection that timed out is reset when it closes. A normal
// close keeps retransmitting what the kernel still holds, and pgconn only
// closes after trying a cancel request and draining for up to 15 s, so a
// statement the caller gave up on, stuck behind a partition, would still
// reach the server and run once the network heals: a write committed after
// the caller moved on (a fence armed after its freeze rolled back). A reset
// drops it instead. What the server already received runs either way, as
// it would have.
func ResetOnGiveUp(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok && err == nil {
			return &giveUpConn{TCPConn: tc}, nil
		}
		return c, err
	}
}

// giveUpConn remembers whether an I/O on it timed out.
type giveUpConn struct {
	*net.TCPConn
	timedOut atomic.Bool
}

func (c *giveUpConn) Read(b []byte) (int, error) {
	n, err := c.TCPConn.Read(b)
	c.note(err)
	return n, err
}

func (c *giveUpConn) Write(b []byte) (int, error) {
	n, err := c.TCPConn.Write(b)
	c.note(err)
	return n, err
}

func (c *giveUpConn) note(err error) {
	var ne net.Error
	if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		return
	}
	c.timedOut.Store(true)
	if unacked(c.TCPConn) > 0 {
		_ = c.SetLinger(0)
		_ = c.TCPConn.Close()
	}
}

func (c *giveUpConn) Close() error {
	if c.timedOut.Load() {
		_ = c.SetLinger(0) // close with RST: the unsent bytes are dropped
	}
	return c.TCPConn.Close()
}
