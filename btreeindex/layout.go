package btreeindex

import (
	"strconv"
	"strings"

	"github.com/lattice-db/lattice/sqlstate"
)

// Layout is the B+ layout of a tree's shards, as PostgreSQL's storage
// parameters shape it: how full a heap page is packed, how full each
// btree index's leaf pages are packed, and whether btree indexes store
// duplicates once. lattice_resize sets it. A plain ALTER ... SET changes
// only the pages written from then on, so the migrator rewrites each shard
// into a fresh table created with the layout (docs/DESIGN.md section 5.6).
type Layout struct {
	// Fillfactor of the heap, 10 to 100 (PostgreSQL's HEAP_MIN_FILLFACTOR
	// to 100).
	Fillfactor int `json:"fillfactor"`
	// IndexFillfactor of every btree index, 10 to 100; 0 keeps each
	// index's own.
	IndexFillfactor int `json:"index_fillfactor,omitempty"`
	// Deduplicate sets deduplicate_items of every btree index; nil keeps
	// each index's own.
	Deduplicate *bool `json:"deduplicate,omitempty"`
}

// Fillfactor bounds, PostgreSQL 15's for heaps and for btree indexes.
const (
	MinFillfactor = 10
	MaxFillfactor = 100
)

// Validate refuses a layout PostgreSQL would refuse, before anything is
// recorded, with the argument's name.
func (l Layout) Validate() error {
	if l.Fillfactor < MinFillfactor || l.Fillfactor > MaxFillfactor {
		e := sqlstate.New(sqlstate.InvalidParameterValue, "fillfactor %d is out of range: it must be between %d and %d", l.Fillfactor, MinFillfactor, MaxFillfactor)
		e.Hint = "Give fillfactor => n with 10 <= n <= 100 (100 packs heap pages full; lower leaves room for updates on the same page)."
		return e
	}
	if l.IndexFillfactor != 0 && (l.IndexFillfactor < MinFillfactor || l.IndexFillfactor > MaxFillfactor) {
		e := sqlstate.New(sqlstate.InvalidParameterValue, "index_fillfactor %d is out of range: it must be between %d and %d", l.IndexFillfactor, MinFillfactor, MaxFillfactor)
		e.Hint = "Give index_fillfactor => n with 10 <= n <= 100, or leave it out to keep each index's own."
		return e
	}
	return nil
}

// tableOptions is the heap's storage parameter list.
func (l Layout) tableOptions() string { return "fillfactor = " + strconv.Itoa(l.Fillfactor) }

// indexOptions is a btree index's storage parameter list, "" when the
// layout leaves the indexes alone.
func (l Layout) indexOptions() string {
	var opts []string
	if l.IndexFillfactor != 0 {
		opts = append(opts, "fillfactor = "+strconv.Itoa(l.IndexFillfactor))
	}
	if l.Deduplicate != nil {
		opts = append(opts, "deduplicate_items = "+map[bool]string{true: "on", false: "off"}[*l.Deduplicate])
	}
	return strings.Join(opts, ", ")
}

// Statements set the layout on table (quoted and qualified) and on its
// btree indexes, named unqualified in btrees and qualified by schema
// (quoted). Setting storage parameters rewrites nothing: on an empty table
// (a shard being created, the template) it is the layout of every row
// written later.
func (l Layout) Statements(table, schema string, btrees []string) []string {
	out := []string{"ALTER TABLE " + table + " SET (" + l.tableOptions() + ")"}
	if opts := l.indexOptions(); opts != "" {
		for _, ix := range btrees {
			out = append(out, "ALTER INDEX "+schema+"."+quoteIdent(ix)+" SET ("+opts+")")
		}
	}
	return out
}

// LogEntry is the layout as one entry of a tree's DDL log (pgshard's
// "{{table}}" and "{{schema}}" stand for each shard's), so that every shard
// created from then on (a resize's target, a split's, a move's) is created
// with it. The entry starts with a comment naming the resize, so that a
// resize run again after a crash finds it there (HasLogEntry).
func (l Layout) LogEntry(resize string, btrees []string) string {
	return logMarker(resize) + " " + strings.Join(l.Statements("{{table}}", "{{schema}}", btrees), "; ")
}

// HasLogEntry reports whether ddl holds resize's LogEntry.
func HasLogEntry(ddl []string, resize string) bool {
	m := logMarker(resize)
	for _, s := range ddl {
		if strings.HasPrefix(s, m) {
			return true
		}
	}
	return false
}

func logMarker(resize string) string {
	return "/* lattice_resize " + strings.ReplaceAll(resize, "*/", "") + " */"
}

// String is the layout as lattice_resize's arguments, for messages.
func (l Layout) String() string {
	s := "fillfactor => " + strconv.Itoa(l.Fillfactor)
	if l.IndexFillfactor != 0 {
		s += ", index_fillfactor => " + strconv.Itoa(l.IndexFillfactor)
	}
	if l.Deduplicate != nil {
		s += ", deduplicate => " + strconv.FormatBool(*l.Deduplicate)
	}
	return s
}
