package pgshard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// copyServer is a fakeServer whose Queries serve answers, and a
// connection to it.
func copyServer(t *testing.T, serve func(be *pgproto3.Backend) error) *pgconn.PgConn {
	t.Helper()
	addr := fakeServer(t, serve)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgconn.Connect(ctx, "postgres://u@"+addr+"/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// copyOutServer sends rows rows of COPY TO data, one CopyData message a
// row as PostgreSQL does, failing with SQLSTATE 22012 after failAt rows if
// failAt > 0. With rows < 0 it sends until the client goes, so the copy
// can end only by the client's abort.
func copyOutServer(t *testing.T, rows, failAt int) *pgconn.PgConn {
	return copyServer(t, func(be *pgproto3.Backend) error {
		be.Send(&pgproto3.CopyOutResponse{})
		for i := 1; rows < 0 || i <= rows; i++ {
			if i == failAt {
				be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "22012", Message: "division by zero"})
				be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
				return nil
			}
			be.Send(&pgproto3.CopyData{Data: fmt.Appendf(nil, "%d\trow %d\n", i, i)})
			if i%100 == 0 {
				if err := be.Flush(); err != nil {
					return err
				}
			}
		}
		be.Send(&pgproto3.CopyDone{})
		be.Send(&pgproto3.CommandComplete{CommandTag: fmt.Appendf(nil, "COPY %d", rows)})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		return nil
	})
}

// copyInSink counts what a COPY FROM received.
type copyInSink struct {
	messages, bytes atomic.Int64
}

// copyInServer takes a COPY FROM, counting its messages and bytes, and
// fails it with SQLSTATE 23505 once more than failAfter bytes came, if
// failAfter > 0.
func copyInServer(t *testing.T, sink *copyInSink, failAfter int64) *pgconn.PgConn {
	return copyServer(t, func(be *pgproto3.Backend) error {
		be.Send(&pgproto3.CopyInResponse{})
		if err := be.Flush(); err != nil {
			return err
		}
		failed := false
		var rows int
		for {
			msg, err := be.Receive()
			if err != nil {
				return err
			}
			switch m := msg.(type) {
			case *pgproto3.CopyData:
				if failed {
					continue // PostgreSQL discards the rest of a failed COPY
				}
				sink.messages.Add(1)
				rows += strings.Count(string(m.Data), "\n")
				if sink.bytes.Add(int64(len(m.Data))) > failAfter && failAfter > 0 {
					failed = true
					be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "23505", Message: "duplicate key value"})
					be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
					if err := be.Flush(); err != nil {
						return err
					}
				}
			case *pgproto3.CopyFail:
				if !failed {
					be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "57014", Message: "COPY from stdin failed: " + m.Message})
					be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
				}
				return nil
			case *pgproto3.CopyDone:
				if !failed {
					be.Send(&pgproto3.CommandComplete{CommandTag: fmt.Appendf(nil, "COPY %d", rows)})
					be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
				}
				return nil
			}
		}
	})
}

// TestPipeCopy: the rows reach the COPY FROM in batches, not one message a
// row, every byte of them; and the failure said is the side that failed
// first, not the other side's reaction to it.
func TestPipeCopy(t *testing.T) {
	const rows = 20000
	for _, tc := range []struct {
		name      string
		failAt    int   // source row that fails
		failAfter int64 // target bytes after which it fails
		want      string
		state     string
	}{
		{name: "whole", want: ""},
		{name: "source fails", failAt: 15000, want: "read: ", state: "22012"},
		{name: "target fails", failAfter: 100_000, want: "write: ", state: "23505"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sink copyInSink
			n := rows
			if tc.failAfter > 0 {
				n = -1 // a source that ended first would not show the abort
			}
			src := copyOutServer(t, n, tc.failAt)
			dst := copyInServer(t, &sink, tc.failAfter)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r := PipeCopy(ctx, src, "COPY out", dst, "COPY in")
			err := r.Err()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if r.Read != rows || r.Written != rows || r.Bytes != sink.bytes.Load() {
					t.Fatalf("read %d rows, wrote %d, counted %d bytes; want %d rows and the %d bytes the target got",
						r.Read, r.Written, r.Bytes, rows, sink.bytes.Load())
				}
				// One message per 32 KiB at most, where a row at a time
				// would be 20,000.
				if limit := sink.bytes.Load()/(32<<10) + 2; sink.messages.Load() > limit {
					t.Fatalf("%d bytes reached the target in %d CopyData messages; want at most %d", sink.bytes.Load(), sink.messages.Load(), limit)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !sqlstate.Is(err, tc.state) {
				t.Fatalf("err %v; want %q with SQLSTATE %s", err, tc.want, tc.state)
			}
			if tc.failAfter > 0 && !errors.Is(r.ReadErr, errCopyAborted) {
				t.Fatalf("the source's copy ended with %v, want it stopped by the target's failure", r.ReadErr)
			}
		})
	}
}
