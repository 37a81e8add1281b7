package btreeindex

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/sqlstate"
)

var (
	int8Text = Column{OID: pgtype.Int8OID}
	textText = Column{OID: pgtype.TextOID}
)

func TestMergeOrder(t *testing.T) {
	asc := SortKey{Column: 0}
	for _, c := range []struct {
		name    string
		keys    []SortKey
		cols    []Column
		sources [][][]string // per source, rows of text values ("NULL" for NULL)
		want    []string
	}{
		{
			name: "many sources ascending",
			keys: []SortKey{asc}, cols: []Column{int8Text, textText},
			sources: [][][]string{
				{{"1", "a"}, {"4", "b"}, {"9", "c"}},
				{{"2", "d"}, {"3", "e"}, {"10", "f"}, {"11", "g"}},
				{{"-5", "h"}},
				{{"0", "i"}, {"4", "j"}, {"8", "k"}},
				{{"7", "l"}},
			},
			want: []string{"-5|h", "0|i", "1|a", "2|d", "3|e", "4|b", "4|j", "7|l", "8|k", "9|c", "10|f", "11|g"},
		},
		{
			name: "ties go to the first source listed, each source in its own order",
			keys: []SortKey{asc}, cols: []Column{int8Text, textText},
			sources: [][][]string{
				{{"1", "a"}, {"1", "b"}},
				{{"1", "c"}},
				{{"0", "d"}, {"1", "e"}},
			},
			want: []string{"0|d", "1|a", "1|b", "1|c", "1|e"},
		},
		{
			name: "ASC NULLS LAST",
			keys: []SortKey{{Column: 0}}, cols: []Column{int8Text, textText},
			sources: [][][]string{{{"1", "a"}, {"NULL", "b"}}, {{"2", "c"}, {"NULL", "d"}}},
			want:    []string{"1|a", "2|c", "NULL|b", "NULL|d"},
		},
		{
			name: "ASC NULLS FIRST",
			keys: []SortKey{{Column: 0, NullsFirst: true}}, cols: []Column{int8Text, textText},
			sources: [][][]string{{{"NULL", "b"}, {"1", "a"}}, {{"NULL", "d"}, {"2", "c"}}},
			want:    []string{"NULL|b", "NULL|d", "1|a", "2|c"},
		},
		{
			name: "DESC NULLS FIRST",
			keys: []SortKey{{Column: 0, Desc: true, NullsFirst: true}}, cols: []Column{int8Text, textText},
			sources: [][][]string{{{"NULL", "b"}, {"1", "a"}}, {{"NULL", "d"}, {"2", "c"}}},
			want:    []string{"NULL|b", "NULL|d", "2|c", "1|a"},
		},
		{
			name: "DESC NULLS LAST",
			keys: []SortKey{{Column: 0, Desc: true}}, cols: []Column{int8Text, textText},
			sources: [][][]string{{{"1", "a"}, {"NULL", "b"}}, {{"2", "c"}, {"NULL", "d"}}},
			want:    []string{"2|c", "1|a", "NULL|b", "NULL|d"},
		},
		{
			name: "two keys: the second breaks ties of the first",
			keys: []SortKey{{Column: 0, Desc: true}, {Column: 1, NullsFirst: true}}, cols: []Column{int8Text, int8Text, textText},
			sources: [][][]string{
				{{"2", "NULL", "a"}, {"2", "5", "b"}, {"1", "1", "c"}, {"NULL", "0", "d"}},
				{{"2", "3", "e"}, {"1", "NULL", "f"}, {"NULL", "NULL", "g"}},
			},
			want: []string{"2|NULL|a", "2|3|e", "2|5|b", "1|NULL|f", "1|1|c", "NULL|NULL|g", "NULL|0|d"},
		},
		{
			name: "a key that is not the first column",
			keys: []SortKey{{Column: 1}}, cols: []Column{textText, int8Text},
			sources: [][][]string{{{"x", "3"}, {"y", "30"}}, {{"z", "20"}}},
			want:    []string{"x|3", "z|20", "y|30"},
		},
		{
			name: "an exhausted source: the others go on",
			keys: []SortKey{asc}, cols: []Column{int8Text},
			sources: [][][]string{{{"1"}}, {{"0"}, {"2"}, {"3"}, {"4"}}, {{"5"}}},
			want:    []string{"0", "1", "2", "3", "4", "5"},
		},
		{
			name: "empty sources among others",
			keys: []SortKey{asc}, cols: []Column{int8Text},
			sources: [][][]string{{}, {{"2"}, {"3"}}, {}, {{"1"}}, {}},
			want:    []string{"1", "2", "3"},
		},
		{
			name: "every source empty",
			keys: []SortKey{asc}, cols: []Column{int8Text},
			sources: [][][]string{{}, {}, {}},
		},
		{
			name: "no sources",
			keys: []SortKey{asc}, cols: []Column{int8Text},
		},
		{
			name: "one source",
			keys: []SortKey{asc}, cols: []Column{int8Text},
			sources: [][][]string{{{"1"}, {"2"}}},
			want:    []string{"1", "2"},
		},
		{
			name: `text under COLLATE "C": byte order`,
			keys: []SortKey{{Column: 0, ByteOrder: true}}, cols: []Column{textText},
			sources: [][][]string{{{""}, {"B"}, {"ab"}, {"é"}}, {{"A"}, {"a"}, {"b"}, {"z"}}},
			want:    []string{"", "A", "B", "a", "ab", "b", "z", "é"},
		},
		{
			name:    "no keys: the sources one after another, in order",
			cols:    []Column{int8Text},
			sources: [][][]string{{{"3"}, {"1"}}, {}, {{"2"}}, {{"0"}}},
			want:    []string{"3", "1", "2", "0"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var srcs []RowSource
			var fakes []*fakeSource
			for i, rows := range c.sources {
				f := newFake(t, fmt.Sprint("source ", i), c.cols, textRows(rows...))
				srcs = append(srcs, f)
				fakes = append(fakes, f)
			}
			got, err := drain(t, testCtx(), NewMerge(c.keys, srcs))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("got  %q\nwant %q", got, c.want)
			}
			for _, f := range fakes {
				if !f.ended || f.closed != 0 {
					t.Errorf("%s: ended %v, closed %d times; want read to its end and never closed", f.name, f.ended, f.closed)
				}
			}
		})
	}
}

