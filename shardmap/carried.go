package shardmap

import (
	"context"
	"encoding/json"
	"time"
)

// wireEvent is an event as published: a map event of SwapMap also carries
// the map and its tree's creation time.
type wireEvent struct {
	Event
	Created *time.Time      `json:"created,omitempty"`
	Map     json.RawMessage `json:"map,omitempty"`
}

// Decoded is the carried map, decoded.
func (c *CarriedMap) Decoded() (*Map, error) {
	if c.decode != nil {
		return c.decode(c.Map)
	}
	m := new(Map)
	if err := json.Unmarshal(c.Map, m); err != nil {
		return nil, err
	}
	return m, nil
}

func decodeEvent(payload string) (Event, error) {
	var w wireEvent
	if err := json.Unmarshal([]byte(payload), &w); err != nil {
		return Event{}, err
	}
	ev := w.Event
	if ev.Kind == EventMap && len(w.Map) > 0 && w.Created != nil {
		ev.Carried = &CarriedMap{Map: w.Map, Created: *w.Created}
	}
	return ev, nil
}

// installCarried installs the map a map event carries, without reading the
// store, and reports whether the cached map is now at the event's epoch or
// later. It installs nothing when the cached tree is not the one the map
// was written for (dropped and created again) or the map is not the
// event's; the caller then reads the map from the store.
func (c *Cache) installCarried(ctx context.Context, tc *tenantCache, ev Event) bool {
	if ev.Carried == nil {
		return false
	}
	m, err := ev.Carried.Decoded()
	if err != nil || m.Tenant != ev.Tenant || m.Tree != ev.Tree || m.Epoch != ev.Epoch {
		c.log.WarnContext(ctx, "shardmap: a map event carried a map that is not its own; reading the store", "tenant", ev.Tenant, "tree", ev.Tree, "epoch", ev.Epoch, "err", err)
		return false
	}
	tc.mu.Lock()
	defer tc.mu.Unlock()
	old := tc.view.Load()
	if old == nil || old.Trees[ev.Tree] == nil || !old.Trees[ev.Tree].Created.Equal(ev.Carried.Created) {
		return false
	}
	if old.Maps[ev.Tree].Epoch < m.Epoch {
		c.installMap(tc, old, ev.Tree, m)
	}
	return true
}
