package pgshard

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// A COPY into a table with indexes inserts every row into every index, one
// at a time; an index built once the table is filled sorts the rows and
// writes its pages in one pass, as pg_restore builds indexes after the
// data. On the 2-core test machine COPY of 250,000 rows into a table with
// a bigint primary key took 780-810 ms, into the bare table 200-320 ms and
// the key's build after it 130-150 ms. So a copy whose transaction
// truncated its targets (no one else sees them until it commits: a shadow
// copy's, migrator.freezeTargets, and a new tree's shards, copyRows)
// drops their indexes first and builds them again before it commits
// (IndexRebuild). The drop, the copy and the build are one transaction: a
// crash or a failure anywhere in it leaves the table as it was.
//
// A table keeps its indexes, and is filled as before, when rebuilding
// them could lose something that a CREATE INDEX from pg_get_indexdef and an
// ADD CONSTRAINT ... USING INDEX do not carry: a foreign key that
// references the table (it depends on the unique index), a replica
// identity that names an index, an exclusion or deferrable constraint, an
// index in a tablespace of its own, with a comment or with per-column
// statistics targets, or one not valid. The CLUSTER mark is set again.

// IndexRebuild is what DropIndexes took off a copy's targets.
type IndexRebuild struct {
	Tables map[string]bool // the targets whose indexes were all dropped
	sql    []string        // the statements that make them again, in order
}

// targetIndexes lists the indexes of the tables named by $1 (quoted, as
// ShardTable writes them), each with what rebuilding it needs and
// whether its table must keep its indexes.
const targetIndexes = `
SELECT q.name, quote_ident(ic.relname), pg_get_indexdef(i.indexrelid),
       coalesce(quote_ident(k.conname), ''), coalesce(k.contype::text, ''),
       i.indisclustered,
       t.relreplident = 'i' OR NOT i.indisvalid OR ic.reltablespace <> 0 OR coalesce(k.contype = 'x' OR k.condeferrable, false)
         OR obj_description(i.indexrelid, 'pg_class') IS NOT NULL
         OR EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = i.indexrelid AND a.attstattarget > 0)
         OR EXISTS (SELECT 1 FROM pg_constraint f WHERE f.contype = 'f' AND f.confrelid = t.oid)
FROM unnest($1::text[]) WITH ORDINALITY AS q(name, n)
JOIN pg_class t ON t.oid = q.name::regclass
JOIN pg_index i ON i.indrelid = t.oid
JOIN pg_class ic ON ic.oid = i.indexrelid
LEFT JOIN pg_constraint k ON k.conindid = i.indexrelid AND k.conrelid = t.oid AND k.contype IN ('p', 'u', 'x')
ORDER BY q.n, i.indexrelid`

type targetIndex struct {
	table, name, def, constraint, kind string
	clustered, keep                    bool
}

// DropIndexes drops, in tx, the indexes of every table of tables that may
// lose them (above), and returns what builds them again.
func DropIndexes(ctx context.Context, tx pgx.Tx, tables []string) (IndexRebuild, error) {
	rows, err := tx.Query(ctx, targetIndexes, tables)
	if err != nil {
		return IndexRebuild{}, fmt.Errorf("pgshard: list the target's indexes: %w", err)
	}
	idx, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (targetIndex, error) {
		var x targetIndex
		err := r.Scan(&x.table, &x.name, &x.def, &x.constraint, &x.kind, &x.clustered, &x.keep)
		return x, err
	})
	if err != nil {
		return IndexRebuild{}, fmt.Errorf("pgshard: list the target's indexes: %w", err)
	}
	kept := map[string]bool{}
	for _, x := range idx {
		if x.keep {
			kept[x.table] = true
		}
	}
	rb := IndexRebuild{Tables: map[string]bool{}}
	var drops []string
	for _, x := range idx {
		if kept[x.table] {
			continue
		}
		rb.Tables[x.table] = true
		rb.sql = append(rb.sql, x.def)
		name := x.name
		if x.constraint != "" {
			drops = append(drops, "ALTER TABLE "+x.table+" DROP CONSTRAINT "+x.constraint)
			kind := "UNIQUE"
			if x.kind == "p" {
				kind = "PRIMARY KEY"
			}
			rb.sql = append(rb.sql, "ALTER TABLE "+x.table+" ADD CONSTRAINT "+x.constraint+" "+kind+" USING INDEX "+x.name)
			name = x.constraint // USING INDEX renames the index after its constraint
		} else {
			drops = append(drops, "DROP INDEX "+schemaOf(x.table)+"."+x.name)
		}
		if x.clustered {
			rb.sql = append(rb.sql, "ALTER TABLE "+x.table+" CLUSTER ON "+name)
		}
	}
	if len(drops) == 0 {
		return rb, nil
	}
	if _, err := tx.Exec(ctx, strings.Join(drops, "; ")); err != nil {
		return IndexRebuild{}, fmt.Errorf("pgshard: drop the target's indexes before the copy: %w", err)
	}
	return rb, nil
}

// Build makes the dropped indexes again, in the copy's transaction.
func (rb IndexRebuild) Build(ctx context.Context, tx pgx.Tx) error {
	if rb.Empty() {
		return nil
	}
	if _, err := tx.Exec(ctx, strings.Join(rb.sql, "; ")); err != nil {
		return fmt.Errorf("pgshard: build the target's indexes after the copy: %w", err)
	}
	return nil
}

// Empty reports whether nothing was dropped.
func (rb IndexRebuild) Empty() bool { return len(rb.sql) == 0 }

// Statements counts the statements Build runs.
func (rb IndexRebuild) Statements() int { return len(rb.sql) }

// schemaOf is the quoted schema of a table quoted as "schema"."table".
func schemaOf(table string) string {
	i := strings.Index(table, `".`)
	return table[:i+1]
}