// TestMergeRandom merges random sorted sources under every direction and
// null order, and checks the result against a stable sort of all rows in
// source order: the same order, ties included.
func TestMergeRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, k := range []SortKey{{}, {NullsFirst: true}, {Desc: true, NullsFirst: true}, {Desc: true}} {
		t.Run(k.Order(), func(t *testing.T) {
			for round := range 50 {
				nsrc := 1 + rng.IntN(12)
				var all []*int64
				var origin []string
				var srcs []RowSource
				for s := range nsrc {
					n := rng.IntN(40)
					vals := make([]*int64, n)
					for i := range vals {
						if rng.IntN(8) > 0 {
							v := int64(rng.IntN(30) - 15)
							vals[i] = &v
						}
					}
					sort.SliceStable(vals, func(i, j int) bool { return refLess(vals[i], vals[j], k) })
					var rows [][]string
					for i, v := range vals {
						id := fmt.Sprintf("s%d.%d", s, i)
						rows = append(rows, []string{intText(v), id})
						all = append(all, v)
						origin = append(origin, intText(v)+"|"+id)
					}
					srcs = append(srcs, newFake(t, fmt.Sprint("source ", s), []Column{int8Text, textText}, textRows(rows...)))
				}
				idx := make([]int, len(all))
				for i := range idx {
					idx[i] = i
				}
				sort.SliceStable(idx, func(i, j int) bool { return refLess(all[idx[i]], all[idx[j]], k) })
				want := make([]string, len(idx))
				for i, j := range idx {
					want[i] = origin[j]
				}
				got, err := drain(t, testCtx(), NewMerge([]SortKey{k}, srcs))
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("round %d: got  %q\nwant %q", round, got, want)
				}
			}
		})
	}
}

