package router

import "testing"

func TestClientPosition(t *testing.T) {
	for _, tc := range []struct {
		name, client, sent string
		at, want           string // the text at the sent position, and where it is in client ("" for no position)
	}{
		{"verbatim", "select nosuch from t", "select nosuch from t", "nosuch", "nosuch"},
		{"after a qualified relation", "select * from kv where nosuch = 1", "select * from lattice_s0005.kv where nosuch = 1", "nosuch", "nosuch"},
		{"first branch of a fan-out", "select nosuch from kv",
			"(select nosuch from lattice_s0000.kv) UNION ALL (select nosuch from lattice_s0001.kv)", "nosuch", "nosuch"},
		{"inside a token", "select * from kv where v = 'ä' || nosuch2", "select * from lattice_s0001.kv where v = 'ä' || nosuch2", "such2", "such2"},
		{"multibyte before", "select 'ä€', x from kv where oops", "select 'ä€', x from lattice_s0003.kv where oops", "oops", "oops"},
		{"constants sent as parameters", "select * from kv where k = 'a' and nosuch = 1 and v = -2", "select * from lattice_s0005.kv where k = $1 and nosuch = $2 and v = $3", "nosuch", "nosuch"},
		{"a sorted fan-out", "select 'ä€', sku\nfrom catalogue where qty > 0 and nosuch2 = 'x' order by sku",
			"(select 'ä€', sku\nfrom lattice_s0000.catalogue where qty > 0 and nosuch2 = 'x') UNION ALL (select 'ä€', sku\nfrom lattice_s0002.catalogue where qty > 0 and nosuch2 = 'x') ORDER BY 2 ASC NULLS LAST",
			"nosuch2", "nosuch2"},
		{"the rewrite's own token", "select x from kv", "select x from lattice_s0003.kv", "lattice_s0003", ""},
		{"texts that do not align", "select 1", "update other set a = b where c", "where", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pos := charPos(tc.sent, tc.at)
			got := ClientPosition(tc.client, tc.sent, pos)
			want := 0
			if tc.want != "" {
				want = charPos(tc.client, tc.want)
			}
			if got != want {
				t.Fatalf("ClientPosition(%q at %d) = %d, want %d", tc.at, pos, got, want)
			}
		})
	}
}

// charPos is PostgreSQL's position of the first sub in s: 1-based, in
// characters.
func charPos(s, sub string) int {
	for i := range s {
		if len(s[i:]) >= len(sub) && s[i:i+len(sub)] == sub {
			return len([]rune(s[:i])) + 1
		}
	}
	return 0
}
