package proxy

import (
	"fmt"
	"testing"

	"github.com/lattice-db/lattice/router"
)

// TestCursorMove walks a cursor of five rows through FETCH directions,
// each step from where the last left it, as PostgreSQL positions a cursor
// (TestTreeCursors compares the same against PostgreSQL itself).
func TestCursorMove(t *testing.T) {
	steps := []struct {
		dir      router.FetchDirection
		count    int64
		noScroll bool
		rows     string // the row numbers returned, in order
		pos      int
		err      bool
	}{
		{dir: router.FetchForward, count: 2, rows: "[1 2]", pos: 2},
		{dir: router.FetchForward, count: 0, rows: "[2]", pos: 2},
		{dir: router.FetchBackward, count: 1, rows: "[1]", pos: 1},
		{dir: router.FetchBackward, count: 5, rows: "[]", pos: 0},
		{dir: router.FetchForward, count: router.FetchAll, rows: "[1 2 3 4 5]", pos: 6},
		{dir: router.FetchForward, count: 1, rows: "[]", pos: 6},
		{dir: router.FetchBackward, count: 2, rows: "[5 4]", pos: 4},
		{dir: router.FetchForward, count: -3, rows: "[3 2 1]", pos: 1},
		{dir: router.FetchAbsolute, count: -1, rows: "[5]", pos: 5},
		{dir: router.FetchAbsolute, count: 9, rows: "[]", pos: 6},
		{dir: router.FetchAbsolute, count: -9, rows: "[]", pos: 0},
		{dir: router.FetchRelative, count: 3, rows: "[3]", pos: 3},
		{dir: router.FetchRelative, count: 0, rows: "[3]", pos: 3},
		{dir: router.FetchRelative, count: router.FetchAll, rows: "[]", pos: 6},
		{dir: router.FetchRelative, count: 0, rows: "[]", pos: 6},
		{dir: router.FetchAbsolute, count: 0, rows: "[]", pos: 0},
		{dir: router.FetchAbsolute, count: 2, noScroll: true, rows: "[2]", pos: 2},
		{dir: router.FetchRelative, count: 0, noScroll: true, err: true, pos: 2},
		{dir: router.FetchAbsolute, count: 1, noScroll: true, err: true, pos: 2},
		{dir: router.FetchBackward, count: 0, noScroll: true, err: true, pos: 2},
		{dir: router.FetchForward, count: 2, noScroll: true, rows: "[3 4]", pos: 4},
	}
	cur := &treeCursor{rows: &heldRows{}}
	for i := 1; i <= 5; i++ {
		cur.rows.rows = append(cur.rows.rows, [][]byte{[]byte(fmt.Sprint(i))})
	}
	for i, st := range steps {
		cur.noScroll = st.noScroll
		from, n, step, err := cur.move(st.dir, st.count)
		var got []string
		for j := 0; j < n; j++ {
			got = append(got, string(cur.rows.rows[from+j*step][0]))
		}
		if (err != nil) != st.err || err == nil && fmt.Sprint(got) != st.rows || cur.pos != st.pos {
			t.Fatalf("step %d (%v %d): rows %v, pos %d, err %v; want %s, pos %d, err %v", i, st.dir, st.count, got, cur.pos, err, st.rows, st.pos, st.err)
		}
	}
}
