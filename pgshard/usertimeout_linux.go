//go:build linux

package pgshard

import (
	"net"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// withUserTimeout makes d's TCP sockets give up on data the node has not
// acknowledged for t (TCP_USER_TIMEOUT): the kernel stops retransmitting
// and fails the socket, so bytes held back by a partition cannot reach the
// node later than t after they were sent (docs/DESIGN.md section 12).
func withUserTimeout(d *net.Dialer, t time.Duration) *net.Dialer {
	d.Control = func(network, _ string, c syscall.RawConn) error {
		if !strings.HasPrefix(network, "tcp") {
			return nil
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(t.Milliseconds()))
		}); err != nil {
			return err
		}
		return serr
	}
	return d
}
