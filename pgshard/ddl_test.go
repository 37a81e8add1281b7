package pgshard

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/sqlstate"
)

// commitTx is a pgx.Tx whose Commit fails with err (nil: succeeds).
type commitTx struct {
	pgx.Tx
	err       error
	committed bool
}

func (t *commitTx) Commit(context.Context) error {
	if t.err != nil {
		return t.err
	}
	t.committed = true
	return nil
}

func TestCommitDDL(t *testing.T) {
	type call struct {
		database string
		nodes    []string
	}
	cases := []struct {
		name      string
		txs       int
		twoPhase  bool
		commitErr error
		code      string // "" for success
		committed int    // txs committed by Commit
		calls     int    // calls of the two-phase commit
	}{
		{name: "one node commits plainly", txs: 1, twoPhase: true, committed: 1},
		{name: "several nodes use two-phase commit", txs: 3, twoPhase: true, calls: 1},
		{name: "its error is returned", txs: 2, twoPhase: true, commitErr: &sqlstate.Error{Code: "40000", Message: "rolled back"}, code: "40000", calls: 1},
		{name: "several nodes without two-phase commit", txs: 2, code: "0A000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodes := []string{"n1", "n2", "n3"}[:tc.txs]
			txs := make([]pgx.Tx, tc.txs)
			fakes := make([]*commitTx, tc.txs)
			for i := range txs {
				fakes[i] = &commitTx{}
				txs[i] = fakes[i]
			}
			var calls []call
			var commit CommitFunc
			if tc.twoPhase {
				commit = func(_ context.Context, database string, nodes []string, _ []pgx.Tx) error {
					calls = append(calls, call{database, nodes})
					return tc.commitErr
				}
			}
			err := commitDDL(context.Background(), "tenant1", "items", nodes, txs, commit)
			n := 0
			for _, f := range fakes {
				if f.committed {
					n++
				}
			}
			if n != tc.committed || len(calls) != tc.calls {
				t.Fatalf("%d plain commits and %d two-phase commits, want %d and %d", n, len(calls), tc.committed, tc.calls)
			}
			for _, c := range calls {
				if c.database != "tenant1" || strings.Join(c.nodes, ",") != strings.Join(nodes, ",") {
					t.Errorf("two-phase commit of %s on %v, want tenant1 on %v", c.database, c.nodes, nodes)
				}
			}
			code := ""
			var se *sqlstate.Error
			if errors.As(err, &se) {
				code = se.Code
			} else if err != nil {
				code = "?"
			}
			if code != tc.code {
				t.Fatalf("error %v, want SQLSTATE %q", err, tc.code)
			}
		})
	}
}
