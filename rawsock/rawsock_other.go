//go:build !linux

package rawsock

const supported = false

func (c *Conn) readOnce(uintptr) bool  { return true }
func (c *Conn) writeSome(uintptr) bool { return true }

func peerClosed(uintptr) bool { return false }
