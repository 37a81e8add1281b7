package integration

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// genTx is a generated transaction: its statements in order, then COMMIT
// or ROLLBACK.
type genTx struct {
	stmts  []string
	commit bool
}

// txQueries generates n transactions of one to six statements: writes of
// writeQueries, reads of the whole of sqa or sqb and of one key, and
// savepoints, released or rolled back to.
func txQueries(seed uint64, n int) []genTx {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	writes := writeQueries(seed+2, 4*n)
	reads := []string{
		"SELECT count(*), sum(x), max(y) FROM sqa",
		"SELECT a, count(*), sum(z) FROM sqb GROUP BY a ORDER BY a LIMIT 40",
		"SELECT * FROM sqa WHERE a = 150",
		"SELECT o.a, i.b, i.z FROM sqa o JOIN sqb i USING (a) WHERE o.x > 6",
	}
	var out []genTx
	for range n {
		var tx genTx
		var saved []string
		for k := 1 + rng.IntN(6); k > 0; k-- {
			switch d := rng.IntN(20); {
			case d < 11:
				tx.stmts = append(tx.stmts, writes[rng.IntN(len(writes))])
			case d < 15:
				tx.stmts = append(tx.stmts, reads[rng.IntN(len(reads))])
			case d < 17 || len(saved) == 0:
				name := fmt.Sprintf("s%d", len(saved)+1)
				saved = append(saved, name)
				tx.stmts = append(tx.stmts, "SAVEPOINT "+name)
			case d < 19:
				// The savepoint stays after a rollback to it; the later
				// ones go.
				i := rng.IntN(len(saved))
				tx.stmts = append(tx.stmts, "ROLLBACK TO SAVEPOINT "+saved[i])
				saved = saved[:i+1]
			default:
				i := rng.IntN(len(saved))
				tx.stmts = append(tx.stmts, "RELEASE SAVEPOINT "+saved[i])
				saved = saved[:i]
			}
		}
		tx.commit = rng.IntN(10) < 7
		out = append(out, tx)
	}
	return out
}

// TestTransactionsEqualPostgres runs txQueries through the proxy, over the
// trees and, statement by statement beside them, over plain tables of the
// same rows, while the trees reshard and move between nodes. Each
// statement is refused (0A000, and both transactions are rolled back),
// or fails as on the plain tables, or returns their rows; after each
// transaction the trees hold what the plain tables hold. A statement that
// fails on both is rolled back to the last savepoint when there is one.
func TestTransactionsEqualPostgres(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	trees := connect(t, p.DSN("lattice"))
	plain := connect(t, p.DSN("lattice"))
	makeGenTables(t, trees)
	reshards := reshardGenGroup(t, p)
	ran, refused, committed := 0, 0, 0
	txs := txQueries(genSeed(t), 60)
	for start := time.Now(); ; {
		for i, tx := range txs {
			run := genRuns[i%len(genRuns)]
			mustExec(t, trees, "BEGIN")
			mustExec(t, plain, "BEGIN")
			end := "COMMIT"
			if !tx.commit {
				end = "ROLLBACK"
			}
			var done []string
			for _, q := range tx.stmts {
				got, gerr := runGen(t, trees, q, run)
				want, werr := runGen(t, plain, onPlainTables(q), run)
				done = append(done, q)
				if gerr != nil && pgCode(gerr) == "0A000" {
					refused++
					end = "ROLLBACK"
					break
				}
				if gerr != nil || werr != nil {
					if pgCode(gerr) != pgCode(werr) {
						t.Fatalf("%s (%s), in a transaction after %q: through the trees %v, on plain tables %v", q, run, done[:len(done)-1], gerr, werr)
					}
					if s := lastSavepoint(done); s != "" && !strings.HasPrefix(q, "RELEASE") {
						mustExec(t, trees, "ROLLBACK TO SAVEPOINT "+s)
						mustExec(t, plain, "ROLLBACK TO SAVEPOINT "+s)
						continue
					}
					end = "ROLLBACK"
					break
				}
				ran++
				if !topOrdered(q) {
					slices.Sort(got)
					slices.Sort(want)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%s (%s), in a transaction after %q: %d rows through the trees, %d on plain tables; %s", q, run, done[:len(done)-1], len(got), len(want), firstDiff(got, want))
				}
			}
			mustExec(t, trees, end)
			mustExec(t, plain, end)
			if end == "COMMIT" {
				committed++
			}
			got, err := genState(trees, false)
			if err != nil {
				t.Fatal(err)
			}
			want, err := genState(plain, true)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("after %q and %s (%s): the trees hold %v, the plain tables %v", done, end, run, got, want)
			}
		}
		if reshards.count() == 3 || time.Since(start) > time.Minute {
			break
		}
	}
	completed, err := reshards.stop()
	t.Logf("%d statements ran, %d transactions were refused, %d committed; %d of 3 reshards completed meanwhile", ran, refused, committed, completed)
	if err != nil {
		t.Fatalf("reshard: %v", err)
	}
	if committed < len(txs)/3 {
		t.Fatalf("only %d transactions committed", committed)
	}
}

// lastSavepoint is the savepoint a statement after done may roll back to:
// the last one made and not released since.
func lastSavepoint(done []string) string {
	var saved []string
	for _, q := range done {
		switch {
		case strings.HasPrefix(q, "SAVEPOINT "):
			saved = append(saved, strings.TrimPrefix(q, "SAVEPOINT "))
		case strings.HasPrefix(q, "RELEASE SAVEPOINT "):
			if i := slices.Index(saved, strings.TrimPrefix(q, "RELEASE SAVEPOINT ")); i >= 0 {
				saved = saved[:i]
			}
		case strings.HasPrefix(q, "ROLLBACK TO SAVEPOINT "):
			if i := slices.Index(saved, strings.TrimPrefix(q, "ROLLBACK TO SAVEPOINT ")); i >= 0 {
				saved = saved[:i+1]
			}
		}
	}
	if len(saved) == 0 {
		return ""
	}
	return saved[len(saved)-1]
}
