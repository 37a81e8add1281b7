package shardmap

import (
	"context"
	"fmt"
	"time"
)

// subscriber is the part of a store that follow needs.
type subscriber interface {
	Subscribe(ctx context.Context) (<-chan Event, error)
}

// follow subscribes to s's events and calls onEvent for each, and onTick
// every refresh, until ctx ends; then it returns nil. It fails only if it
// cannot subscribe at all: after that the subscription reconnects by
// itself, and the ticks re-read what a lost event would have told. The
// cache and the node watch follow the store this one way.
func follow(ctx context.Context, s subscriber, refresh time.Duration, who string, onEvent func(Event), onTick func()) error {
	events, err := s.Subscribe(ctx)
	if err != nil {
		return fmt.Errorf("shardmap: %s: %w", who, err)
	}
	tick := time.NewTicker(refresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return nil // closed only when ctx ends
			}
			onEvent(ev)
		case <-tick.C:
			onTick()
		}
	}
}
