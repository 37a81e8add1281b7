package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/sqlstate"
)

// TestPipeCopyNodes runs pgshard.PipeCopy, which every shadow copy, merge
// and tree creation goes through, between two real nodes: every row
// arrives, and a failure on either side is said as that side's, with its
// SQLSTATE, where PostgreSQL answers the other side's abort with its own
// error. pgshard's TestPipeCopy checks the batching.
func TestPipeCopyNodes(t *testing.T) {
	ctx := context.Background()
	src := connect(t, testNodeDSN(t, 0))
	defer src.Close(ctx)
	dst := connect(t, testNodeDSN(t, 1))
	defer dst.Close(ctx)
	const rows = 20000
	for _, tc := range []struct {
		name  string
		from  string // the source's rows
		want  string // the error's prefix; "" for none
		state string
	}{
		{"whole", fmt.Sprintf("SELECT g, md5(g::text) FROM generate_series(1, %d) g", rows), "", ""},
		{"source fails", fmt.Sprintf("SELECT g, (1 / (g - 15000))::text FROM generate_series(1, %d) g", rows), "read: ", "22012"}, // division_by_zero
		{"target fails", fmt.Sprintf("SELECT g %% 15000, md5(g::text) FROM generate_series(1, %d) g", rows), "write: ", "23505"},  // unique_violation
	} {
		t.Run(tc.name, func(t *testing.T) {
			mustExec(t, dst, "DROP TABLE IF EXISTS pipe_copy")
			mustExec(t, dst, "CREATE TABLE pipe_copy (k int PRIMARY KEY, v text NOT NULL)")
			r := pgshard.PipeCopy(ctx, src.PgConn(), "COPY ("+tc.from+") TO STDOUT (FORMAT binary)", dst.PgConn(), "COPY pipe_copy FROM STDIN (FORMAT binary)")
			err := r.Err()
			if tc.want != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.want) || !sqlstate.Is(err, tc.state) {
					t.Fatalf("err %v; want %q with SQLSTATE %s", err, tc.want, tc.state)
				}
				return
			}
			if err != nil || r.Read != rows || r.Written != rows {
				t.Fatalf("read %d rows, wrote %d: %v", r.Read, r.Written, err)
			}
			var n, bad int
			if err := dst.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE v <> md5(k::text)) FROM pipe_copy").Scan(&n, &bad); err != nil || n != rows || bad != 0 {
				t.Fatalf("%d rows arrived, %d of them wrong: %v", n, bad, err)
			}
		})
	}
	mustExec(t, dst, "DROP TABLE pipe_copy")
}
