package btreeindex

import (
	"container/heap"
	"context"
	"errors"
	"slices"

	"github.com/lattice-db/lattice/sqlstate"
)

// RowSource is one stream of rows for a Merge, already sorted by the
// merge's keys: a node's result of a fan-out SELECT. It knows no session
// and no connection; the proxy adapts its backend cursors to it.
type RowSource interface {
	// Next returns the source's next row, or nil at its end. The row stays
	// valid until the next call of Next or Close on the same source: the
	// merge holds it while it reads the other sources.
	Next(ctx context.Context) ([][]byte, error)
	// Columns describes the columns of the rows. The merge asks once per
	// source, after its first row, and only when it has sort keys.
	Columns() []Column
	// Close ends a source before its end. The merge calls it once on
	// every source that has not returned its end (a failed one included)
	// when it stops early: a source failed, or a row could not be ordered.
	Close(ctx context.Context) error
}

// Merge is the rows of several sources as one stream. With sort keys it is
// a k-way merge: each source's rows must come in key order, and the merge
// yields them in that order, a tie going to the source listed first, so
// that the output is deterministic. A source whose row sorts before its
// previous one stops the merge with an error: its node orders the keys
// otherwise than the merge compares them (a node whose collation differs
// from the catalog node's), and merging on would answer in a wrong order. With no keys it is the concatenation of
// the sources in order, each read to its end before the next is touched.
type Merge struct {
	keys    []SortKey
	srcs    []RowSource
	cursors []cursor
	heap    cursorHeap
	last    *cursor // the cursor whose row Next returned: advanced by the next call
	next    int     // without keys: the source being read
	started bool
	err     error
}

// cursor is one source's position in the merge.
type cursor struct {
	src   RowSource
	index int
	cols  []Column // asked of src at its first row
	row   [][]byte
	keys  []value
	ended bool // src returned its end, or the merge closed it: never closed (again)
	// The keys of the source's previous row, their bytes copied into
	// prevBuf: a source reuses a row's memory when it reads the next.
	prev    []value
	prevBuf []byte
}

// keepKeys makes c's current keys its previous ones, copying their bytes.
func (c *cursor) keepKeys() {
	c.prev, c.keys = c.keys, c.prev[:0]
	need := 0
	for i := range c.prev {
		need += len(c.prev[i].b)
	}
	if need == 0 {
		return
	}
	c.prevBuf = slices.Grow(c.prevBuf[:0], need)
	for i := range c.prev {
		if b := c.prev[i].b; len(b) > 0 {
			at := len(c.prevBuf)
			c.prevBuf = append(c.prevBuf, b...)
			c.prev[i].b = c.prevBuf[at:len(c.prevBuf):len(c.prevBuf)]
		}
	}
}

// NewMerge merges srcs by keys (concatenates them when keys is empty). One
// source is already in order: its rows pass through without their sort
// values being decoded, so that a node holding every shard of a tree
// answers an ORDER BY on any type and collation.
func NewMerge(keys []SortKey, srcs []RowSource) *Merge {
	if len(srcs) <= 1 {
		keys = nil
	}
	m := &Merge{keys: keys, srcs: srcs, cursors: make([]cursor, len(srcs))}
	for i, s := range srcs {
		m.cursors[i] = cursor{src: s, index: i}
	}
	m.heap = cursorHeap{keys: keys}
	return m
}

