package proxy

// choices draws the decisions of a generated test case from fuzz input, so
// that the fuzzer's mutations of the input explore the generator's space.
// Once the input is used up every draw is zero: each input gives one case.
type choices struct{ b []byte }

func (c *choices) byte() byte {
	if len(c.b) == 0 {
		return 0
	}
	v := c.b[0]
	c.b = c.b[1:]
	return v
}

// intn is a draw in [0, n).
func (c *choices) intn(n int) int {
	if n <= 1 {
		return 0
	}
	v := int(c.byte())
	if n > 256 {
		v = v<<8 | int(c.byte())
	}
	return v % n
}

func (c *choices) bool() bool { return c.byte()&1 == 1 }

func (c *choices) bytes(n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = c.byte()
	}
	return out
}

// pick is one of opts.
func pick[T any](c *choices, opts ...T) T { return opts[c.intn(len(opts))] }
