package integration

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestExplainOverShards: EXPLAIN of a statement over several shards
// returns one text column, QUERY PLAN: Lattice's plan (the nodes, each
// node's shards and SQL, the merge), then PostgreSQL's plan of the first
// node's part, run there. In the simple and the extended protocol (with
// and without a Describe of the statement), and inside a transaction.
// EXPLAIN ANALYZE of a write over every shard is refused and changes
// nothing.
func TestExplainOverShards(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE ex_acc (acc bigint PRIMARY KEY, name text)`)
	mustExec(t, c, `CREATE TABLE ex_inv (acc bigint, inv int, amount int, PRIMARY KEY (acc, inv))`)
	mustExec(t, c, `INSERT INTO ex_acc SELECT i, 'a' || i FROM generate_series(1, 200) i`)
	mustExec(t, c, `INSERT INTO ex_inv SELECT i % 200 + 1, i, i % 7 FROM generate_series(1, 600) i`)
	mustExec(t, c, `SELECT lattice_create_tree('ex_acc', 'acc', shard_count => 4)`)
	mustExec(t, c, `SELECT lattice_create_tree('ex_inv', 'acc', colocate_with => 'ex_acc')`)

	// Where the shards are: the nodes in order of their first shard.
	var nodes []string
	shardsOf := map[string][]string{}
	rows, err := c.Query(ctx, `SELECT shard, node FROM lattice_shards('ex_acc') ORDER BY shard`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var shard int32
		var node string
		if err := rows.Scan(&shard, &node); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(nodes, node) {
			nodes = append(nodes, node)
		}
		shardsOf[node] = append(shardsOf[node], fmt.Sprint(shard))
	}
	if rows.Err() != nil || len(nodes) != 2 {
		t.Fatalf("lattice_shards: nodes %v, %v", nodes, rows.Err())
	}
	first, other := nodes[0], nodes[1]
	schemas := func(node, table string) []string {
		var out []string
		for _, s := range shardsOf[node] {
			out = append(out, "lattice_s"+strings.Repeat("0", 4-len(s))+s+"."+table)
		}
		return out
	}

	cases := []struct {
		name, sql string
		args      []any
		head      string   // Lattice's first line starts so
		lattice   []string // more text in Lattice's lines
		postgres  *regexp.Regexp
		table     string // the part PostgreSQL explains reads the first node's shards of it, and no other
		write     bool   // one Shard line per shard
	}{
		{name: "fan-out", sql: `EXPLAIN (VERBOSE, COSTS OFF) SELECT name FROM ex_acc WHERE name <> $1 ORDER BY name LIMIT 3`, args: []any{"x"},
			head: "Lattice FanOut: SELECT over 4 shards of tree ex_acc on 2 nodes", lattice: []string{"Merge: k-way merge on ORDER BY column 1 ASC NULLS LAST", "LIMIT 3"},
			postgres: regexp.MustCompile(`^\s*Limit$`), table: "ex_acc"},
		{name: "aggregate", sql: `EXPLAIN VERBOSE SELECT count(*), sum(amount) FROM ex_inv WHERE amount > $1`, args: []any{0},
			head: "Lattice FanOut: two-step aggregate over 4 shards of tree ex_inv on 2 nodes", lattice: []string{"Final step on the catalog node", "AS lattice_c1", "<count of lattice_c1>"},
			postgres: regexp.MustCompile(`^\s*Aggregate  \(cost=`), table: "ex_inv"},
		{name: "colocated join", sql: `EXPLAIN (VERBOSE, COSTS OFF) SELECT a.name, i.amount FROM ex_acc a JOIN ex_inv i USING (acc) WHERE i.inv > $1`, args: []any{10},
			head: "Lattice FanOut: SELECT over 4 shards of colocated trees ex_acc, ex_inv on 2 nodes", lattice: []string{"Merge: the nodes' rows concatenated"},
			postgres: regexp.MustCompile(`(Join|Nested Loop)`), table: "ex_inv"},
		{name: "set operation in the final step", sql: `EXPLAIN (VERBOSE, COSTS OFF) SELECT name FROM ex_acc WHERE acc > $1 UNION SELECT amount::text FROM ex_inv ORDER BY 1`, args: []any{1},
			head: "Lattice FanOut: branch rows gathered for a set operation over 4 shards of colocated trees ex_acc, ex_inv on 2 nodes", lattice: []string{"Final step on the catalog node", "WHERE lattice_c1 = 2", "UNION SELECT"},
			postgres: regexp.MustCompile(`^\s*Append$`), table: "ex_inv"},
		{name: "update", sql: `EXPLAIN (VERBOSE, COSTS OFF) UPDATE ex_inv SET amount = amount + $1 WHERE inv > 5`, args: []any{1},
			head:     "Lattice WriteAll: UPDATE on every shard, 4 shards of tree ex_inv on 2 nodes, in one transaction committed on every node by two-phase commit",
			lattice:  []string{"Result: the shards' command tags added up"},
			postgres: regexp.MustCompile(`^\s*Update on lattice_s\d+\.ex_inv`), table: "ex_inv", write: true},
	}
	modes := []struct {
		name string
		mode pgx.QueryExecMode
	}{
		{"simple", pgx.QueryExecModeSimpleProtocol},
		{"extended", pgx.QueryExecModeCacheStatement},
		{"describe", pgx.QueryExecModeDescribeExec},
	}
	explain := func(t *testing.T, q textQuerier, mode pgx.QueryExecMode, sql string, args ...any) []string {
		t.Helper()
		rows, err := q.Query(ctx, sql, append([]any{mode}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		fds := rows.FieldDescriptions()
		if len(fds) != 1 || fds[0].Name != "QUERY PLAN" || fds[0].DataTypeOID != pgtype.TextOID {
			t.Fatalf("columns %+v, want one text column QUERY PLAN", fds)
		}
		var lines []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, line)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if tag := rows.CommandTag().String(); tag != "EXPLAIN" {
			t.Fatalf("command tag %q, want EXPLAIN", tag)
		}
		return lines
	}
	for _, m := range modes {
		for _, tc := range cases {
			t.Run(m.name+"/"+tc.name, func(t *testing.T) {
				lines := explain(t, c, m.mode, tc.sql, tc.args...)
				text := strings.Join(lines, "\n")
				t.Logf("%s\n%s", tc.sql, text)
				if lines[0] != tc.head {
					t.Fatalf("first line %q, want %q:\n%s", lines[0], tc.head, text)
				}
				split := slices.Index(lines, "PostgreSQL plan of the part on node "+first+":")
				if tc.write {
					split = slices.Index(lines, "PostgreSQL plan of the part on node "+first+", shard "+shardsOf[first][0]+":")
				}
				if split < 0 || split == len(lines)-1 {
					t.Fatalf("no PostgreSQL plan of the part on %s:\n%s", first, text)
				}
				ours, theirs := strings.Join(lines[:split], "\n"), lines[split+1:]
				for _, want := range tc.lattice {
					if !strings.Contains(ours, want) {
						t.Errorf("Lattice's plan lacks %q:\n%s", want, text)
					}
				}
				for _, node := range nodes {
					if tc.write {
						if !strings.Contains(ours, "\n  Node "+node+":\n") {
							t.Errorf("no line for node %s:\n%s", node, text)
						}
						for _, s := range shardsOf[node] {
							if !strings.Contains(ours, "\n    Shard "+s+":\n") {
								t.Errorf("no line for shard %s:\n%s", s, text)
							}
						}
					} else if want := "  Node " + node + ": shards " + strings.Join(shardsOf[node], ", "); !slices.Contains(lines[:split], want) {
						t.Errorf("no line %q:\n%s", want, text)
					}
				}
				if !slices.ContainsFunc(theirs, tc.postgres.MatchString) {
					t.Errorf("PostgreSQL's plan has no line matching %v:\n%s", tc.postgres, text)
				}
				if tc.table != "" {
					pg := strings.Join(theirs, "\n")
					want := schemas(first, tc.table)
					if tc.write {
						want = want[:1]
					}
					for _, s := range want {
						if !strings.Contains(pg, s) {
							t.Errorf("PostgreSQL's plan does not read %s:\n%s", s, text)
						}
					}
					for _, s := range schemas(other, tc.table) {
						if strings.Contains(pg, s) {
							t.Errorf("PostgreSQL's plan of %s's part reads %s of %s:\n%s", first, s, other, text)
						}
					}
				}
			})
		}
	}

	t.Run("multi-row insert", func(t *testing.T) {
		part := regexp.MustCompile(`^PostgreSQL plan of the part on node (n\d), shard (\d+):$`)
		for _, m := range modes {
			lines := explain(t, c, m.mode, `EXPLAIN (VERBOSE, COSTS OFF) INSERT INTO ex_acc (acc, name) VALUES ($1, 'p'), ($2, 'q'), ($3, 'r')`, 1001, 1002, 1003)
			text := strings.Join(lines, "\n")
			t.Logf("%s:\n%s", m.name, text)
			split := slices.IndexFunc(lines, part.MatchString)
			if !strings.HasPrefix(lines[0], "Lattice InsertSplit: INSERT of 3 rows split by shard") || split < 0 {
				t.Fatalf("%s:\n%s", m.name, text)
			}
			// The part explained is the first shard's, on its node.
			got := part.FindStringSubmatch(lines[split])
			if !slices.Contains(shardsOf[got[1]], got[2]) || !strings.Contains(text, "\n    Shard "+got[2]+":\n") {
				t.Fatalf("%s: shard %s is not on %s (%v):\n%s", m.name, got[2], got[1], shardsOf, text)
			}
			if want := "Insert on lattice_s" + strings.Repeat("0", 4-len(got[2])) + got[2] + ".ex_acc"; !slices.ContainsFunc(lines[split+1:], func(l string) bool { return strings.HasPrefix(l, want) }) {
				t.Fatalf("%s: no %q in PostgreSQL's plan:\n%s", m.name, want, text)
			}
		}
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM ex_acc WHERE acc > 1000`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("EXPLAIN inserted %d rows (%v)", n, err)
		}
	})

	t.Run("one shard", func(t *testing.T) {
		head := regexp.MustCompile(`^Lattice Single: (SELECT|UPDATE) on shard (\d+) of tree ex_acc on node (n\d)$`)
		for _, m := range modes {
			for _, tc := range []struct {
				sql, pg string // pg: what PostgreSQL's plan starts a line with, before the shard table
			}{
				// The planner picks an index or a sequential scan by the
				// shard's statistics at the time: either reads the table.
				{`EXPLAIN (VERBOSE, COSTS OFF) SELECT name FROM ex_acc WHERE acc = $1`, " on "},
				{`EXPLAIN (ANALYZE, VERBOSE, COSTS OFF, TIMING OFF) UPDATE ex_acc SET name = name WHERE acc = $1`, "Update on "},
			} {
				lines := explain(t, c, m.mode, tc.sql, 7)
				text := strings.Join(lines, "\n")
				got := head.FindStringSubmatch(lines[0])
				if got == nil || !slices.Contains(shardsOf[got[3]], got[2]) {
					t.Fatalf("%s %s: the first line names no shard of its node (%v):\n%s", m.name, tc.sql, shardsOf, text)
				}
				shard, node := got[2], got[3]
				table := "lattice_s" + strings.Repeat("0", 4-len(shard)) + shard + ".ex_acc"
				what := "PostgreSQL plan on node " + node + ", shard " + shard
				if strings.Contains(tc.sql, "ANALYZE") {
					what += " (ANALYZE ran the statement)"
				}
				split := slices.Index(lines, what+":")
				if split < 0 || !strings.HasPrefix(lines[1], "  SQL: ") || !strings.Contains(lines[1], table) ||
					!slices.ContainsFunc(lines[split+1:], func(l string) bool { return strings.Contains(l, tc.pg+table) }) {
					t.Fatalf("%s %s:\n%s", m.name, tc.sql, text)
				}
				// The row is in that shard, on that node.
				direct := connect(t, testNodeDSN(t, int(node[1]-'1')))
				var n int
				if err := direct.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE acc = 7`).Scan(&n); err != nil || n != 1 {
					t.Fatalf("%s: %d rows of key 7 in %s on %s (%v)", m.name, n, table, node, err)
				}
			}
		}
		// Other formats are PostgreSQL's own, for the tools that read them.
		var plan string
		if err := c.QueryRow(ctx, `EXPLAIN (FORMAT JSON) SELECT name FROM ex_acc WHERE acc = 7`).Scan(&plan); err != nil || !strings.HasPrefix(strings.TrimSpace(plan), "[") {
			t.Fatalf("EXPLAIN (FORMAT JSON) on one shard: %q, %v", plan, err)
		}
	})

	t.Run("in a transaction", func(t *testing.T) {
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		mustExec(t, c, `UPDATE ex_acc SET name = 'changed' WHERE acc = 1`)
		for _, m := range modes {
			lines := explain(t, tx, m.mode, `EXPLAIN SELECT count(*) FROM ex_acc WHERE name = $1`, "changed")
			if !strings.HasPrefix(lines[0], "Lattice FanOut: two-step aggregate") {
				t.Fatalf("%s: %s", m.name, strings.Join(lines, "\n"))
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("analyze of a select runs one part", func(t *testing.T) {
		for _, m := range modes {
			lines := explain(t, c, m.mode, `EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) SELECT * FROM ex_inv WHERE amount = $1`, 3)
			text := strings.Join(lines, "\n")
			if !slices.Contains(lines, "PostgreSQL plan of the part on node "+first+" (ANALYZE ran this part only):") ||
				!strings.Contains(text, "(actual rows=") || !strings.Contains(text, "Execution Time") {
				t.Fatalf("%s:\n%s", m.name, text)
			}
		}
	})

	t.Run("analyze of a write over every shard changes nothing", func(t *testing.T) {
		var before, after int64
		if err := c.QueryRow(ctx, `SELECT sum(amount) FROM ex_inv`).Scan(&before); err != nil {
			t.Fatal(err)
		}
		for _, m := range modes {
			for _, sql := range []string{
				`EXPLAIN ANALYZE UPDATE ex_inv SET amount = amount + 100`,
				`EXPLAIN (ANALYZE true, VERBOSE) DELETE FROM ex_inv WHERE inv > 0`,
				`EXPLAIN ANALYZE INSERT INTO ex_inv VALUES (1, 1001, 50), (2, 1002, 50), (3, 1003, 50)`,
			} {
				_, err := c.Exec(ctx, sql, m.mode)
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || pe.Code != "0A000" || !strings.Contains(pe.Hint, "without ANALYZE") {
					t.Fatalf("%s %s: %v, want 0A000 with a hint", m.name, sql, err)
				}
			}
		}
		if err := c.QueryRow(ctx, `SELECT sum(amount) FROM ex_inv`).Scan(&after); err != nil || after != before {
			t.Fatalf("sum(amount) %d before, %d after (%v)", before, after, err)
		}
	})

	t.Run("format json is refused", func(t *testing.T) {
		_, err := c.Exec(ctx, `EXPLAIN (FORMAT JSON) SELECT * FROM ex_acc`)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "0A000" || !strings.Contains(pe.Hint, "FORMAT TEXT") {
			t.Fatalf("%v, want 0A000 with a hint", err)
		}
	})
}
