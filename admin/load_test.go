package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// oneTree is a Catalog of one tree with a map of 4 shards on 2 nodes.
type oneTree struct {
	t *shardmap.Tree
	m *shardmap.Map
}

func (c oneTree) Trees(context.Context, string) ([]*shardmap.Tree, error) {
	return []*shardmap.Tree{c.t}, nil
}

func (c oneTree) Tree(_ context.Context, _, name string) (*shardmap.Tree, error) {
	if name != c.t.Name {
		return nil, shardmap.ErrNotFound
	}
	return c.t, nil
}

func (c oneTree) Map(context.Context, string, string) (*shardmap.Map, error) { return c.m, nil }

func (c oneTree) Migrations(context.Context, string, string) ([]*shardmap.Migration, error) {
	return nil, nil
}

// fixedLoad answers every tree with the same slots' rates.
type fixedLoad map[int]shardmap.SlotRate

func (f fixedLoad) TreeLoad(_ context.Context, tenant, tree string, slots int, now time.Time) (*shardmap.TreeLoad, error) {
	l := &shardmap.TreeLoad{Tenant: tenant, Tree: tree, From: now.Add(-shardmap.LoadWindow), To: now, Slots: make([]shardmap.SlotRate, slots)}
	for s, r := range f {
		l.Slots[s] = r
	}
	return l, nil
}

// TestLoadAPI reads the load rates per slot, shard and node, and per
// shard in the shard list.
func TestLoadAPI(t *testing.T) {
	tree := &shardmap.Tree{Tenant: "main", Name: "t", SlotCount: 16}
	m := shardmap.NewIdentityMap("main", "t", 16, 4, []string{"n1", "n2"})
	load := fixedLoad{1: {Writes: 10, Rows: 20}, 2: {Writes: 5}, 13: {Reads: 3}}
	api := &API{Catalog: oneTree{tree, m}, Resharder: &fakeResharder{}, Self: fakeSelf{},
		Sizes: NewSizeCache(noSizes, time.Second, time.Second, nopLog()), Log: nopLog(), Load: load}
	s := &Server{Log: nopLog(), API: api}
	get := func(path string, v any) {
		t.Helper()
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}

	var li LoadInfo
	get("/api/trees/t/load", &li)
	if len(li.Writes) != 16 || li.Writes[1] != 10 || li.Rows[1] != 20 || li.Writes[2] != 5 || li.Reads[13] != 3 || li.Writes[0] != 0 {
		t.Fatalf("per slot: %+v", li)
	}
	wantShards := []ShardLoad{
		{0, "n1", shardmap.SlotRate{Writes: 15, Rows: 20}},
		{1, "n2", shardmap.SlotRate{}},
		{2, "n1", shardmap.SlotRate{}},
		{3, "n2", shardmap.SlotRate{Reads: 3}},
	}
	if len(li.Shards) != len(wantShards) {
		t.Fatalf("shards %+v", li.Shards)
	}
	for i, w := range wantShards {
		if li.Shards[i] != w {
			t.Errorf("shard %d: %+v, want %+v", i, li.Shards[i], w)
		}
	}
	if len(li.Nodes) != 2 || li.Nodes[0] != (NodeLoad{"n1", shardmap.SlotRate{Writes: 15, Rows: 20}}) || li.Nodes[1] != (NodeLoad{"n2", shardmap.SlotRate{Reads: 3}}) {
		t.Fatalf("nodes %+v", li.Nodes)
	}

	var shards []ShardInfo
	get("/api/trees/t/shards", &shards)
	if len(shards) != 4 || shards[0].Load == nil || *shards[0].Load != (shardmap.SlotRate{Writes: 15, Rows: 20}) {
		t.Fatalf("shard list %+v", shards)
	}

	// Without a load signal the rates are left out.
	api.Load = nil
	get("/api/trees/t/shards", &shards)
	if shards[0].Load != nil {
		t.Fatalf("load without a signal: %+v", shards[0].Load)
	}
	get("/api/trees/t/load", &li)
	if len(li.Writes) != 16 || li.Writes[1] != 0 {
		t.Fatalf("load without a signal: %+v", li)
	}
}