// Next returns the next row of the merged stream, or nil at its end. The
// row stays valid until the next call. When a source fails, or a row's sort
// value cannot be decoded, the merge closes every source that has not
// ended and returns that error (joined with any error closing returned),
// and so again on every later call.
func (m *Merge) Next(ctx context.Context) ([][]byte, error) {
	if m.err != nil {
		return nil, m.err
	}
	if len(m.keys) == 0 {
		return m.concat(ctx)
	}
	if !m.started {
		m.started = true
		m.heap.h = make([]*cursor, 0, len(m.cursors))
		for i := range m.cursors {
			c := &m.cursors[i]
			if err := m.advance(ctx, c); err != nil {
				return nil, m.fail(ctx, err)
			}
			if !c.ended {
				m.heap.h = append(m.heap.h, c)
			}
		}
		heap.Init(&m.heap)
	} else if c := m.last; c != nil {
		m.last = nil
		if err := m.advance(ctx, c); err != nil {
			return nil, m.fail(ctx, err)
		}
		if c.ended {
			heap.Pop(&m.heap) // c is the least, at the top
		} else {
			heap.Fix(&m.heap, 0)
		}
	}
	if len(m.heap.h) == 0 {
		return nil, nil
	}
	m.last = m.heap.h[0]
	return m.last.row, nil
}

// concat is Next without sort keys.
func (m *Merge) concat(ctx context.Context) ([][]byte, error) {
	for ; m.next < len(m.cursors); m.next++ {
		c := &m.cursors[m.next]
		row, err := c.src.Next(ctx)
		if err != nil {
			return nil, m.fail(ctx, err)
		}
		if row != nil {
			return row, nil
		}
		c.ended = true
	}
	return nil, nil
}

// advance reads c's next row, decodes its sort values and checks that they
// do not sort before the previous row's.
func (m *Merge) advance(ctx context.Context, c *cursor) error {
	had := c.row != nil
	if had {
		c.keepKeys()
	}
	row, err := c.src.Next(ctx)
	if err != nil {
		return err
	}
	c.row = row
	if row == nil {
		c.ended = true
		return nil
	}
	if c.cols == nil {
		c.cols = c.src.Columns()
	}
	c.keys = c.keys[:0]
	for _, k := range m.keys {
		v, err := decode(c.cols, k, row)
		if err != nil {
			return err
		}
		c.keys = append(c.keys, v)
	}
	if had && m.outOfOrder(c) {
		e := sqlstate.New(sqlstate.InternalError, "the rows of part %d of an ordered read over several shards came out of order: its node sorts the ORDER BY keys otherwise than the proxy merges them", c.index+1)
		e.Hint = `give every node the catalog node's collation (the databases' locale), or add COLLATE "C" to the ORDER BY item`
		return e
	}
	return nil
}

// outOfOrder reports whether c's row sorts before its previous one.
func (m *Merge) outOfOrder(c *cursor) bool {
	for n, k := range m.keys {
		if d := compareKey(&c.keys[n], &c.prev[n], k); d != 0 {
			return d < 0
		}
	}
	return false
}

// fail stops the merge with err: every source that has not ended is
// closed, in order, and err is kept for every later call.
func (m *Merge) fail(ctx context.Context, err error) error {
	errs := []error{err}
	for i := range m.cursors {
		c := &m.cursors[i]
		if c.ended {
			continue
		}
		c.ended = true
		if cerr := c.src.Close(ctx); cerr != nil {
			errs = append(errs, cerr)
		}
	}
	m.heap.h, m.last = nil, nil
	if len(errs) == 1 {
		m.err = err
	} else {
		m.err = errors.Join(errs...)
	}
	return m.err
}

// cursorHeap orders cursors by their current rows' sort values, then by
// source, so that ties go to the source listed first.
type cursorHeap struct {
	keys []SortKey
	h    []*cursor
}

func (h *cursorHeap) Len() int { return len(h.h) }

func (h *cursorHeap) Less(i, j int) bool {
	a, b := h.h[i], h.h[j]
	for n, k := range h.keys {
		if c := compareKey(&a.keys[n], &b.keys[n], k); c != 0 {
			return c < 0
		}
	}
	return a.index < b.index
}

func (h *cursorHeap) Swap(i, j int) { h.h[i], h.h[j] = h.h[j], h.h[i] }

func (h *cursorHeap) Push(x any) { h.h = append(h.h, x.(*cursor)) }

func (h *cursorHeap) Pop() any {
	n := len(h.h) - 1
	c := h.h[n]
	h.h = h.h[:n]
	return c
}
