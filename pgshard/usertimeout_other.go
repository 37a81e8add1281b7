//go:build !linux

package pgshard

import (
	"net"
	"time"
)

// withUserTimeout returns d unchanged: TCP_USER_TIMEOUT is Linux's.
func withUserTimeout(d *net.Dialer, _ time.Duration) *net.Dialer { return d }
