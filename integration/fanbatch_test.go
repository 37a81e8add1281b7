package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// fetchBatches binds each of sqls to a portal of its own in one
// transaction, then runs the Executes of fetches in order, each in a
// round trip of its own (portal index and row limit, 0 for all), as a
// driver fetching in batches does. It returns a transcript: each
// Execute's rows and how it ended.
func fetchBatches(ctx context.Context, pc *pgconn.PgConn, sqls []string, fetches [][2]int) (string, error) {
	if _, err := pc.Exec(ctx, "BEGIN").ReadAll(); err != nil {
		return "", err
	}
	fe := pc.Frontend()
	var out strings.Builder
	round := func() error {
		fe.Send(&pgproto3.Sync{})
		if err := fe.Flush(); err != nil {
			return err
		}
		for {
			msg, err := pc.ReceiveMessage(ctx)
			if err != nil {
				return err
			}
			switch m := msg.(type) {
			case *pgproto3.DataRow:
				for i, v := range m.Values {
					if i > 0 {
						out.WriteByte(',')
					}
					out.Write(v)
				}
				out.WriteByte(' ')
			case *pgproto3.PortalSuspended:
				out.WriteString("| suspended\n")
			case *pgproto3.CommandComplete:
				fmt.Fprintf(&out, "| %s\n", m.CommandTag)
			case *pgproto3.ErrorResponse:
				fmt.Fprintf(&out, "| ERROR %s %s\n", m.Code, m.Message)
			case *pgproto3.ReadyForQuery:
				return nil
			}
		}
	}
	for i, sql := range sqls {
		fe.Send(&pgproto3.Parse{Query: sql})
		fe.Send(&pgproto3.Bind{DestinationPortal: fmt.Sprintf("c%d", i)})
	}
	if err := round(); err != nil {
		return "", err
	}
	for _, f := range fetches {
		fe.Send(&pgproto3.Execute{Portal: fmt.Sprintf("c%d", f[0]), MaxRows: uint32(f[1])})
		if err := round(); err != nil {
			return "", err
		}
	}
	_, err := pc.Exec(ctx, "ROLLBACK").ReadAll()
	return out.String(), err
}

// TestFanOutBatches: a SELECT over several shards fetched in batches
// (Execute with a row limit, as JDBC's setFetchSize and pg-cursor send)
// answers as the same SELECT on one PostgreSQL table does, batch by batch:
// the same rows, PortalSuspended after each full batch, the batch's own
// count in the tag, two portals read in turn, the merge on the proxy and
// the final step on the catalog node. Every portal is bound in a batch of
// its own before its first Execute, as a transaction allows. Past
// --max-merge-memory, for one portal or for two together, it fails with
// 53200 and the session goes on.
func TestFanOutBatches(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2, "--max-merge-memory", "200000")
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	treeWithTwin(t, c, "batched", `(id int PRIMARY KEY, grp int NOT NULL, name text NOT NULL)`,
		` SELECT g, g % 7, 'name-' || g FROM generate_series(1, 100) g`)
	byID := `SELECT id, name FROM batched ORDER BY id`
	cases := []struct {
		name    string
		sqls    []string
		fetches [][2]int
	}{
		{"no row limit, in a batch after the Bind's", []string{byID}, [][2]int{{0, 0}}},
		{"merge in batches of 30, then the rest", []string{byID}, [][2]int{{0, 30}, {0, 30}, {0, 0}, {0, 5}}},
		{"batches that end exactly at the last row", []string{`SELECT id FROM batched WHERE id <= 20 ORDER BY id`}, [][2]int{{0, 10}, {0, 10}, {0, 10}}},
		{"a batch larger than the result", []string{`SELECT id FROM batched WHERE id > 95 ORDER BY id DESC`}, [][2]int{{0, 50}, {0, 50}}},
		{"two portals in turn", []string{byID, `SELECT id, grp FROM batched ORDER BY grp, id LIMIT 40 OFFSET 3`}, [][2]int{{0, 7}, {1, 11}, {0, 7}, {1, 0}, {0, 0}}},
		{"aggregates in the final step", []string{`SELECT grp, count(*), sum(id) FROM batched GROUP BY grp ORDER BY grp`}, [][2]int{{0, 3}, {0, 3}, {0, 3}}},
		{"no rows", []string{`SELECT id FROM batched WHERE name = 'none' ORDER BY id`}, [][2]int{{0, 4}, {0, 4}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A node left without the batch's Sync keeps its rows, and
			// the merge would wait for them without end.
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			got, err := fetchBatches(ctx, c.PgConn(), tc.sqls, tc.fetches)
			if err != nil {
				t.Fatalf("through the tree: %v", err)
			}
			plain := make([]string, len(tc.sqls))
			for i, sql := range tc.sqls {
				plain[i] = strings.ReplaceAll(sql, "FROM batched", "FROM batched_plain")
			}
			want, err := fetchBatches(ctx, c.PgConn(), plain, tc.fetches)
			if err != nil {
				t.Fatalf("on the plain table: %v", err)
			}
			if got != want {
				t.Fatalf("through the tree:\n%s\non one table:\n%s", got, want)
			}
		})
	}

	// 3,000 rows of about 100 bytes pass the 200,000-byte bound.
	mustExec(t, c, `INSERT INTO batched SELECT g, 0, repeat('x', 100) FROM generate_series(101, 3100) g`)
	got, err := fetchBatches(ctx, c.PgConn(), []string{byID}, [][2]int{{0, 10}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, "| ERROR 53200 ") || !strings.Contains(got, "in batches") {
		t.Fatalf("a batched fetch past --max-merge-memory: %q, want 53200", got)
	}
	// 1,200 of those rows fit alone, and two portals of them do not: the
	// bound holds for all of a session's portals together.
	half := `SELECT id, name FROM batched WHERE id BETWEEN 101 AND 1300 ORDER BY id`
	got, err = fetchBatches(ctx, c.PgConn(), []string{half, half}, [][2]int{{0, 10}, {1, 10}})
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(got, "\n"); len(lines) < 2 || !strings.HasSuffix(lines[0], "| suspended") || !strings.HasPrefix(lines[1], "| ERROR 53200 ") {
		t.Fatalf("two portals that fit only alone: %q, want the first suspended and the second 53200", got)
	}
	var n int
	if err := c.QueryRow(ctx, `SELECT count(*) FROM batched`).Scan(&n); err != nil || n != 3100 {
		t.Fatalf("the session after the refusal: %d rows, %v", n, err)
	}
}
