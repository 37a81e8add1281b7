package btreeindex

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/lattice-db/lattice/shardmap"
)

// SlotExpr is the SQL expression of a row's virtual slot in tree t, computed
// by PostgreSQL's own extended hash functions exactly as the proxy does in
// Go (shardmap's hash port). qualifier, if not empty, is SQL prefixed to the
// key column with a dot: an alias or an already quoted relation name.
// t.KeyType must be valid: tree creation refuses other key types.
func SlotExpr(t *shardmap.Tree, qualifier string) string {
	col := quoteIdent(t.KeyColumn)
	if qualifier != "" {
		col = qualifier + "." + col
	}
	mask := strconv.Itoa(t.SlotCount - 1)
	switch t.KeyType {
	case shardmap.KeyText:
		return "(hashtextextended(" + col + ", 0) & " + mask + ")"
	case shardmap.KeyInt:
		return "(hashint8extended(" + col + "::int8, 0) & " + mask + ")"
	case shardmap.KeyUUID:
		return "(uuid_hash_extended(" + col + ", 0) & " + mask + ")"
	}
	panic(fmt.Sprintf("btreeindex: tree %q has unsupported key type %q", t.Name, t.KeyType))
}

// SlotPredicate is a SQL condition true for rows of t whose slot lies in one
// of the inclusive ranges; "false" when there are none. It is immutable SQL,
// so a publication row filter and a fence trigger can use it too.
func SlotPredicate(t *shardmap.Tree, qualifier string, ranges [][2]int) string {
	if len(ranges) == 0 {
		return "false"
	}
	expr := SlotExpr(t, qualifier)
	parts := make([]string, len(ranges))
	for i, r := range ranges {
		if r[0] == r[1] {
			parts[i] = expr + " = " + strconv.Itoa(r[0])
		} else {
			parts[i] = expr + " BETWEEN " + strconv.Itoa(r[0]) + " AND " + strconv.Itoa(r[1])
		}
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return "(" + strings.Join(parts, " OR ") + ")"
}

// quoteIdent always quotes, as pgx.Identifier.Sanitize does (NUL bytes,
// which PostgreSQL identifiers cannot hold, dropped), so the SQL here is the
// same whichever package renders it.
func quoteIdent(s string) string {
	s = strings.ReplaceAll(s, "\x00", "")
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
