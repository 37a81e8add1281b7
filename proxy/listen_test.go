package proxy

import (
	"testing"

	"github.com/lattice-db/lattice/router"
)

func TestListenStatements(t *testing.T) {
	cases := []struct {
		sql           string
		listen, unAll bool
	}{
		{sql: "LISTEN jobs", listen: true},
		{sql: "listen \"Jobs\"", listen: true},
		{sql: "UNLISTEN jobs", listen: true},
		{sql: "UNLISTEN *", listen: true, unAll: true},
		{sql: "unlisten  * ;", listen: true, unAll: true},
		{sql: "UNLISTEN\n*", listen: true, unAll: true},
		{sql: "UNLISTEN star", listen: true},
		{sql: "NOTIFY jobs, 'x'"},
		{sql: "SELECT 'LISTEN'"},
	}
	for _, tc := range cases {
		p := &router.Plan{Kind: router.Catalog, SQL: tc.sql}
		if got := isListenPlan(p); got != tc.listen {
			t.Errorf("isListenPlan(%q) = %v, want %v", tc.sql, got, tc.listen)
		}
		if got := unlistenAll(tc.sql); got != tc.unAll {
			t.Errorf("unlistenAll(%q) = %v, want %v", tc.sql, got, tc.unAll)
		}
	}
	if isListenPlan(&router.Plan{Kind: router.Refused, SQL: "LISTEN x"}) {
		t.Error("a refused plan is not a LISTEN to run")
	}
}

// TestLeadingWordAllocatesNothing: isListenPlan reads the first word of
// every catalog statement.
func TestLeadingWordAllocatesNothing(t *testing.T) {
	for _, sql := range []string{"SELECT v FROM kv WHERE k = 1", "listen chan", `"quoted" x`, ""} {
		if n := testing.AllocsPerRun(100, func() { _ = leadingWord(sql) }); n != 0 {
			t.Errorf("leadingWord(%q): %v allocations", sql, n)
		}
	}
	if w := firstWord("  listen chan"); w != "LISTEN" {
		t.Errorf("firstWord = %q", w)
	}
}
