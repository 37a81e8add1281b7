package shardmap

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/lattice-db/lattice/sqlstate"
)

// TestUnavailableSQLState checks a store out of reach reaches a client as
// 58000 with a hint, and a node's network error does not.
func TestUnavailableSQLState(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		code     string
		withHint bool
	}{
		{"store out of reach", fmt.Errorf("shardmap: read tree: %w", &UnavailableError{Err: syscall.ECONNREFUSED}), "58000", true},
		{"a node's network error", fmt.Errorf("node n1: %w", syscall.ECONNREFUSED), "XX000", false},
	} {
		e := sqlstate.As(tc.err)
		if e.Code != tc.code || (e.Hint != "") != tc.withHint || e.Message != tc.err.Error() {
			t.Errorf("%s: As = %+v, want code %s, hint %v and the whole message", tc.name, e, tc.code, tc.withHint)
		}
	}
}
