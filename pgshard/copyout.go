package pgshard

import (
	"bufio"
	"context"
	"io"

	"github.com/jackc/pgx/v5/pgconn"
)

// copyBatch is how many bytes of a COPY TO reach the pipe at once. pgconn's
// CopyFrom sends each Read of its reader as one CopyData message in one
// write, into a 64 KiB buffer whose first 5 bytes are the message header.
const copyBatch = 64<<10 - 5

// CopyOut runs the COPY TO sql on src into pw and closes pw with its error
// (nil: the reader sees EOF). CopyTo writes one row per Write, and an
// io.Pipe hands each Write to the reader alone, so without the batching
// the CopyFrom at the other end would send every row in its own message
// and system call, after a goroutine hand-off.
func CopyOut(ctx context.Context, src *pgconn.PgConn, pw *io.PipeWriter, sql string) (pgconn.CommandTag, error) {
	bw := bufio.NewWriterSize(pw, copyBatch)
	tag, err := src.CopyTo(ctx, bw, sql)
	if err == nil {
		err = bw.Flush()
	}
	pw.CloseWithError(err)
	return tag, err
}