// refLess is the ORDER BY of one nullable integer key, written apart from
// the package's comparison: a null's place is its null order, whatever the
// direction.
func refLess(a, b *int64, k SortKey) bool {
	rank := func(v *int64) int {
		if (v == nil) == k.NullsFirst {
			return 0
		}
		return 1
	}
	if ra, rb := rank(a), rank(b); ra != rb || a == nil {
		return ra < rb
	}
	if k.Desc {
		return *a > *b
	}
	return *a < *b
}

func intText(v *int64) string {
	if v == nil {
		return "NULL"
	}
	return strconv.FormatInt(*v, 10)
}

// TestMergeErrors stops a merge mid-stream: it returns the error, keeps
// returning it without reading any more, and closes each source that has
// not ended, once, the failed one included.
func TestMergeErrors(t *testing.T) {
	asc := []SortKey{{Column: 0}}
	cols := []Column{int8Text}
	for _, c := range []struct {
		name     string
		keys     []SortKey
		sources  [][][]string
		failAt   map[int]int // source -> the call of Next that fails
		closeErr bool        // every Close fails too
		want     []string    // rows before the error
		code     string      // the error's SQLSTATE, "" for errBoom
		closed   []int       // how often each source is closed
	}{
		{
			name: "a source fails mid-stream", keys: asc,
			sources: [][][]string{{{"1"}, {"3"}, {"5"}}, {{"2"}, {"4"}, {"6"}}, {{"0"}}},
			failAt:  map[int]int{1: 2},
			want:    []string{"0", "1", "2", "3", "4"},
			closed:  []int{1, 1, 0},
		},
		{
			name: "a source fails at its first row", keys: asc,
			sources: [][][]string{{{"1"}}, {{"2"}}, {{"3"}}},
			failAt:  map[int]int{1: 0},
			closed:  []int{1, 1, 1},
		},
		{
			name: "closing fails too: both errors are returned", keys: asc,
			sources:  [][][]string{{{"1"}, {"3"}}, {{"2"}}},
			failAt:   map[int]int{1: 1},
			closeErr: true,
			want:     []string{"1", "2"},
			closed:   []int{1, 1},
		},
		{
			name: "a value that does not decode", keys: asc,
			sources: [][][]string{{{"1"}, {"x"}, {"9"}}, {{"2"}, {"8"}}},
			want:    []string{"1"},
			code:    sqlstate.InternalError,
			closed:  []int{1, 1},
		},
		{
			name:    "text in the nodes' collation cannot be merged",
			keys:    []SortKey{{Column: 1}},
			sources: [][][]string{{{"1", "a"}}, {{"2", "b"}}},
			code:    sqlstate.FeatureNotSupported,
			closed:  []int{1, 1},
		},
		{
			// Its node sorts otherwise than the merge compares: merging on
			// would answer in a wrong order.
			name: "a source out of order", keys: asc,
			sources: [][][]string{{{"1"}, {"3"}, {"2"}, {"9"}}, {{"2"}, {"8"}}},
			want:    []string{"1", "2", "3"},
			code:    sqlstate.InternalError,
			closed:  []int{1, 1},
		},
		{
			// The previous row's text is compared after the source has
			// overwritten its buffer with the next row.
			name: "text out of byte order", keys: []SortKey{{Column: 1, ByteOrder: true}},
			sources: [][][]string{{{"1", "a"}, {"2", "c"}, {"3", "b"}}, {{"4", "z"}}},
			want:    []string{"1|a", "2|c"},
			code:    sqlstate.InternalError,
			closed:  []int{1, 1},
		},
		{
			name:    "no keys: a source fails, the later ones are closed unread",
			sources: [][][]string{{{"1"}}, {{"2"}, {"3"}}, {{"4"}}, {}},
			failAt:  map[int]int{1: 1},
			want:    []string{"1", "2"},
			closed:  []int{0, 1, 1, 1},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var srcs []RowSource
			var fakes []*fakeSource
			for i, rows := range c.sources {
				cc := cols
				if len(rows) > 0 && len(rows[0]) == 2 {
					cc = []Column{int8Text, textText}
				}
				f := newFake(t, fmt.Sprint("source ", i), cc, textRows(rows...))
				if at, ok := c.failAt[i]; ok {
					f.failAt, f.err = at, errBoom
				}
				if c.closeErr {
					f.cerr = fmt.Errorf("close %d: %w", i, errClose)
				}
				srcs = append(srcs, f)
				fakes = append(fakes, f)
			}
			m := NewMerge(c.keys, srcs)
			ctx := testCtx()
			got, err := drain(t, ctx, m)
			if !slices.Equal(got, c.want) {
				t.Errorf("rows before the error %q, want %q", got, c.want)
			}
			switch {
			case err == nil:
				t.Fatal("no error")
			case c.code == "" && !errors.Is(err, errBoom):
				t.Errorf("error %v, want %v", err, errBoom)
			case c.code != "":
				var e *sqlstate.Error
				if !errors.As(err, &e) || e.Code != c.code {
					t.Errorf("error %v, want SQLSTATE %s", err, c.code)
				}
			}
			if c.closeErr != errors.Is(err, errClose) {
				t.Errorf("error %v: the close errors are not joined as they should", err)
			}
			calls := make([]int, len(fakes))
			for i, f := range fakes {
				calls[i] = f.calls
				if f.closed != c.closed[i] {
					t.Errorf("%s closed %d times, want %d", f.name, f.closed, c.closed[i])
				}
			}
			// The error sticks, and nothing more is read or closed.
			if row, again := m.Next(ctx); row != nil || again == nil || again.Error() != err.Error() {
				t.Errorf("Next after the error = %q, %v; want the same error", row, again)
			}
			for i, f := range fakes {
				if f.calls != calls[i] || f.closed != c.closed[i] {
					t.Errorf("%s read or closed after the error", f.name)
				}
			}
		})
	}
}

