package rawsock

import (
	"io"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
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

// peerClosed polls the socket fd for the peer's end, without waiting and
// without reading: POLLRDHUP reports a peer that shut its side down even
// while data it sent is still unread (a TLS close_notify, messages it
// pipelined before it died), as PostgreSQL's client_connection_check_interval
// looks for it.
func peerClosed(fd uintptr) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	for {
		n, err := unix.Poll(fds, 0)
		switch {
		case err == unix.EINTR:
		case err != nil || n == 0:
			return false
		default:
			return fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		}
	}
}
