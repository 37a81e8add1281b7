package pgshard

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgconn"
)

// copyBatch is how many bytes of a COPY TO reach the pipe at once. pgconn's
// CopyFrom sends each Read of its reader as one CopyData message in one
// write, into a 64 KiB buffer whose first 5 bytes are the message header.
const copyBatch = 64<<10 - 5

// errCopyAborted stops a COPY TO whose reader has gone.
var errCopyAborted = errors.New("pgshard: copy target stopped reading")

// CopyPipe is what one piped copy did: the rows each side counted, the
// bytes of COPY data that crossed, and each side's error.
type CopyPipe struct {
	Read, Written     int64
	Bytes             int64
	ReadErr, WriteErr error
}

// Err is the copy's failure, nil if none: the side that failed first (a
// COPY TO that stopped because the COPY FROM stopped reading failed
// second), or sides that disagree on the rows.
func (p CopyPipe) Err() error {
	switch {
	case p.ReadErr != nil && (p.WriteErr == nil || !errors.Is(p.ReadErr, errCopyAborted)):
		return fmt.Errorf("read: %w", p.ReadErr)
	case p.WriteErr != nil:
		return fmt.Errorf("write: %w", p.WriteErr)
	case p.Read != p.Written:
		return fmt.Errorf("read %d rows but wrote %d", p.Read, p.Written)
	}
	return nil
}

// PipeCopy streams the COPY TO out on src into the COPY FROM in on dst.
//
// The rows are batched before the pipe: CopyTo writes one row per Write,
// an io.Pipe hands each Write to one Read, and CopyFrom sends each Read as
// its own CopyData message in its own write(2), so unbatched every row
// would cost a message, a system call and two goroutine hand-offs.
func PipeCopy(ctx context.Context, src *pgconn.PgConn, out string, dst *pgconn.PgConn, in string) CopyPipe {
	pr, pw := io.Pipe()
	type result struct {
		tag pgconn.CommandTag
		err error
	}
	done := make(chan result, 1)
	go func() {
		bw := bufio.NewWriterSize(pw, copyBatch)
		tag, err := src.CopyTo(ctx, bw, out)
		if err == nil {
			err = bw.Flush()
		}
		pw.CloseWithError(err) // nil: the reader sees EOF
		done <- result{tag, err}
	}()
	counted := &countingReader{r: pr}
	inTag, inErr := dst.CopyFrom(ctx, counted, in)
	// Unblock the writer if COPY FROM stopped before the end.
	pr.CloseWithError(errCopyAborted)
	res := <-done
	return CopyPipe{Read: res.tag.RowsAffected(), Written: inTag.RowsAffected(), Bytes: counted.n, ReadErr: res.err, WriteErr: inErr}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
