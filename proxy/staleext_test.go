package proxy

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestCopyBind: the copy equals the Bind, NULL and empty parameters stay
// apart, and it does not change when the read buffer it came from is
// reused, nor when the copy is made again into another Bind's room.
func TestCopyBind(t *testing.T) {
	cases := []struct {
		name string
		bind pgproto3.Bind
	}{
		{"no parameters", pgproto3.Bind{PreparedStatement: "s"}},
		{"one text parameter", pgproto3.Bind{Parameters: [][]byte{[]byte("42")}, ParameterFormatCodes: []int16{0}}},
		{"null and empty", pgproto3.Bind{Parameters: [][]byte{nil, {}}, ResultFormatCodes: []int16{1}}},
		{"more than fit inline", pgproto3.Bind{DestinationPortal: "p",
			Parameters:           [][]byte{[]byte("a"), []byte("bb"), nil, []byte("ccc"), []byte("d"), {}},
			ParameterFormatCodes: []int16{0, 1, 0, 1, 0, 1}, ResultFormatCodes: []int16{1, 0, 1}}},
		{"bytes beyond the inline arena", pgproto3.Bind{Parameters: [][]byte{[]byte("0123456789abcdef0123456789abcdef"), []byte("x")}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.bind
			// The source as the Backend holds it: its bytes in one buffer.
			src := tc.bind
			src.Parameters = nil
			for _, p := range tc.bind.Parameters {
				if p == nil {
					src.Parameters = append(src.Parameters, nil)
				} else {
					src.Parameters = append(src.Parameters, append([]byte{}, p...))
				}
			}
			src.ParameterFormatCodes = append([]int16(nil), tc.bind.ParameterFormatCodes...)
			src.ResultFormatCodes = append([]int16(nil), tc.bind.ResultFormatCodes...)
			var c boundCopy
			c.copyOf(&pgproto3.Bind{Parameters: [][]byte{[]byte("earlier bind")}, ResultFormatCodes: []int16{1}})
			got := c.copyOf(&src)
			for _, p := range src.Parameters {
				for i := range p {
					p[i] = 'X'
				}
			}
			for i := range src.ParameterFormatCodes {
				src.ParameterFormatCodes[i] = 9
			}
			for i := range src.ResultFormatCodes {
				src.ResultFormatCodes[i] = 9
			}
			if len(got.Parameters) != len(want.Parameters) {
				t.Fatalf("%d parameters, want %d", len(got.Parameters), len(want.Parameters))
			}
			for i, p := range want.Parameters {
				if (p == nil) != (got.Parameters[i] == nil) || string(p) != string(got.Parameters[i]) {
					t.Fatalf("parameter %d = %q (nil %v), want %q (nil %v)", i, got.Parameters[i], got.Parameters[i] == nil, p, p == nil)
				}
			}
			if !reflect.DeepEqual(got.ParameterFormatCodes, want.ParameterFormatCodes) || !reflect.DeepEqual(got.ResultFormatCodes, want.ResultFormatCodes) {
				t.Fatalf("formats %v %v, want %v %v", got.ParameterFormatCodes, got.ResultFormatCodes, want.ParameterFormatCodes, want.ResultFormatCodes)
			}
			if got.PreparedStatement != want.PreparedStatement || got.DestinationPortal != want.DestinationPortal {
				t.Fatalf("names %q %q, want %q %q", got.PreparedStatement, got.DestinationPortal, want.PreparedStatement, want.DestinationPortal)
			}
		})
	}
}

// TestPointBindAllocs: what the extended protocol does for every Bind of a
// point statement allocates nothing of its own: the copy of a Bind of a few
// short parameters (kept for a retry after LT001), and the key under which
// a backend holds the statement.
func TestPointBindAllocs(t *testing.T) {
	m := &pgproto3.Bind{Parameters: [][]byte{[]byte("42"), nil}, ParameterFormatCodes: []int16{0}, ResultFormatCodes: []int16{0}}
	var c boundCopy
	var key []byte
	cases := []struct {
		name string
		run  func()
	}{
		{"copy of a Bind", func() { c.copyOf(m) }},
		{"backend statement key", func() {
			key = appendPreparedKey(key[:0], `SELECT v FROM "lattice_s0001".kv WHERE k = $1`, []uint32{23}, 7)
		}},
	}
	for _, tc := range cases {
		tc.run() // sizes the reused buffers
		if n := testing.AllocsPerRun(100, tc.run); n != 0 {
			t.Errorf("%s: %v allocations, want 0", tc.name, n)
		}
	}
}

// TestPreparedKey: statements differing in text, parameter types or result
// epoch get different keys; a statement without either is its text.
func TestPreparedKey(t *testing.T) {
	keys := map[string]string{}
	for _, tc := range []struct {
		sql   string
		oids  []uint32
		epoch uint64
	}{
		{"SELECT 1", nil, 0},
		{"SELECT 1", nil, 1},
		{"SELECT 1", []uint32{23}, 0},
		{"SELECT 1", []uint32{23}, 1},
		{"SELECT 1", []uint32{2, 3}, 1},
		{"SELECT 1", []uint32{23, 0}, 1},
		{"SELECT 2", nil, 0},
	} {
		k := string(appendPreparedKey([]byte("stale"), tc.sql, tc.oids, tc.epoch)[len("stale"):])
		if prev, dup := keys[k]; dup {
			t.Errorf("%q %v %d: same key as %s", tc.sql, tc.oids, tc.epoch, prev)
		}
		keys[k] = fmt.Sprint(tc.sql, tc.oids, tc.epoch)
		if len(tc.oids) == 0 && tc.epoch == 0 && k != tc.sql {
			t.Errorf("%q: key %q, want the text", tc.sql, k)
		}
	}
}
