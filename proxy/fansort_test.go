package proxy

import (
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestMayCollate asks the collation probe only when a column can have a
// collation: text-like and unknown types (domains, citext, arrays) may.
func TestMayCollate(t *testing.T) {
	for _, c := range []struct {
		oids []uint32
		want bool
	}{
		{nil, false},
		{[]uint32{pgtype.Int8OID, pgtype.NumericOID, pgtype.TimestamptzOID}, false},
		{[]uint32{pgtype.Int8OID, pgtype.TextOID}, true},
		{[]uint32{pgtype.BPCharOID}, true},
		{[]uint32{pgtype.TextArrayOID}, true},
		{[]uint32{99999}, true},
	} {
		if got := mayCollate(c.oids); got != c.want {
			t.Errorf("mayCollate(%v) = %v, want %v", c.oids, got, c.want)
		}
	}
}
