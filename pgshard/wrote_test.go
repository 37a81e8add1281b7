package pgshard

import "testing"

// TestNoteCommand checks which command tags mark a backend's transaction as
// having written: a two-phase commit prepares those at once and asks the
// others.
func TestNoteCommand(t *testing.T) {
	cases := []struct {
		tags  []string
		wrote bool
	}{
		{[]string{"SELECT 1", "SELECT 0", "FETCH 10", "SHOW"}, false},
		{[]string{"BEGIN", "SET", "SAVEPOINT", "RELEASE", "ROLLBACK", "DECLARE CURSOR", "CLOSE CURSOR"}, false},
		{[]string{"SELECT 1", "UPDATE 1"}, true},
		{[]string{"INSERT 0 1"}, true},
		{[]string{"DELETE 0"}, true},
		{[]string{"MERGE 2"}, true},
		{[]string{"COPY 5"}, true},
		{[]string{"CREATE TABLE"}, true},
		{[]string{"DO"}, true},
		{[]string{"CALL"}, true},
		{[]string{"SELECTED 1"}, true}, // not a read tag: a prefix must end at a word
		{nil, false},
	}
	for _, tc := range cases {
		c := &Conn{}
		for _, tag := range tc.tags {
			c.NoteCommand([]byte(tag))
		}
		if c.Wrote != tc.wrote {
			t.Errorf("%q: Wrote = %v, want %v", tc.tags, c.Wrote, tc.wrote)
		}
	}
}
