package migrator

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// A comparison sums a 64-bit hash of every row (docs/DESIGN.md 5.5). Hashing
// the row's text costs most of a comparison's CPU: the text output of every
// column. Hashing each column's value with a hash of its type is several
// times cheaper, but it is only as exact as the text where two values hash
// apart whenever their texts differ, which is not so for every type:
//
//   - numeric 1.0 and 1.00, float8 0 and -0, interval '1 day' and '24
//     hours', jsonb numbers, and text under a nondeterministic collation
//     are equal to their types, so they hash alike, while their texts
//     differ;
//   - json, point and others have no extended hash at all.
//
// So the column hashes are used only for a table whose every column is of
// a type in columnHashes, each of which separates every two values whose
// texts differ (a timestamptz is hashed as its UTC time: as a local time,
// two instants of the hour a clock goes back would hash alike), under a
// deterministic collation; any other table is hashed by its text. The
// choice is made once, from the source table, and the same expression is
// run on both sides.
//
// Each column is hashed with its position as the seed, so values swapped
// between two columns change the row's hash; a NULL hashes as minus its
// position. The column hashes are combined by XOR and mixed by
// hashint8extended, which is not linear: summed over rows, a linear
// combination would compare each column's multiset of values and miss
// values swapped between rows. hash_record_extended, which did the same
// before, builds each row as a record and hashes it column by column again:
// twice the CPU of the column hashes on a table of a bigint, an int8 and a
// text.

// columnHashes are, per type (pg_catalog's), the hash of a column of it,
// with %[1]s for the column and %[2]d for the seed.
var columnHashes = map[string]string{
	"bool":        "hashint4extended(%[1]s::int4, %[2]d)",
	"int2":        "hashint4extended(%[1]s, %[2]d)",
	"int4":        "hashint4extended(%[1]s, %[2]d)",
	"int8":        "hashint8extended(%[1]s, %[2]d)",
	"oid":         "hashoidextended(%[1]s, %[2]d)",
	"text":        "hashtextextended(%[1]s, %[2]d)",
	"varchar":     "hashtextextended(%[1]s, %[2]d)",
	"bytea":       "hashtextextended(encode(%[1]s, 'hex'), %[2]d)",
	"date":        "timestamp_hash_extended(%[1]s::timestamp, %[2]d)",
	"time":        "time_hash_extended(%[1]s, %[2]d)",
	"timestamp":   "timestamp_hash_extended(%[1]s, %[2]d)",
	"timestamptz": "timestamp_hash_extended(%[1]s AT TIME ZONE 'UTC', %[2]d)",
	"uuid":        "uuid_hash_extended(%[1]s, %[2]d)",
}

// textRowHash hashes the row's text, of alias x. The row is x.*, never a
// bare x: a bare name is a column before it is a table, so a table with a
// column named x would hash that column alone (or fail for want of a
// record).
const textRowHash = "hashtextextended(x.*::text, 0)"

// rowHashSQL is the row hash expression for table, of alias x, read on c
// (the source).
func rowHashSQL(ctx context.Context, c *pgx.Conn, table string) (string, error) {
	rows, err := c.Query(ctx, `SELECT a.attname, CASE WHEN t.typnamespace = 'pg_catalog'::regnamespace THEN t.typname::text ELSE '' END,
			a.attcollation = 0 OR coalesce(co.collisdeterministic, false)
		FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
		LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, table)
	if err != nil {
		return "", fmt.Errorf("migrator: column types of %s: %w", table, err)
	}
	var hashes []string
	exact := true
	var name, typ string
	var deterministic bool
	_, err = pgx.ForEachRow(rows, []any{&name, &typ, &deterministic}, func() error {
		f, ok := columnHashes[typ]
		exact = exact && ok && deterministic
		seed := len(hashes) + 1
		hashes = append(hashes, fmt.Sprintf("coalesce("+f+", %[3]d)", "x."+pgx.Identifier{name}.Sanitize(), seed, -seed))
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("migrator: column types of %s: %w", table, err)
	}
	if !exact || len(hashes) == 0 {
		return textRowHash, nil
	}
	return "hashint8extended(" + strings.Join(hashes, " # ") + ", 0)", nil
}
