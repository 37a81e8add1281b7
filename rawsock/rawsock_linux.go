package rawsock

import (
	"io"
	"syscall"
	"unsafe"
)

const supported = true

// readOnce reads once into c.rbuf; false asks the poller to wait for
// readability and call again.
func (c *Conn) readOnce(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&c.rbuf[0])), uintptr(len(c.rbuf)))
		switch e {
		case 0:
			c.rn = int(n)
			if n == 0 {
				c.rerr = io.EOF
			}
			return true
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.rerr = c.opError("read", e)
			return true
		}
	}
}

// writeSome writes what is left of c.wbuf; false asks the poller to wait
// for writability and call again.
func (c *Conn) writeSome(fd uintptr) bool {
	for c.wn < len(c.wbuf) {
		rest := c.wbuf[c.wn:]
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&rest[0])), uintptr(len(rest)))
		switch e {
		case 0:
			c.wn += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.werr = c.opError("write", e)
			return true
		}
	}
	return true
}

// peerClosed peeks at the socket fd without taking data: an end of
// stream or a reset means the peer is gone; data waiting, or none yet
// (EAGAIN), means it is still there.
func peerClosed(fd uintptr) bool {
	var b [1]byte
	for {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch err {
		case nil:
			return n == 0
		case syscall.EINTR:
		case syscall.ECONNRESET, syscall.EPIPE, syscall.ENOTCONN:
			return true
		default:
			return false
		}
	}
}
