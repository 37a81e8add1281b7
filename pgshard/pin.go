package pgshard

// Pin keeps c with the session that holds it: Release leaves a pinned
// backend alone (the session goes on using it across transactions), unless
// it is broken, which closes it as usual. The session must Unpin it once
// its state is gone, after resetting it.
func (p *Pools) Pin(c *Conn) { c.pinned = true }

// Pinned reports whether c is pinned to a session.
func (c *Conn) Pinned() bool { return c.pinned }

// Unpin ends the pin and releases c.
func (p *Pools) Unpin(c *Conn) {
	c.pinned = false
	p.Release(c)
}
