package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestReferenceCrashRecovery kills the proxy (SIGKILL, by the test-only
// LATTICE_TEST_CRASH_2PC hook) in the two-phase commit of a write of a
// reference table, after every other copy prepared and before the
// decision, or after the decision and before any COMMIT PREPARED; a new
// proxy's recoverer must finish it so that every copy holds the write, or
// none does, as the catalog node's decision log says. The write is a
// transaction of INSERT, UPDATE and DELETE, or a COPY FROM STDIN outside a
// block (its own implicit transaction across the copies).
func TestReferenceCrashRecovery(t *testing.T) {
	cases := []struct {
		name      string
		hook      string
		copy      bool
		committed bool
	}{
		{"transaction/after-prepare", "after-prepare", false, false},
		{"transaction/after-decision", "after-decision", false, true},
		{"copy/after-prepare", "after-prepare", true, false},
		{"copy/after-decision", "after-decision", true, true},
	}
	recovery := []string{"--tx-recover-interval", "200ms", "--tx-abort-after", "3s"}
	writes := []string{
		`INSERT INTO item VALUES (101, 1, 'new', 1.00, 'n'), (102, 2, 'new', 2.00, NULL)`,
		`UPDATE item SET i_price = i_price + 1, i_data = 'u' WHERE i_id <= 5`,
		`DELETE FROM item WHERE i_id = 10`,
	}
	const copyData = "201\t1\tc1\t0.50\tc\n202\t2\tc2\t0.75\t\\N\n"
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(t)
			// Nothing before the crashing write commits across nodes: the
			// tables are made on the catalog node, and making a reference
			// table is no two-phase commit.
			p1 := startProxyEnv(t, 3, []string{"LATTICE_TEST_CRASH_2PC=" + tc.hook}, recovery...)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			c := connect(t, p1.DSN("lattice"))
			nodes := []*pgx.Conn{connect(t, testNodeDSN(t, 0)), connect(t, testNodeDSN(t, 1)), connect(t, testNodeDSN(t, 2))}
			for _, tbl := range []string{"item", "item_plain"} {
				mustExec(t, c, `CREATE TABLE `+tbl+` (i_id int PRIMARY KEY, i_im_id int NOT NULL, i_name text NOT NULL, i_price numeric(7,2) NOT NULL, i_data text)`)
				mustExec(t, c, `INSERT INTO `+tbl+` SELECT i, i % 3, 'item-' || i, i, 'd' FROM generate_series(1, 20) i`)
			}
			mustExec(t, c, `SELECT lattice_create_reference_table('item')`)
			before := sameCopies(t, ctx, nodes, "")

			// The same write on the ordinary item_plain (the catalog node
			// only, one phase) gives the rows a committed write leaves.
			copyInto := func(tbl string) error {
				_, err := c.PgConn().CopyFrom(ctx, strings.NewReader(copyData), `COPY `+tbl+` (i_id, i_im_id, i_name, i_price, i_data) FROM STDIN`)
				return err
			}
			if tc.copy {
				if err := copyInto("item_plain"); err != nil {
					t.Fatal(err)
				}
			} else {
				mustExec(t, c, `BEGIN`)
				for _, w := range writes {
					mustExec(t, c, strings.ReplaceAll(w, "item", "item_plain"))
				}
				mustExec(t, c, `COMMIT`)
			}
			after := itemDump(t, ctx, nodes[0], "item_plain")
			if after == before {
				t.Fatal("the write changes nothing: the test cannot tell the outcomes apart")
			}

			var err error
			if tc.copy {
				err = copyInto("item")
			} else {
				mustExec(t, c, `BEGIN`)
				for _, w := range writes {
					mustExec(t, c, w)
				}
				_, err = c.Exec(ctx, `COMMIT`)
			}
			if err == nil {
				t.Fatal("the write committed through a proxy that should have crashed")
			}
			if !p1.WaitExit(30 * time.Second) {
				t.Fatal("the proxy did not crash at the hook")
			}

			// Every other copy prepared the write; the catalog copy's part
			// commits in one phase with the decision, or died with the proxy.
			var gid string
			for i := 1; i < 3; i++ {
				gids := preparedOn(t, i)
				if len(gids) != 1 || gid != "" && gids[0] != gid {
					t.Fatalf("node n%d holds prepared transactions %v, want the one write's", i+1, gids)
				}
				gid = gids[0]
			}
			if gids := preparedOn(t, 0); len(gids) > 0 {
				t.Fatalf("the catalog node holds prepared transactions %v: its part must commit in one phase", gids)
			}
			decided, err := queryStrings(t, nodes[0], `SELECT state FROM lattice_meta.commit_decisions WHERE gid = $1`, gid)
			if err != nil {
				t.Fatal(err)
			}
			want := before
			if tc.committed {
				want = after
			}
			if tc.committed != slices.Equal(decided, []string{"committed"}) {
				t.Fatalf("the decision log holds %v for %s after the crash at %s", decided, gid, tc.hook)
			}
			if got := refDump(t, ctx, nodes[0]); got != want {
				t.Fatalf("the catalog copy after the crash at %s:\n got %.300s\nwant %.300s", tc.hook, got, want)
			}

			p2 := startProxy(t, 3, recovery...)
			waitRecovered(t, p2)
			sameCopies(t, ctx, nodes, want)
			if !strings.Contains(p2.Log(), "two-phase recovery finished a prepared transaction") {
				t.Fatalf("the new proxy did not report finishing the transaction:\n%s", p2.Log())
			}
			// The table takes writes through the new proxy again.
			c2 := connect(t, p2.DSN("lattice"))
			mustExec(t, c2, `UPDATE item SET i_name = 'again' WHERE i_id = 1`)
			sameCopies(t, ctx, nodes, "")
		})
	}
}
