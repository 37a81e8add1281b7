package migrator

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// A comparison sums a 64-bit hash of every row (docs/DESIGN.md 5.5). Hashing
// the row's text costs most of a comparison's CPU: the text output of every
// column. hash_record_extended (PostgreSQL 14) hashes each column with its
// type's own extended hash function instead, two to three times cheaper, but
// it is only as exact as the text where two values hash apart whenever their
// texts differ, which is not so for every type:
//
//   - numeric 1.0 and 1.00, float8 0 and -0, interval '1 day' and '24
//     hours', jsonb numbers, and text under a nondeterministic collation
//     are equal to their types, so they hash alike, while their texts
//     differ;
//   - json, point and others have no extended hash at all.
//
// So the record hash is used only for a table whose every column is of a
// type listed in exactHashTypes (equal hashes mean equal stored bytes, as
// equal texts do) under a deterministic collation; any other table is
// hashed by its text. The choice is made once, from the source table, and
// the same expression is run on both sides.
//
// hash_record_extended combines the column hashes linearly (h = h·31 +
// column hash), so a sum of record hashes over rows would equal the sums of
// each column's hashes, weighted: it would compare each column's multiset of
// values and miss values swapped between rows. hashint8extended, which
// mixes its input non-linearly, is applied to each row's hash before the
// sum.

// exactHashTypes are the column types whose extended hash separates every
// two values whose texts differ.
const exactHashTypes = "'{bool,bytea,int2,int4,int8,oid,text,varchar,date,time,timestamp,timestamptz,uuid}'::regtype[]"

// Row hash expressions of alias x. The row is x.*, never a bare x: a bare
// name is a column before it is a table, so a table with a column named x
// would hash that column alone (or fail for want of a record).
const (
	textRowHash   = "hashtextextended(x.*::text, 0)"
	recordRowHash = "hashint8extended(hash_record_extended(x.*, 0), 0)"
)

// rowHashSQL is the row hash expression for table, read on c (the source).
func rowHashSQL(ctx context.Context, c *pgx.Conn, table string) (string, error) {
	var exact bool
	err := c.QueryRow(ctx, `SELECT coalesce(bool_and(a.atttypid = ANY (`+exactHashTypes+`)
			AND (a.attcollation = 0 OR coalesce(co.collisdeterministic, false))), false)
		FROM pg_catalog.pg_attribute a LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped`, table).Scan(&exact)
	if err != nil {
		return "", fmt.Errorf("migrator: column types of %s: %w", table, err)
	}
	if exact {
		return recordRowHash, nil
	}
	return textRowHash, nil
}
