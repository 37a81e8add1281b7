package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/sqlstate"
)

// readPipe reads pr to its end and returns what it read, how many Reads
// returned data, and the error that ended it (nil at EOF).
func readPipe(pr *io.PipeReader) ([]byte, int, error) {
	var got bytes.Buffer
	buf := make([]byte, 64<<10)
	reads := 0
	for {
		n, err := pr.Read(buf)
		if n > 0 {
			reads++
			got.Write(buf[:n])
		}
		if err == io.EOF {
			return got.Bytes(), reads, nil
		}
		if err != nil {
			return got.Bytes(), reads, err
		}
	}
}

// TestCopyOut checks that pgshard.CopyOut, which every shadow copy, merge
// and tree creation pipes through, hands a COPY TO to its pipe in batches
// rather than a row at a time (one message and one system call per row at
// the COPY FROM end), loses nothing, and passes a source's error on.
func TestCopyOut(t *testing.T) {
	ctx := context.Background()
	src := connect(t, testNodeDSN(t, 0))
	defer src.Close(ctx)
	const rows = 20000
	for _, tc := range []struct {
		name  string
		sql   string
		state string // the error the reader must see; "" for EOF
	}{
		{"whole", fmt.Sprintf("COPY (SELECT g, md5(g::text) FROM generate_series(1, %d) g) TO STDOUT (FORMAT binary)", rows), ""},
		{"error mid-stream", fmt.Sprintf("COPY (SELECT g, 1 / (g - 15000) FROM generate_series(1, %d) g) TO STDOUT (FORMAT binary)", rows), "22012"}, // division_by_zero
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want []byte
			if tc.state == "" {
				var n int64
				var err error
				if want, n, err = copyTo(src, tc.sql); err != nil || n != rows {
					t.Fatalf("reference copy: %d rows, %v", n, err)
				}
			}
			pr, pw := io.Pipe()
			type result struct {
				rows int64
				err  error
			}
			done := make(chan result, 1)
			go func() {
				tag, err := pgshard.CopyOut(ctx, src.PgConn(), pw, tc.sql)
				done <- result{tag.RowsAffected(), err}
			}()
			got, reads, readErr := readPipe(pr)
			res := <-done
			if tc.state != "" {
				if !sqlstate.Is(readErr, tc.state) || !sqlstate.Is(res.err, tc.state) {
					t.Fatalf("reader saw %v, CopyOut returned %v; want SQLSTATE %s in both", readErr, res.err, tc.state)
				}
				return
			}
			if readErr != nil || res.err != nil || res.rows != rows {
				t.Fatalf("reader: %v; CopyOut: %d rows, %v", readErr, res.rows, res.err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("piped %d bytes that differ from the %d of a plain COPY TO", len(got), len(want))
			}
			// A Read per 32 KiB at most, where a row at a time would be 20,000.
			if limit := len(want)/(32<<10) + 2; reads > limit {
				t.Fatalf("%d bytes reached the pipe in %d reads; want at most %d", len(want), reads, limit)
			}
		})
	}
}
