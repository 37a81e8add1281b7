package shardmap

import (
	"encoding/json"
	"testing"
	"time"
)

func TestDecodeEvent(t *testing.T) {
	created := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	mj, err := json.Marshal(NewIdentityMap("app", `a,"map":b`, 16, 2, []string{"n1"}))
	if err != nil {
		t.Fatal(err)
	}
	// As the swap script publishes: the event, its tree's creation time,
	// then the map.
	published := func(ev Event) string {
		head, _ := json.Marshal(ev)
		cj, _ := json.Marshal(created)
		return string(head[:len(head)-1]) + `,"created":` + string(cj) + mapKey + string(mj) + "}"
	}
	mapEvent := Event{Kind: EventMap, Tenant: "app", Tree: `a,"map":b`, Epoch: 1}
	for _, tc := range []struct {
		name    string
		payload string
		want    Event
		carried bool
		wantErr bool
	}{
		{"tree event", `{"kind":"tree","tenant":"app","tree":"t"}`, Event{Kind: EventTree, Tenant: "app", Tree: "t"}, false, false},
		{"map event without a map", `{"kind":"map","tenant":"app","tree":"t","epoch":3}`, Event{Kind: EventMap, Tenant: "app", Tree: "t", Epoch: 3}, false, false},
		{"carried map, the key inside a name", published(mapEvent), mapEvent, true, false},
		{"a map that does not end the event", `{"kind":"map","tenant":"app","tree":"t","map":{}, "x":1`, Event{}, false, true},
		{"malformed", `{"kind":`, Event{}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := decodeEvent(tc.payload)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want an error: %v", err, tc.wantErr)
			}
			c := ev.Carried
			ev.Carried = nil
			if ev != tc.want {
				t.Fatalf("event %+v, want %+v", ev, tc.want)
			}
			if !tc.carried {
				if c != nil {
					t.Fatalf("carries %s", c.Map)
				}
				return
			}
			m, err := c.Decoded()
			if err != nil || string(c.Map) != string(mj) || m.Tree != tc.want.Tree || !c.Created.Equal(created) {
				t.Fatalf("carried %s (%v), created %v", c.Map, err, c.Created)
			}
		})
	}
}
