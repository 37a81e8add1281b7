package migrator

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestStreamErrorUndecodable: only an internal error of the walsender (class
// XX: it failed decoding the slot's WAL, and would again) makes the stream
// drop its slot; a shutdown, a lost slot or a missing publication do not.
func TestStreamErrorUndecodable(t *testing.T) {
	for _, tc := range []struct {
		code string
		want bool
	}{
		{"XX000", true}, // could not map filenode "base/…" to relation OID
		{"XX001", true}, // data corrupted
		{"57P01", false},
		{"55000", false},
		{"42704", false},
	} {
		err := streamError(&pgconn.PgError{Code: tc.code, Message: "m"})
		if got := errors.Is(err, errSlotUndecodable); got != tc.want {
			t.Errorf("%s: undecodable %v, want %v (%v)", tc.code, got, tc.want, err)
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != tc.code {
			t.Errorf("%s: the server's error is not kept: %v", tc.code, err)
		}
	}
}
