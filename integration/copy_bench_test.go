package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// benchCopyRows is the row count of BenchmarkCopyFrom; LATTICE_BENCH_COPY_ROWS
// overrides it.
func benchCopyRows() int {
	if v, err := strconv.Atoi(os.Getenv("LATTICE_BENCH_COPY_ROWS")); err == nil && v > 0 {
		return v
	}
	return 1000000
}

// BenchmarkCopyFrom loads the same rows with COPY FROM STDIN directly into
// one plain table on one node and through Lattice into a tree of 64 shards
// on 2 nodes, side by side in one run, in text format (pgconn.CopyFrom) and
// binary format (pgx CopyFrom), and prints a markdown table of the times.
func BenchmarkCopyFrom(b *testing.B) {
	resetNodes(b)
	p := startProxy(b, 2)
	ctx := context.Background()
	c := connect(b, p.DSN("lattice"))
	direct := connect(b, testNodeDSN(b, 0))
	rows := benchCopyRows()
	var text bytes.Buffer
	for i := 0; i < rows; i++ {
		fmt.Fprintf(&text, "%d\tpayload number %d for the copy benchmark\t%d\n", i, i, i%1000)
	}
	const cols = ` (k bigint PRIMARY KEY, v text, n integer)`
	var table strings.Builder
	table.WriteString("| format | direct s | lattice s | direct rows/s | lattice rows/s | lattice/direct time |\n|---|---|---|---|---|---|\n")
	for _, format := range []string{"text", "binary"} {
		plain, tree := "plain_"+format, "tree_"+format
		mustExec(b, direct, `CREATE TABLE `+plain+cols)
		mustExec(b, c, `CREATE TABLE `+tree+cols)
		mustExec(b, c, `SELECT lattice_create_tree('`+tree+`', 'k', shard_count => 64)`)
		load := func(conn *pgx.Conn, table string) time.Duration {
			start := time.Now()
			var n int64
			var err error
			if format == "text" {
				var tag interface{ RowsAffected() int64 }
				tag, err = conn.PgConn().CopyFrom(ctx, bytes.NewReader(text.Bytes()), `COPY `+table+` FROM STDIN`)
				if err == nil {
					n = tag.RowsAffected()
				}
			} else {
				i := 0
				n, err = conn.CopyFrom(ctx, pgx.Identifier{table}, []string{"k", "v", "n"}, pgx.CopyFromFunc(func() ([]any, error) {
					if i == rows {
						return nil, nil
					}
					i++
					return []any{int64(i), "payload number " + strconv.Itoa(i) + " for the copy benchmark", int32(i % 1000)}, nil
				}))
			}
			if err != nil || n != int64(rows) {
				b.Fatalf("COPY into %s: %d rows, %v", table, n, err)
			}
			return time.Since(start)
		}
		d := load(direct, plain)
		l := load(c, tree)
		fmt.Fprintf(&table, "| %s | %.2f | %.2f | %.0f | %.0f | %.2f |\n", format, d.Seconds(), l.Seconds(),
			float64(rows)/d.Seconds(), float64(rows)/l.Seconds(), l.Seconds()/d.Seconds())
		b.ReportMetric(l.Seconds()/d.Seconds(), format+"-lattice/direct")
	}
	fmt.Printf("\nCOPY FROM STDIN of %d rows: direct into one table on one node vs Lattice into 64 shards on 2 nodes, %d cores:\n\n%s\n", rows, numCPU(), table.String())
}
