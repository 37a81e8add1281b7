package shardmap

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
)

// benchMap is a map of 4,096 slots over 128 shards, a tree resharded to 128.
func benchMap() *Map {
	m := &Map{Tenant: "lattice", Tree: "catalogue", Epoch: 812, Slots: make(SlotList, 4096), Shards: map[int]Shard{}, HighWater: 130,
		Frozen: [][2]int{{64, 95}}, Freezing: [][2]int{{96, 127}}}
	for i := range m.Slots {
		m.Slots[i] = i / 32
	}
	for i := range 128 {
		m.Shards[i] = Shard{Index: i, Node: "n" + string(rune('1'+i%3)), State: ShardActive, Mixed: i == 2}
	}
	m.Shards[128] = Shard{Index: 128, Node: "n2", State: ShardRetired}
	return m
}

// checkDecode holds decodeMap to encoding/json on in.
func checkDecode(t *testing.T, in []byte) {
	t.Helper()
	want := new(Map)
	wantErr := json.Unmarshal(in, want)
	got, gotErr := decodeMap(in)
	if (wantErr != nil) != (gotErr != nil) {
		t.Fatalf("%q: error %v, encoding/json's %v", in, gotErr, wantErr)
	}
	if wantErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: decoded %+v, encoding/json %+v", in, got, want)
	}
}

// checkEncode holds encodeMap to json.Marshal on m, and decodeMap to m.
func checkEncode(t *testing.T, m *Map) {
	t.Helper()
	want, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if got := encodeMap(m); string(got) != string(want) {
		t.Fatalf("encoded\n%s\nencoding/json\n%s", got, want)
	}
	checkDecode(t, want)
}

func TestMapJSONAsEncodingJSON(t *testing.T) {
	checkEncode(t, benchMap())
	checkEncode(t, &Map{})
	checkEncode(t, &Map{Tenant: `a"<b>&\`, Tree: "é\x01\u2028", Slots: SlotList{}, Shards: map[int]Shard{-3: {Node: "x<"}}, Frozen: [][2]int{}})
	for _, in := range []string{
		`{}`,
		` {"tenant":"t" , "tree" : "x","epoch":3,"slots":[ 1 ,2],"shards":{"7":{"index":7,"node":"n1","state":"active","mixed":false}},"high_water":8} `,
		`{"slots":[]}`, `{"shards":{}}`, `{"frozen":[]}`, `{"frozen":[[1,2],[3,4]]}`,
		`{"slots":null}`, `{"shards":null}`, `{"tenant":null}`, `{"frozen":[null]}`,
		`{"Tenant":"x"}`, `{"TREE":"x"}`, `{"shards":{"1":{"Index":1}}}`, `{"unknown":[1,{"a":null}]}`,
		`{"tenant":"a","tenant":"b"}`, `{"slots":[1],"slots":[2,3]}`, `{"shards":{"1":{"node":"a"},"1":{"index":2}}}`,
		`{"shards":{"1":{"node":"a","node":"b"}}}`,
		`{"shards":{"+1":{}}}`, `{"shards":{"01":{}}}`, `{"shards":{"-0":{}}}`, `{"shards":{" 1":{}}}`, `{"shards":{"x":{}}}`,
		`{"shards":{"99999999999999999999":{}}}`,
		`{"epoch":-1}`, `{"epoch":-0}`, `{"high_water":-0}`, `{"epoch":01}`, `{"epoch":1.0}`, `{"epoch":1e2}`, `{"epoch":"1"}`,
		`{"epoch":18446744073709551615}`, `{"epoch":18446744073709551616}`, `{"high_water":123456789012345678901}`,
		`{"frozen":[[1]]}`, `{"frozen":[[1,2,3]]}`, `{"frozen":[1,2]}`,
		`{"tenant":"a\"b"}`, `{"tenant":"a\u0041"}`, `{"tenant":"é"}`, "{\"tenant\":\"a\x01\"}", "{\"tenant\":\"\xff\"}",
		`{"shards":{"1":{"mixed":true}}}`, `{"shards":{"1":{"mixed":tru}}}`, `{"shards":{"1":{"mixed":1}}}`,
		`{"tenant":"a",}`, `{"tenant":"a"} x`, `{"tenant":"a"`, `[]`, `null`, ``, `{"slots":[1,]}`, `{"slots":[,1]}`,
	} {
		checkDecode(t, []byte(in))
	}
}

// FuzzMapJSON holds decodeMap to encoding/json on any input, and encodeMap
// to json.Marshal on maps built from the input.
func FuzzMapJSON(f *testing.F) {
	f.Add(encodeMap(benchMap()))
	f.Add([]byte(`{"tenant":"t","tree":"x","epoch":3,"slots":[1,2],"shards":{"7":{"index":7,"node":"n1","state":"active","mixed":true}},"high_water":8,"frozen":[[0,1]]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		checkDecode(t, in)
		checkEncode(t, mapFrom(in))
	})
}

// mapFrom builds a map from fuzz input: its bytes seed the numbers, and
// slices of it name the tenant, tree and nodes.
func mapFrom(in []byte) *Map {
	var seed [32]byte
	copy(seed[:], in)
	rng := rand.New(rand.NewChaCha8(seed))
	str := func() string {
		if len(in) == 0 {
			return ""
		}
		i := rng.IntN(len(in))
		return string(in[i:min(len(in), i+rng.IntN(8))])
	}
	num := func() int { return rng.IntN(1<<20) - 1<<10 }
	m := &Map{Tenant: str(), Tree: str(), Epoch: rng.Uint64(), HighWater: num()}
	if rng.IntN(4) > 0 {
		m.Slots = make(SlotList, rng.IntN(64))
		for i := range m.Slots {
			m.Slots[i] = num()
		}
	}
	if rng.IntN(4) > 0 {
		m.Shards = map[int]Shard{}
		for range rng.IntN(16) {
			m.Shards[num()] = Shard{Index: num(), Node: str(), State: ShardState(str()), Mixed: rng.IntN(2) == 0}
		}
	}
	for _, rs := range []*[][2]int{&m.Frozen, &m.Freezing} {
		for range rng.IntN(3) {
			*rs = append(*rs, [2]int{num(), num()})
		}
	}
	return m
}

// BenchmarkMapJSON compares the map's codec with encoding/json, side by side.
func BenchmarkMapJSON(b *testing.B) {
	m := benchMap()
	raw := encodeMap(m)
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			encodeMap(m)
		}
	})
	b.Run("encode-encoding-json", func(b *testing.B) {
		for b.Loop() {
			_, _ = json.Marshal(m)
		}
	})
	b.Run("decode", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeMap(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode-encoding-json", func(b *testing.B) {
		for b.Loop() {
			if err := json.Unmarshal(raw, new(Map)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
