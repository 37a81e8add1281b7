package btreeindex

import (
	"context"
	"errors"
	"testing"
)

// fakeSource is a RowSource over rows in memory. Like a backend cursor it
// hands out each row in one buffer that the next call overwrites, so a
// merge that used a row past its validity would see it change.
type fakeSource struct {
	t      *testing.T
	name   string
	cols   []Column
	rows   [][][]byte
	failAt int   // the 0-based call of Next that returns err; -1 never
	err    error // what Next returns at failAt
	cerr   error // what Close returns

	calls  int      // calls of Next
	pos    int      // rows returned
	ended  bool     // returned its end
	failed bool     // returned err
	closed int      // calls of Close
	buf    []byte   // the current row's bytes
	cur    [][]byte // the current row, slices of buf
}

// ctxKey marks the context a test passes, to check it reaches the sources.
type ctxKey struct{}

func (f *fakeSource) Next(ctx context.Context) ([][]byte, error) {
	f.t.Helper()
	if ctx.Value(ctxKey{}) == nil {
		f.t.Errorf("%s: Next without the caller's context", f.name)
	}
	if f.closed > 0 {
		f.t.Errorf("%s: Next after Close", f.name)
	}
	if f.ended || f.failed {
		f.t.Errorf("%s: Next after its end or failure", f.name)
	}
	call := f.calls
	f.calls++
	if err := ctx.Err(); err != nil {
		f.failed = true
		return nil, err
	}
	if call == f.failAt {
		f.failed = true
		return nil, f.err
	}
	// Overwrite what the previous call returned.
	for i := range f.buf {
		f.buf[i] = '#'
	}
	if f.pos == len(f.rows) {
		f.ended = true
		return nil, nil
	}
	row := f.rows[f.pos]
	f.pos++
	if f.buf == nil {
		f.buf = make([]byte, 0, 64) // never nil: an empty value is not NULL
	}
	f.buf = f.buf[:0]
	for _, v := range row {
		f.buf = append(f.buf, v...)
	}
	f.cur = make([][]byte, len(row))
	at := 0
	for i, v := range row {
		if v != nil {
			f.cur[i] = f.buf[at : at+len(v) : at+len(v)]
			at += len(v)
		}
	}
	return f.cur, nil
}

func (f *fakeSource) Columns() []Column {
	if f.pos == 0 {
		f.t.Errorf("%s: Columns before its first row", f.name)
	}
	return f.cols
}

func (f *fakeSource) Close(context.Context) error {
	if f.ended {
		f.t.Errorf("%s: Close after its end", f.name)
	}
	f.closed++
	return f.cerr
}

// textRows makes rows of text values; "NULL" is a NULL.
func textRows(rows ...[]string) [][][]byte {
	out := make([][][]byte, len(rows))
	for i, r := range rows {
		out[i] = make([][]byte, len(r))
		for j, v := range r {
			if v != "NULL" {
				out[i][j] = append([]byte{}, v...) // not nil, even when empty
			}
		}
	}
	return out
}

func newFake(t *testing.T, name string, cols []Column, rows [][][]byte) *fakeSource {
	return &fakeSource{t: t, name: name, cols: cols, rows: rows, failAt: -1}
}

// drain reads m to its end or error, copying each row (as a text line of
// its values joined by "|") before the next call.
func drain(t *testing.T, ctx context.Context, m *Merge) ([]string, error) {
	t.Helper()
	var out []string
	for range 1 << 20 {
		row, err := m.Next(ctx)
		if err != nil {
			return out, err
		}
		if row == nil {
			// The end stays the end.
			if again, err := m.Next(ctx); again != nil || err != nil {
				t.Errorf("Next after the end = %q, %v", again, err)
			}
			return out, nil
		}
		line := ""
		for i, v := range row {
			if i > 0 {
				line += "|"
			}
			if v == nil {
				line += "NULL"
			} else {
				line += string(v)
			}
		}
		out = append(out, line)
	}
	t.Fatal("the merge does not end")
	return nil, nil
}

func testCtx() context.Context {
	return context.WithValue(context.Background(), ctxKey{}, true)
}

var errBoom = errors.New("boom")
