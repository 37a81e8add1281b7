package router

import (
	"slices"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

func TestCutRefs(t *testing.T) {
	for _, c := range []struct {
		name, text string
		n          int
		ok         bool
		pieces     []string
		holes      []int
	}{
		{"two references in order", "SELECT 1 FROM lattice_src_1 JOIN lattice_src_2 USING (k)", 2, true,
			[]string{"SELECT 1 FROM ", " JOIN ", " USING (k)"}, []int{0, 1}},
		{"references out of order", "SELECT 1 FROM lattice_src_2 WHERE EXISTS (SELECT 1 FROM lattice_src_1)", 2, true,
			[]string{"SELECT 1 FROM ", " WHERE EXISTS (SELECT 1 FROM ", ")"}, []int{1, 0}},
		{"a reference twice", "SELECT lattice_src_1.x FROM lattice_src_1", 1, false, nil, nil},
		{"a reference missing", "SELECT 1 FROM lattice_src_1", 2, false, nil, nil},
		{"a number past the references", "SELECT 1 FROM lattice_src_1, lattice_src_3", 2, false, nil, nil},
		{"not a number", "SELECT 1 FROM lattice_src_1, lattice_src_x", 1, false, nil, nil},
		{"in a string literal it is text", "SELECT 'lattice_src_2' FROM lattice_src_1", 1, true,
			[]string{"SELECT 'lattice_src_2' FROM ", ""}, []int{0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := cutRefs(c.text, c.n)
			if ok != c.ok {
				t.Fatalf("ok %v, want %v", ok, c.ok)
			}
			if ok && (!slices.Equal(got.pieces, c.pieces) || !slices.Equal(got.holes, c.holes)) {
				t.Fatalf("pieces %q holes %v, want %q %v", got.pieces, got.holes, c.pieces, c.holes)
			}
		})
	}
}

func TestMemberFilter(t *testing.T) {
	base := &shardmap.Tree{Name: "accounts", KeyColumn: "account_id", KeyType: shardmap.KeyInt, SlotCount: 4096}
	for _, c := range []struct {
		name   string
		member *shardmap.Tree
		want   string
	}{
		{"the base itself", base, `(hashint8extended("account_id"::int8, 0) & 4095) BETWEEN 0 AND 9`},
		{"a member keyed by another column", &shardmap.Tree{Name: "payments", KeyColumn: "acct", KeyType: shardmap.KeyInt, SlotCount: 4096},
			`(hashint8extended("acct"::int8, 0) & 4095) BETWEEN 0 AND 9`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := memberFilter(`(hashint8extended("account_id"::int8, 0) & 4095) BETWEEN 0 AND 9`, base, c.member); got != c.want {
				t.Fatalf("got %s, want %s", got, c.want)
			}
		})
	}
}
