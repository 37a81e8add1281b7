package proxy

import (
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestEncodeRowsConcurrently encodes function rows from several sessions
// at once, as sessions calling lattice functions do: run with -race, a
// type map shared between them is a data race.
func TestEncodeRowsConcurrently(t *testing.T) {
	fields := []pgproto3.FieldDescription{
		{Name: []byte("shard"), DataTypeOID: pgtype.Int4OID},
		{Name: []byte("node"), DataTypeOID: pgtype.TextOID, Format: 1},
		{Name: []byte("rows"), DataTypeOID: pgtype.Int8OID, Format: 1},
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 50 {
				out, err := encodeRows(fields, [][]any{{int32(i), "n1", int64(i)}})
				if err != nil {
					t.Error(err)
					return
				}
				if len(out) != 1 || len(out[0]) != 3 {
					t.Errorf("encoded %v", out)
					return
				}
			}
		})
	}
	wg.Wait()
}
