//go:build unix

package pgshard

import (
	"errors"
	"net"
	"syscall"
)

// alive reports whether the backend's socket is open with nothing unread.
// A backend idle in the pool has nothing to say, so pending bytes (the
// FATAL a server sends before it closes a connection at shutdown) or the
// end of the stream mean the server is gone. It peeks without blocking and
// consumes nothing.
func (c *Conn) alive() bool { return quiet(c.net) }

// quiet reports whether nc is open with nothing to read, without blocking
// and consuming nothing: for a session the peer has nothing to say on, the
// only healthy answer.
func quiet(nc net.Conn) bool {
	if u, ok := nc.(interface{ NetConn() net.Conn }); ok { // TLS
		nc = u.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true // cannot tell: let the statement find out
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var buf [1]byte
	var peekErr error
	// Control, not Read: Read takes the descriptor's read lock, which a
	// reader blocked on the same socket holds (pgconn's background reader
	// can sit in a read on an idle session), and the peek would wait for
	// it forever. A peek without waiting consumes nothing, so it needs no
	// lock.
	if err := raw.Control(func(fd uintptr) {
		_, _, peekErr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); err != nil {
		return false
	}
	// Nothing to read yet is the only healthy answer; a nil error is data
	// or, with 0 bytes, the end of the stream.
	return errors.Is(peekErr, syscall.EAGAIN) || errors.Is(peekErr, syscall.EWOULDBLOCK)
}
