package shardmap

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/alicebob/miniredis/v2"
)

// StartEmbedded runs an in-process Redis-compatible server (miniredis) on a
// free port of 127.0.0.1 and returns its redis:// URL, for `lattice demo` and
// single-machine use without --redis. It keeps everything in memory: the
// maps are gone when the process exits. stop shuts the server down.
//
// Every local user can connect to 127.0.0.1, so the server requires a
// password made at start, known only to this process, which is in the URL.
func StartEmbedded() (url string, stop func(), err error) {
	pw := make([]byte, 24)
	if _, err := rand.Read(pw); err != nil {
		return "", nil, fmt.Errorf("shardmap: embedded redis password: %w", err)
	}
	password := hex.EncodeToString(pw)
	m := miniredis.NewMiniRedis()
	m.RequireAuth(password)
	// miniredis only expires keys when told to; leases and locks with a TTL
	// need expiry to follow the wall clock as in real Redis.
	m.ClockTTL(true)
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return "", nil, fmt.Errorf("shardmap: start embedded redis: %w", err)
	}
	return "redis://:" + password + "@" + m.Addr() + "/0", m.Close, nil
}
