package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// starvingReader serves data, then tells starved and blocks forever, as a
// client that stopped sending does.
type starvingReader struct {
	data    []byte
	starved chan struct{}
}

func (r *starvingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		close(r.starved)
		select {}
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func header(typ byte, body int) []byte {
	return binary.BigEndian.AppendUint32([]byte{typ}, uint32(body+4))
}

func TestBodyReaderPassesMessages(t *testing.T) {
	big := strings.Repeat("x", 3*smallBody+17)
	msgs := []pgproto3.FrontendMessage{&pgproto3.Query{String: "SELECT 1"}, &pgproto3.Query{String: big}, &pgproto3.Sync{}, &pgproto3.Query{String: "SELECT 2"}}
	budget := NewBudget(1 << 20)
	br := newBodyReader(bytes.NewReader(encode(msgs...)), budget)
	b := pgproto3.NewBackend(br, io.Discard)
	for i, want := range msgs {
		got, err := b.Receive()
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		wq, _ := want.(*pgproto3.Query)
		if gq, ok := got.(*pgproto3.Query); ok != (wq != nil) || ok && gq.String != wq.String {
			t.Fatalf("message %d: got %T, want %T", i, got, want)
		}
	}
	br.release()
	if u := budget.Used(); u != 0 {
		t.Fatalf("budget still charged %d bytes after the session", u)
	}
}

// TestBodyReaderAllocatesAsBodyArrives: a header that claims 32 MB and a
// client that then falls silent costs what it sent, not what it claimed.
func TestBodyReaderAllocatesAsBodyArrives(t *testing.T) {
	const claimed = 32 << 20
	r := &starvingReader{data: append(header('Q', claimed), make([]byte, 1000)...), starved: make(chan struct{})}
	budget := NewBudget(1 << 30)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b := pgproto3.NewBackend(newBodyReader(r, budget), io.Discard)
	b.SetMaxBodyLen(64 << 20)
	go b.Receive()
	<-r.starved
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
		t.Fatalf("allocated %d bytes for a message whose first 1000 bytes arrived", grew)
	}
	if u := budget.Used(); u > 64<<10 {
		t.Fatalf("budget charged %d bytes", u)
	}
}

func TestBodyReaderBudget(t *testing.T) {
	budget := NewBudget(1 << 20)
	over := append(header('Q', 2<<20), make([]byte, 2<<20)...)
	b := pgproto3.NewBackend(newBodyReader(bytes.NewReader(over), budget), io.Discard)
	_, err := b.Receive()
	var e *sqlstate.Error
	if !errors.As(err, &e) || e.Code != sqlstate.OutOfMemory || !strings.Contains(e.Hint, "--max-message-memory") {
		t.Fatalf("a message over the budget: %v, want 53200 naming --max-message-memory", err)
	}
	if u := budget.Used(); u != 0 {
		t.Fatalf("a refused message left %d bytes charged", u)
	}
	// Another session's large message fits.
	q := &pgproto3.Query{String: strings.Repeat("y", 200<<10)}
	b2 := pgproto3.NewBackend(newBodyReader(bytes.NewReader(encode(q)), budget), io.Discard)
	if _, err := b2.Receive(); err != nil {
		t.Fatalf("a message within the budget: %v", err)
	}
}

// TestBodyReaderOversizeHeader: a length over the Backend's bound reaches
// the Backend unread, which refuses it (08P01 in the session).
func TestBodyReaderOversizeHeader(t *testing.T) {
	r := &starvingReader{data: header('Q', 1<<30), starved: make(chan struct{})}
	budget := NewBudget(1 << 20)
	br := newBodyReader(r, budget)
	b := pgproto3.NewBackend(br, io.Discard)
	setMaxBody(b, br, 64<<20)
	var tooBig *pgproto3.ExceededMaxBodyLenErr
	if _, err := b.Receive(); !errors.As(err, &tooBig) {
		t.Fatalf("got %v, want ExceededMaxBodyLenErr", err)
	}
}

// TestBodyReaderOversizeDiscard: after a message over the Backend's bound,
// what the session discards from the connection (its body less what the
// read buffer holds of it) is exactly what is left there, so the client
// is read to the end of its message and then told why it is cut off.
func TestBodyReaderOversizeDiscard(t *testing.T) {
	const body = 100 << 10
	conn := bytes.NewReader(append(header('Q', body), bytes.Repeat([]byte("z"), body)...))
	br := newBodyReader(conn, NewBudget(1<<20))
	b := pgproto3.NewBackend(br, io.Discard)
	setMaxBody(b, br, 64<<10)
	var tooBig *pgproto3.ExceededMaxBodyLenErr
	if _, err := b.Receive(); !errors.As(err, &tooBig) {
		t.Fatalf("got %v, want ExceededMaxBodyLenErr", err)
	}
	if left, discard := conn.Len(), tooBig.ActualBodyLen-br.dropBuffered(); discard != left {
		t.Fatalf("the session would discard %d bytes; %d are left on the connection", discard, left)
	}
}
