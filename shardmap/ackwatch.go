package shardmap

import (
	"context"
	"fmt"
)

// WatchAcks implements Coordination: a subscription to the channel the
// acknowledgement script publishes on, named like the tree's
// acknowledgements key. The subscription is active when it returns, so no
// acknowledgement written after that goes unsignalled (unless Redis drops
// the connection).
func (s *RedisStore) WatchAcks(ctx context.Context, tenant, tree string) (<-chan struct{}, error) {
	channel := s.acksKey(tenant, tree)
	ps := s.client.Subscribe(ctx, channel)
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		return nil, fmt.Errorf("shardmap: subscribe to %s: %w", channel, err)
	}
	msgs := ps.Channel()
	out := make(chan struct{}, 1)
	go func() {
		defer ps.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-msgs:
				if !ok {
					return
				}
				select {
				case out <- struct{}{}:
				default: // one pending signal says it all: the waiter reads the acknowledgements
				}
			}
		}
	}()
	return out, nil
}
