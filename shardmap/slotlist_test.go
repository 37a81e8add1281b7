package shardmap

import (
	"encoding/json"
	"slices"
	"testing"
)

// The slot list's JSON is what encoding/json writes and reads for []int, so
// maps stored before it and after it read the same.
func TestSlotListJSONAsInts(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"null", `null`},
		{"empty", `[]`},
		{"one", `[7]`},
		{"several", `[0,0,1,4095,-1]`},
		{"spaces", " [ 1 ,\n2\t, 3 ] "},
		{"spaced empty", `[ ]`},
		{"big", `[9007199254740993]`},
		{"float", `[1.5]`},
		{"exponent", `[1e3]`},
		{"string", `["1"]`},
		{"object", `{"a":1}`},
		{"nested", `[[1]]`},
		{"bool", `[true]`},
		{"null element", `[null]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want []int
			wantErr := json.Unmarshal([]byte(tc.in), &want)
			var got SlotList
			gotErr := json.Unmarshal([]byte(tc.in), &got)
			if (wantErr != nil) != (gotErr != nil) {
				t.Fatalf("error %v, encoding/json's %v", gotErr, wantErr)
			}
			if wantErr != nil {
				return
			}
			if !slices.Equal(got, want) || (got == nil) != (want == nil) {
				t.Fatalf("got %#v, encoding/json %#v", got, want)
			}
			a, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(want)
			if string(a) != string(b) {
				t.Fatalf("writes %s, encoding/json %s", a, b)
			}
		})
	}
}

// A map decoded into a reused Map keeps no slot of the old one.
func TestSlotListReuse(t *testing.T) {
	l := SlotList{9, 9, 9, 9}
	if err := json.Unmarshal([]byte(`[1,2]`), &l); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l, SlotList{1, 2}) {
		t.Fatalf("got %v", l)
	}
}

func FuzzSlotList(f *testing.F) {
	f.Add(`[1,2,3]`)
	f.Add(`[ -0 , 12 ]`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, in string) {
		var want []int
		wantErr := json.Unmarshal([]byte(in), &want)
		var got SlotList
		gotErr := json.Unmarshal([]byte(in), &got)
		if (wantErr != nil) != (gotErr != nil) || wantErr == nil && !slices.Equal(got, want) {
			t.Fatalf("%q: got %v (%v), encoding/json %v (%v)", in, got, gotErr, want, wantErr)
		}
	})
}

// BenchmarkMapDecode decodes a 4096-slot map of 64 shards, with the slot
// table as []int through reflection and as a SlotList, side by side.
func BenchmarkMapDecode(b *testing.B) {
	m := NewIdentityMap("t", "catalogue", 4096, 64, []string{"n1", "n2", "n3"})
	data, err := json.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	type plainMap struct {
		Map
		Slots []int `json:"slots"`
	}
	b.Run("ints", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var p plainMap
			if err := json.Unmarshal(data, &p); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("slotlist", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var p Map
			if err := json.Unmarshal(data, &p); err != nil {
				b.Fatal(err)
			}
		}
	})
}
