package shardmap

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The proxies' deadlock detectors see a cycle through another proxy's
// session only if they know which backends on the nodes belong to it: each
// proxy that holds a transaction over several nodes shares its backends,
// once a second, in the hash P:lock-holders (field: proxy id, value: the
// time in Unix milliseconds, a space, the proxy's payload).

func (s *RedisStore) lockHoldersKey() string { return s.prefix + ":lock-holders" }

// lockHoldersGone is the age past which an entry is deleted: its proxy
// stopped sharing (it ended, or holds nothing across nodes any more).
const lockHoldersGone = time.Minute

// ShareLockHolders stores mine (if not empty) as proxyID's entry and
// returns the other proxies' payloads that are younger than fresh.
func (s *RedisStore) ShareLockHolders(ctx context.Context, proxyID string, mine []byte, fresh time.Duration) ([][]byte, error) {
	now := time.Now()
	if len(mine) > 0 {
		v := strconv.FormatInt(now.UnixMilli(), 10) + " " + string(mine)
		if err := s.client.HSet(ctx, s.lockHoldersKey(), proxyID, v).Err(); err != nil {
			return nil, fmt.Errorf("shardmap: share lock holders: %w", err)
		}
	}
	all, err := s.client.HGetAll(ctx, s.lockHoldersKey()).Result()
	if err != nil {
		return nil, fmt.Errorf("shardmap: read lock holders: %w", err)
	}
	var out [][]byte
	for id, v := range all {
		at, payload, ok := strings.Cut(v, " ")
		ms, err := strconv.ParseInt(at, 10, 64)
		age := now.Sub(time.UnixMilli(ms))
		switch {
		case !ok || err != nil || age > lockHoldersGone:
			s.client.HDel(ctx, s.lockHoldersKey(), id)
		case id != proxyID && age <= fresh:
			out = append(out, []byte(payload))
		}
	}
	return out, nil
}
