package shardmap

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// wireEvent is an event as published: a map event of SwapMap also carries
// the map and its tree's creation time. The swap script appends the map
// last, as `,"map":<map>}`.
type wireEvent struct {
	Event
	Created *time.Time `json:"created,omitempty"`
}

// mapKey is where a carried map begins. It cannot occur earlier in the
// event: a quote inside a JSON string is always escaped.
const mapKey = `,"map":`

// Decoded is the carried map, decoded.
func (c *CarriedMap) Decoded() (*Map, error) {
	if c.decode != nil {
		return c.decode(c.Map)
	}
	return decodeMap(c.Map)
}

// decodeEvent reads an event. A carried map is cut out, not parsed: its
// JSON is read (once) only by a cache that installs it, and the proxy that
// wrote it finds it kept (decodedMaps); the event itself is a few fields.
func decodeEvent(payload string) (Event, error) {
	head, carried, hasMap := strings.Cut(payload, mapKey)
	if hasMap {
		var ok bool
		if carried, ok = strings.CutSuffix(carried, "}"); !ok {
			return Event{}, errors.New("a carried map that does not end the event")
		}
		head += "}"
	}
	var w wireEvent
	if err := json.Unmarshal([]byte(head), &w); err != nil {
		return Event{}, err
	}
	ev := w.Event
	if ev.Kind == EventMap && carried != "" && w.Created != nil {
		ev.Carried = &CarriedMap{Map: []byte(carried), Created: *w.Created}
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
