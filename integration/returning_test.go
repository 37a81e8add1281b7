package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TestInsertReturningOrder: a multi-row INSERT ... RETURNING over several
// shards returns its rows in the order of its VALUES rows, as PostgreSQL
// does, in both protocols, in and out of a transaction, on one node and
// over several; clients pair the rows with what they sent. Past
// --max-merge-memory it fails and inserts nothing.
func TestInsertReturningOrder(t *testing.T) {
	ctx := context.Background()
	for _, nodes := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d nodes", nodes), func(t *testing.T) {
			resetNodes(t) // --node seeds an empty registry only
			p := startProxy(t, nodes, "--max-merge-memory", "100000")
			c := connect(t, p.DSN("lattice"))
			tree := fmt.Sprintf("ret%d", nodes)
			for _, tbl := range []string{tree, tree + "_plain"} {
				mustExec(t, c, `CREATE TABLE `+tbl+` (k bigint PRIMARY KEY, v text, d text DEFAULT 'default')`)
			}
			mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('%s', 'k', shard_count => 16)`, tree))
			var used int
			if err := c.QueryRow(ctx, `SELECT count(DISTINCT node) FROM lattice_shards($1)`, tree).Scan(&used); err != nil || used != nodes {
				t.Fatalf("the tree's shards are on %d nodes (%v), want %d", used, err, nodes)
			}
			values := func(first, n int, v string) string {
				var rows []string
				for i := range n {
					rows = append(rows, fmt.Sprintf("(%d, '%s%d')", (first+i*7919)%100000, v, i))
				}
				return strings.Join(rows, ", ")
			}
			inserts := []struct {
				name, sql string
				inTx      bool
			}{
				{"plain", `INSERT INTO {t} (k, v) VALUES ` + values(1, 40, "a") + ` RETURNING k, v, d`, false},
				{"in a transaction", `INSERT INTO {t} (k, v) VALUES ` + values(2, 40, "b") + ` RETURNING *`, true},
				// Half of its rows update rows kept from before.
				{"on conflict do update", `INSERT INTO {t} (k, v) VALUES ` + values(5, 60, "c") + ` ON CONFLICT (k) DO UPDATE SET v = {t}.v || excluded.v RETURNING k, v, d`, false},
			}
			keep := func(tbl string) {
				mustExec(t, c, `DELETE FROM `+tbl)
				mustExec(t, c, `INSERT INTO `+tbl+` (k, v, d) VALUES `+strings.ReplaceAll(values(5, 30, "keep"), "')", "', 'kept')"))
			}
			modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol}
			for _, in := range inserts {
				for _, mode := range modes {
					t.Run(in.name+" "+mode.String(), func(t *testing.T) {
						var got [2][]string
						for i, tbl := range []string{tree, tree + "_plain"} {
							keep(tbl)
							if in.inTx {
								mustExec(t, c, `BEGIN`)
							}
							rows, err := c.Query(ctx, strings.ReplaceAll(in.sql, "{t}", tbl), mode)
							if err != nil {
								t.Fatal(err)
							}
							if got[i], err = collectStrings(rows); err != nil {
								t.Fatalf("%s: %v", tbl, err)
							}
							if in.inTx {
								mustExec(t, c, `ROLLBACK`)
							}
						}
						if !slices.Equal(got[0], got[1]) {
							t.Errorf("RETURNING rows\n tree:  %v\n plain: %v", got[0], got[1])
						}
					})
				}
			}
			t.Run("past the bound", func(t *testing.T) {
				sql := `INSERT INTO ` + tree + ` (k, v) VALUES ` + values(3, 20, "big") + ` RETURNING repeat(v, 2000)`
				for _, mode := range modes {
					if _, err := c.Exec(ctx, sql, mode); pgCode(err) != "54000" {
						t.Fatalf("%s: %v, want SQLSTATE 54000", mode, err)
					}
					if n := countWhere(t, c, tree, "v LIKE 'big%'"); n != 0 {
						t.Fatalf("%s: %d rows inserted by the failed INSERT", mode, n)
					}
					mustExec(t, c, `BEGIN`)
					if _, err := c.Exec(ctx, sql, mode); pgCode(err) != "54000" {
						t.Fatalf("%s in a transaction: %v, want SQLSTATE 54000", mode, err)
					}
					tag, err := c.Exec(ctx, `COMMIT`)
					if err != nil || tag.String() != "ROLLBACK" {
						t.Fatalf("%s: COMMIT after the failed INSERT: %v %v, want ROLLBACK", mode, tag, err)
					}
					if n := countWhere(t, c, tree, "v LIKE 'big%'"); n != 0 {
						t.Fatalf("%s: %d rows committed by the failed transaction", mode, n)
					}
				}
			})
		})
	}
}

// TestSplitReturningRowLimit: an Execute with a row limit of a statement
// split across shards gets every row, in VALUES order, and the tag: the
// parts used to suspend at the limit one by one.
func TestSplitReturningRowLimit(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE lim (k bigint PRIMARY KEY, v text)`)
	mustExec(t, c, `SELECT lattice_create_tree('lim', 'k', shard_count => 16)`)
	fe := c.PgConn().Frontend()
	for _, tc := range []struct{ sql, tag string }{
		{`INSERT INTO lim VALUES (901, 'a'), (902, 'b'), (903, 'c'), (904, 'd'), (905, 'e') RETURNING k`, "INSERT 0 5"},
		{`UPDATE lim SET v = v || '!' RETURNING v`, "UPDATE 5"},
	} {
		fe.Send(&pgproto3.Parse{Query: tc.sql})
		fe.Send(&pgproto3.Bind{})
		fe.Send(&pgproto3.Execute{MaxRows: 2})
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var rows []string
		var got []string
		for {
			m, err := fe.Receive()
			if err != nil {
				t.Fatal(err)
			}
			switch m := m.(type) {
			case *pgproto3.DataRow:
				rows = append(rows, string(m.Values[0]))
			case *pgproto3.ErrorResponse:
				got = append(got, "error "+m.Code+" "+m.Message)
			case *pgproto3.CommandComplete:
				got = append(got, string(m.CommandTag))
			case *pgproto3.PortalSuspended:
				got = append(got, "suspended")
			}
			if _, ok := m.(*pgproto3.ReadyForQuery); ok {
				break
			}
		}
		if len(got) != 1 || got[0] != tc.tag || len(rows) != 5 {
			t.Fatalf("%s with a row limit of 2: rows %v, then %v; want 5 rows and %s", tc.sql, rows, got, tc.tag)
		}
		if strings.HasPrefix(tc.sql, "INSERT") && !slices.Equal(rows, []string{"901", "902", "903", "904", "905"}) {
			t.Fatalf("rows %v, want them in VALUES order", rows)
		}
	}
}
