package proxy

import (
	"encoding/binary"
	"testing"
)

func TestClientLineContext(t *testing.T) {
	var lines []byte
	last := int64(0)
	for _, l := range []int64{5, 9, 10, 200000} {
		lines = binary.AppendUvarint(lines, uint64(l-last))
		last = l
	}
	for _, tc := range []struct {
		name, where, want string
		lines             []byte
	}{
		{"first row", `COPY t, line 1: "x	1"`, `COPY t, line 5: "x	1"`, lines},
		{"a column", `COPY t, line 4, column n: "abc"`, `COPY t, line 200000, column n: "abc"`, lines},
		{"after a function's context", "PL/pgSQL function f() line 3 at RAISE\nCOPY t, line 2", "PL/pgSQL function f() line 3 at RAISE\nCOPY t, line 9", lines},
		{"past the rows sent", `COPY t, line 5: "y"`, `COPY t, line 5: "y"`, lines},
		{"no line numbers kept", `COPY t, line 1: "x"`, `COPY t, line 1: "x"`, nil},
		{"no COPY context", `SQL statement "SELECT 1"`, `SQL statement "SELECT 1"`, lines},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := clientLineContext(tc.where, tc.lines); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
