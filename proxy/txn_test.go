package proxy

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// TestSplitTag checks how the parts of a statement split across shards are
// shown to the client: one RowDescription, no per-part tags, and one tag
// with the counts added up.
func TestSplitTag(t *testing.T) {
	cases := []struct {
		tags []string
		want string
	}{
		{[]string{"UPDATE 3", "UPDATE 0", "UPDATE 12"}, "UPDATE 15"},
		{[]string{"DELETE 1", "DELETE 1"}, "DELETE 2"},
		{[]string{"INSERT 0 2", "INSERT 0 5"}, "INSERT 0 7"},
		{[]string{"UPDATE 0"}, "UPDATE 0"},
	}
	for _, c := range cases {
		sp := &splitState{}
		for i, tag := range c.tags {
			if hidden := sp.suppressed(&pgproto3.RowDescription{}); hidden != (i > 0) {
				t.Errorf("%v: RowDescription of part %d suppressed = %v", c.tags, i, hidden)
			}
			if sp.suppressed(&pgproto3.DataRow{}) {
				t.Errorf("%v: a DataRow was suppressed", c.tags)
			}
			if !sp.suppressed(commandComplete(tag)) {
				t.Errorf("%v: the tag of part %d reached the client", c.tags, i)
			}
		}
		if got := string(sp.tag().CommandTag); got != c.want {
			t.Errorf("%v: tag %q, want %q", c.tags, got, c.want)
		}
	}
}

// TestPrepareError checks that a node without prepared transactions is
// named in a clear error, and that other PREPARE errors pass unchanged.
func TestPrepareError(t *testing.T) {
	disabled := fmt.Errorf("node n2: %w", &pgconn.PgError{Severity: "ERROR", Code: "55000", Message: "prepared transactions are disabled"})
	e := sqlstate.As(prepareError("n2", disabled))
	if e.Code != "55000" || e.Hint == "" || !strings.Contains(e.Message, "n2") || !strings.Contains(e.Message, "max_prepared_transactions") {
		t.Errorf("disabled: %+v", e)
	}
	serial := &pgconn.PgError{Severity: "ERROR", Code: "40001", Message: "could not serialize access"}
	if got := prepareError("n1", serial); !errors.Is(got, serial) {
		t.Errorf("serialization failure became %v", got)
	}
}

// TestQuoteIdentArray checks the quoting of the node names in the
// participants array of a commit decision: the element is PostgreSQL's
// array syntax, in which only a backslash and a double quote are escaped.
func TestQuoteIdentArray(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`n1`, `"n1"`},
		{`a"b`, `"a\"b"`},
		{`a\b`, `"a\\b"`},
		{`{x, y}`, `"{x, y}"`},
		{`'q'`, `"'q'"`},
	} {
		if got := quoteIdentArray(c.in); got != c.want {
			t.Errorf("quoteIdentArray(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}
