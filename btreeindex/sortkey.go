package btreeindex

import "strconv"

// SortKey is one ORDER BY key of an ordered scan: where its value is in
// each row, and the order PostgreSQL sorted the node's rows in.
//
// Collations: the merge reproduces the order of text only under a
// collation that compares bytes ("C", "POSIX", "C.UTF-8"); ByteOrder says the key has
// it, written in the statement or found by the proxy's collation probe.
// Text under any other collation is ordered by PostgreSQL (SortQuery).
type SortKey struct {
	Column     int  // 0-based index of the sort value in each source's rows (hidden sort columns included)
	Desc       bool // DESC
	NullsFirst bool // the effective null order: PostgreSQL's default is NULLS LAST for ASC, NULLS FIRST for DESC
	ByteOrder  bool // the key's collation is "C" / "POSIX": text compares bytewise
}

// String is "#col ASC|DESC NULLS FIRST|LAST", with " BYTES" for ByteOrder.
func (k SortKey) String() string {
	s := "#" + strconv.Itoa(k.Column) + " " + k.Order()
	if k.ByteOrder {
		s += " BYTES"
	}
	return s
}

// Order is the key's direction and null order as SQL ("DESC NULLS LAST"),
// always explicit, so that a node sorts exactly as the merge compares.
func (k SortKey) Order() string {
	s := "ASC"
	if k.Desc {
		s = "DESC"
	}
	if k.NullsFirst {
		return s + " NULLS FIRST"
	}
	return s + " NULLS LAST"
}
