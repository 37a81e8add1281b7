package btreeindex

import (
	"errors"
	"slices"
	"testing"

	"github.com/lattice-db/lattice/sqlstate"
)

func TestLayoutValidate(t *testing.T) {
	off := false
	for _, tc := range []struct {
		l  Layout
		ok bool
	}{
		{Layout{Fillfactor: 10}, true},
		{Layout{Fillfactor: 100}, true},
		{Layout{Fillfactor: 70, IndexFillfactor: 10, Deduplicate: &off}, true},
		{Layout{Fillfactor: 70, IndexFillfactor: 100}, true},
		{Layout{Fillfactor: 9}, false},
		{Layout{Fillfactor: 101}, false},
		{Layout{Fillfactor: 0}, false},
		{Layout{Fillfactor: 70, IndexFillfactor: 9}, false},
		{Layout{Fillfactor: 70, IndexFillfactor: 101}, false},
		{Layout{Fillfactor: 70, IndexFillfactor: -1}, false},
	} {
		err := tc.l.Validate()
		if tc.ok != (err == nil) {
			t.Errorf("%s: Validate() = %v", tc.l, err)
			continue
		}
		var se *sqlstate.Error
		if err != nil && (!errors.As(err, &se) || se.Code != sqlstate.InvalidParameterValue || se.Hint == "") {
			t.Errorf("%s: Validate() = %#v, want 22023 with a hint", tc.l, err)
		}
	}
}

func TestLayoutStatements(t *testing.T) {
	on, off := true, false
	for _, tc := range []struct {
		l    Layout
		want []string
	}{
		{Layout{Fillfactor: 70}, []string{`ALTER TABLE "s"."t" SET (fillfactor = 70)`}},
		{Layout{Fillfactor: 50, IndexFillfactor: 80}, []string{
			`ALTER TABLE "s"."t" SET (fillfactor = 50)`,
			`ALTER INDEX "s"."t_pkey" SET (fillfactor = 80)`,
			`ALTER INDEX "s"."Odd ""ix""" SET (fillfactor = 80)`}},
		{Layout{Fillfactor: 100, Deduplicate: &off}, []string{
			`ALTER TABLE "s"."t" SET (fillfactor = 100)`,
			`ALTER INDEX "s"."t_pkey" SET (deduplicate_items = off)`,
			`ALTER INDEX "s"."Odd ""ix""" SET (deduplicate_items = off)`}},
		{Layout{Fillfactor: 90, IndexFillfactor: 60, Deduplicate: &on}, []string{
			`ALTER TABLE "s"."t" SET (fillfactor = 90)`,
			`ALTER INDEX "s"."t_pkey" SET (fillfactor = 60, deduplicate_items = on)`,
			`ALTER INDEX "s"."Odd ""ix""" SET (fillfactor = 60, deduplicate_items = on)`}},
	} {
		got := tc.l.Statements(`"s"."t"`, `"s"`, []string{"t_pkey", `Odd "ix"`})
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: Statements =\n%q\nwant\n%q", tc.l, got, tc.want)
		}
	}
}

func TestLayoutLogEntry(t *testing.T) {
	l := Layout{Fillfactor: 50, IndexFillfactor: 80}
	got := l.LogEntry("ab12", []string{"t_pkey"})
	want := `/* lattice_resize ab12 */ ALTER TABLE {{table}} SET (fillfactor = 50); ALTER INDEX {{schema}}."t_pkey" SET (fillfactor = 80)`
	if got != want {
		t.Errorf("LogEntry = %q, want %q", got, want)
	}
	ddl := []string{"CREATE TABLE {{table}} (k int PRIMARY KEY)", got}
	if !HasLogEntry(ddl, "ab12") || HasLogEntry(ddl, "ab1") || HasLogEntry(ddl[:1], "ab12") {
		t.Error("HasLogEntry does not find exactly the resize's entry")
	}
}
