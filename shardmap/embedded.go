package shardmap

import (
	"fmt"

	"github.com/alicebob/miniredis/v2"
)

// StartEmbedded runs an in-process Redis-compatible server (miniredis) on a
// free port of 127.0.0.1 and returns its redis:// URL, for `lattice demo` and
// single-machine use without --redis. It keeps everything in memory: the
// maps are gone when the process exits. stop shuts the server down.
func StartEmbedded() (url string, stop func(), err error) {
	m := miniredis.NewMiniRedis()
	// miniredis only expires keys when told to; leases and locks with a TTL
	// need expiry to follow the wall clock as in real Redis.
	m.ClockTTL(true)
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return "", nil, fmt.Errorf("shardmap: start embedded redis: %w", err)
	}
	return "redis://" + m.Addr() + "/0", m.Close, nil
}
