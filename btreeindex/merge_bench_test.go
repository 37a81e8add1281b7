//go:build unix

package btreeindex

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// benchSource replays prepared rows without the fake's checks and copies,
// so the benchmark measures the merge: decoding, comparing, the heap.
type benchSource struct {
	cols []Column
	rows [][][]byte
	pos  int
}

func (b *benchSource) Next(context.Context) ([][]byte, error) {
	if b.pos == len(b.rows) {
		return nil, nil
	}
	b.pos++
	return b.rows[b.pos-1], nil
}

func (b *benchSource) Columns() []Column           { return b.cols }
func (b *benchSource) Close(context.Context) error { return nil }

// cpuTime is the CPU time the process has used (all threads, the
// collector's included): on a shared machine it says more than wall time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkMerge merges sources of 1,000 rows each (a sort key and a 100
// byte payload) and reports the wall and CPU time per merged row:
// go test -run '^$' -bench Merge ./btreeindex
func BenchmarkMerge(b *testing.B) {
	const perSource = 1000
	payload := make([]byte, 100)
	base := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	kinds := []struct {
		name string
		keys []SortKey
		col  Column
		enc  func(v int) []byte // ascending in v
	}{
		{"int8 text", []SortKey{{Column: 0}}, Column{OID: pgtype.Int8OID},
			func(v int) []byte { return strconv.AppendInt(nil, int64(v), 10) }},
		{"int8 binary", []SortKey{{Column: 0}}, Column{OID: pgtype.Int8OID, Format: 1},
			func(v int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }},
		{"text C", []SortKey{{Column: 0, ByteOrder: true}}, Column{OID: pgtype.TextOID},
			func(v int) []byte { return fmt.Appendf(nil, "key-%09d", v) }},
		{"numeric text", []SortKey{{Column: 0}}, Column{OID: pgtype.NumericOID},
			func(v int) []byte { return fmt.Appendf(nil, "%d.%02d", v/100, v%100) }},
		{"timestamptz text", []SortKey{{Column: 0, Desc: true}}, Column{OID: pgtype.TimestamptzOID},
			func(v int) []byte {
				return []byte(base.Add(-time.Duration(v) * time.Second).Format("2006-01-02 15:04:05.999999-07"))
			}},
		{"no keys", nil, Column{OID: pgtype.Int8OID},
			func(v int) []byte { return strconv.AppendInt(nil, int64(v), 10) }},
	}
	for _, k := range kinds {
		for _, n := range []int{2, 16, 64} {
			b.Run(fmt.Sprintf("%s/sources=%d", k.name, n), func(b *testing.B) {
				// Rows interleave across the sources, so every row moves the heap.
				data := make([][][][]byte, n)
				for s := range data {
					data[s] = make([][][]byte, perSource)
					for i := range perSource {
						data[s][i] = [][]byte{k.enc(i*n + s), payload}
					}
				}
				cols := []Column{k.col, {OID: pgtype.ByteaOID}}
				ctx := context.Background()
				srcs := make([]RowSource, n)
				fakes := make([]benchSource, n)
				rows := 0
				b.ReportAllocs()
				b.ResetTimer()
				cpu := cpuTime(b)
				for range b.N {
					for s := range fakes {
						fakes[s] = benchSource{cols: cols, rows: data[s]}
						srcs[s] = &fakes[s]
					}
					m := NewMerge(k.keys, srcs)
					for {
						row, err := m.Next(ctx)
						if err != nil {
							b.Fatal(err)
						}
						if row == nil {
							break
						}
						rows++
					}
				}
				cpu = cpuTime(b) - cpu
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(rows), "ns/row")
				b.ReportMetric(float64(cpu.Nanoseconds())/float64(rows), "cpu-ns/row")
			})
		}
	}
}
