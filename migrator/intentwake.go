package migrator

import (
	"context"

	"github.com/lattice-db/lattice/shardmap"
)

// followIntents nudges the coordinator on every intent stored in Redis
// (shardmap.EventIntent), whichever proxy stored it: a lattice_reshard or
// lattice_move_shard that reaches a proxy started with --coordinator=false,
// or one whose intent another proxy's coordinator should take, then starts
// at once rather than at the next tick of some coordinator. Without the
// subscription (Redis unreachable when Run starts) the ticks find every
// intent, only later; a subscription that drops reconnects by itself.
func (c *Coordinator) followIntents(ctx context.Context) {
	events, err := c.store.Subscribe(ctx)
	if err != nil {
		c.log.Warn("coordinator: intents not followed; reshards begin at the next tick", "err", err)
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Kind == shardmap.EventIntent {
				c.Nudge()
			}
		}
	}
}
