package proxy

import (
	"bytes"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// A statement of more than 65,535 parameters is described to the client as
// PostgreSQL describes it, rather than failing the encode and so the session.
func TestWideParameterDescription(t *testing.T) {
	for _, n := range []int{0, 3, maxWireCount, maxWireCount + 1, 70000} {
		pd := &pgproto3.ParameterDescription{ParameterOIDs: make([]uint32, n)}
		for i := range pd.ParameterOIDs {
			pd.ParameterOIDs[i] = uint32(i + 1)
		}
		var out bytes.Buffer
		b := pgproto3.NewBackend(bytes.NewReader(nil), &out)
		s := &session{client: b}
		s.send(pd)
		if err := s.client.Flush(); err != nil {
			t.Fatalf("%d parameters: %v", n, err)
		}
		msg, err := pgproto3.NewFrontend(&out, io.Discard).Receive()
		if err != nil {
			t.Fatalf("%d parameters: %v", n, err)
		}
		got := msg.(*pgproto3.ParameterDescription).ParameterOIDs
		if len(got) != n || n > 0 && got[n-1] != uint32(n) {
			t.Fatalf("%d parameters: decoded %d", n, len(got))
		}
	}
}
