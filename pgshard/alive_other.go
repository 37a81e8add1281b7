//go:build !unix

package pgshard

import "net"

// alive cannot peek at a socket on this platform: a backend the server
// closed while it was idle fails the statement that uses it.
func (c *Conn) alive() bool { return true }

// quiet cannot peek either: a session is taken as open until a read fails.
func quiet(net.Conn) bool { return true }
