package proxy

import (
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

func TestReturnOrder(t *testing.T) {
	cases := []struct {
		name    string
		values  int
		parts   [][]int // each part's VALUES rows, in portal order
		seq     []int   // the order the parts answer in
		answers [][]string
		limit   int64
		want    []string
		code    string
	}{
		{name: "interleaved rows, parts in portal order", values: 5, parts: [][]int{{0, 2, 4}, {1, 3}}, seq: []int{0, 1},
			answers: [][]string{{"r0", "r2", "r4"}, {"r1", "r3"}}, limit: 1 << 20, want: []string{"r0", "r1", "r2", "r3", "r4"}},
		{name: "parts answer backend by backend", values: 4, parts: [][]int{{3}, {0, 2}, {1}}, seq: []int{0, 2, 1},
			answers: [][]string{{"r3"}, {"r1"}, {"r0", "r2"}}, limit: 1 << 20, want: []string{"r0", "r1", "r2", "r3"}},
		{name: "a part that returns fewer rows leaves its others out", values: 3, parts: [][]int{{0, 2}, {1}}, seq: []int{0, 1},
			answers: [][]string{{"r0"}, {"r1"}}, limit: 1 << 20, want: []string{"r0", "r1"}},
		{name: "a part that returns more rows than it inserted", values: 2, parts: [][]int{{0}, {1}}, seq: []int{0, 1},
			answers: [][]string{{"r0", "extra"}, {"r1"}}, limit: 1 << 20, code: sqlstate.InternalError},
		{name: "past the memory bound", values: 3, parts: [][]int{{0, 1}, {2}}, seq: []int{0, 1},
			answers: [][]string{{"0123456789", "0123456789"}, {"x"}}, limit: 15, code: sqlstate.ProgramLimitExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := newReturnOrder(tc.values, tc.limit)
			for _, p := range tc.parts {
				o.addPart(p)
			}
			for run := range 2 { // a portal can run again
				o.reset()
				o.seq = append(o.seq, tc.seq...)
				for _, part := range tc.answers {
					for _, r := range part {
						o.add([][]byte{[]byte(r)})
					}
					o.partDone()
				}
				if tc.code != "" {
					if o.err == nil || o.err.Code != tc.code {
						t.Fatalf("run %d: error %v, want SQLSTATE %s", run, o.err, tc.code)
					}
					var sent int
					o.flush(func(pgproto3.BackendMessage) { sent++ })
					if sent != 0 {
						t.Fatalf("run %d: %d rows sent after the error", run, sent)
					}
					continue
				}
				if o.err != nil {
					t.Fatalf("run %d: %v", run, o.err)
				}
				var got []string
				o.flush(func(m pgproto3.BackendMessage) { got = append(got, string(m.(*pgproto3.DataRow).Values[0])) })
				if !slices.Equal(got, tc.want) {
					t.Fatalf("run %d: rows %v, want %v", run, got, tc.want)
				}
			}
		})
	}
}
