//go:build linux

package pgshard

import (
	"net"

	"golang.org/x/sys/unix"
)

// unacked returns how many bytes written to c the peer has not yet
// acknowledged (SIOCOUTQ), or -1 when it cannot tell.
func unacked(c *net.TCPConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1
	}
	n := -1
	_ = raw.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ); err == nil {
			n = v
		}
	})
	return n
}
