package proxy

import (
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestCopyBind: the copy equals the Bind, NULL and empty parameters stay
// apart, and it does not change when the read buffer it came from is
// reused.
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
			got := copyBind(&src)
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
