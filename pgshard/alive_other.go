//go:build !unix

package pgshard

// alive cannot peek at a socket on this platform: a backend the server
// closed while it was idle fails the statement that uses it.
func (c *Conn) alive() bool { return true }
