//go:build !linux

package pgshard

import "net"

// unacked cannot tell here; the reset waits for the close.
func unacked(*net.TCPConn) int { return -1 }
