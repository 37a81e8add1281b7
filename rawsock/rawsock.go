// Package rawsock reads and writes a socket with raw system calls. A read
// or write through the net package enters the Go scheduler's syscall state,
// and the runtime's monitor thread hands the P of any call that lasts past
// its 20 µs tick to another thread and keeps ticking every 20 µs while it
// finds such calls. On a virtual machine a loopback write, which delivers
// the segment and wakes its reader inside the call, often lasts that long:
// at a few thousand statements a second the hand-offs and the monitor's
// wakeups cost more CPU than the proxy's own work. The socket is
// non-blocking, so a raw call returns at once, and it waits for readiness
// through the net package's poller as before: deadlines and Close behave
// as on the wrapped connection.
package rawsock

import (
	"net"
	"os"
	"sync"
	"syscall"
)

// Conn is a net.Conn whose Read and Write make raw system calls on the
// wrapped connection's socket; every other method is the wrapped one's.
type Conn struct {
	net.Conn
	raw syscall.RawConn

	// The callbacks given to raw are made once, so a call allocates
	// nothing; the mutexes keep concurrent readers (writers) from sharing
	// the fields a callback reads and sets.
	rmu     sync.Mutex
	rbuf    []byte
	rn      int
	rerr    error
	readFn  func(fd uintptr) bool
	wmu     sync.Mutex
	wbuf    []byte
	wn      int
	werr    error
	writeFn func(fd uintptr) bool
}

// Wrap returns c reading and writing with raw system calls where the
// platform and the connection allow it (a TCP or Unix socket), and c
// itself otherwise.
func Wrap(c net.Conn) net.Conn {
	if !supported {
		return c
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	w := &Conn{Conn: c, raw: raw}
	w.readFn, w.writeFn = w.readOnce, w.writeSome
	return w
}

// SyscallConn returns the wrapped socket's, for code that looks at the
// socket itself (a peek for pending bytes).
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.raw, nil }

// Read reads at most len(b) bytes, waiting for the socket to be readable.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.rbuf, c.rn, c.rerr = b, 0, nil
	err := renameOp(c.raw.Read(c.readFn), "read")
	n := c.rn
	if err == nil {
		err = c.rerr
	}
	c.rbuf, c.rerr = nil, nil
	return n, err
}

// Write writes all of b, waiting for the socket to be writable as needed.
func (c *Conn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wbuf, c.wn, c.werr = b, 0, nil
	var err error
	if len(b) > 0 {
		err = renameOp(c.raw.Write(c.writeFn), "write")
	}
	n := c.wn
	if err == nil {
		err = c.werr
	}
	c.wbuf, c.werr = nil, nil
	return n, err
}

func (c *Conn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(),
		Err: os.NewSyscallError(op, errno)}
}

// renameOp names the poller's errors (a deadline, a closed connection) as
// the wrapped connection would, "read" rather than "raw-read": clients see
// the text.
func renameOp(err error, op string) error {
	if oe, ok := err.(*net.OpError); ok {
		oe.Op = op
	}
	return err
}

// PeerClosed reports whether the peer of c, a connection Wrap made or one
// wrapping such (a TLS connection), has closed, shut down its side of, or
// reset it, data it sent before included, without reading anything: what
// it sent and nobody read yet stays. Where it cannot tell (not a socket,
// another platform) it reports false.
func PeerClosed(c net.Conn) bool {
	for inner := true; inner; {
		switch w := c.(type) {
		case *Conn:
			c = w.Conn
		case interface{ NetConn() net.Conn }:
			c = w.NetConn()
		default:
			inner = false
		}
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	if err := raw.Control(func(fd uintptr) { closed = peerClosed(fd) }); err != nil {
		return false
	}
	return closed
}