var errClose = errors.New("close failed")

// TestMergeContext passes the caller's context to every source, and a
// canceled one stops the merge like any failing source.
func TestMergeContext(t *testing.T) {
	ctx, cancel := context.WithCancel(testCtx())
	a := newFake(t, "a", []Column{int8Text}, textRows([]string{"1"}, []string{"3"}))
	b := newFake(t, "b", []Column{int8Text}, textRows([]string{"2"}, []string{"4"}))
	m := NewMerge([]SortKey{{Column: 0}}, []RowSource{a, b})
	if row, err := m.Next(ctx); err != nil || string(row[0]) != "1" {
		t.Fatalf("first row %q, %v", row, err)
	}
	cancel()
	if _, err := m.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("after cancel: %v, want context.Canceled", err)
	}
	if a.closed != 1 || b.closed != 1 {
		t.Errorf("closed a %d, b %d times; want once each", a.closed, b.closed)
	}
}

// TestConcatIsLazy reads a source only once the ones before it ended, as a
// fan-out without ORDER BY reads one node's rows after another.
func TestConcatIsLazy(t *testing.T) {
	a := newFake(t, "a", nil, textRows([]string{"1"}, []string{"2"}))
	b := newFake(t, "b", nil, textRows([]string{"3"}))
	m := NewMerge(nil, []RowSource{a, b})
	ctx := testCtx()
	for _, want := range []string{"1", "2"} {
		row, err := m.Next(ctx)
		if err != nil || string(row[0]) != want {
			t.Fatalf("row %q, %v; want %s", row, err, want)
		}
		if b.calls != 0 {
			t.Fatalf("b read before a ended")
		}
	}
	if row, err := m.Next(ctx); err != nil || string(row[0]) != "3" {
		t.Fatalf("row %q, %v; want 3", row, err)
	}
}
