package pgshard

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	lost := &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}
	cases := []struct {
		name      string
		errs      []error // Commit result per node
		code      string  // "" for success
		committed int     // nodes committed
		msgHas    []string
	}{
		{name: "all commit", errs: []error{nil, nil, nil}, committed: 3},
		{name: "first fails: nothing committed", errs: []error{lost, nil, nil}, code: "57P01", committed: 0},
		{name: "later fails: says which", errs: []error{nil, lost, nil}, code: "57P01", committed: 1,
			msgHas: []string{"committed on nodes n1", "failed to commit on node n2", "n3 were not committed"}},
		{name: "no SQLSTATE", errs: []error{nil, nil, errors.New("broken pipe")}, code: "XX000", committed: 2,
			msgHas: []string{"committed on nodes n1, n2", "node n3"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodes := []string{"n1", "n2", "n3"}
			txs := make([]pgx.Tx, len(tc.errs))
			fakes := make([]*commitTx, len(tc.errs))
			for i, e := range tc.errs {
				fakes[i] = &commitTx{err: e}
				txs[i] = fakes[i]
			}
			err := commitDDL(context.Background(), "items", nodes, txs)
			n := 0
			for _, f := range fakes {
				if f.committed {
					n++
				}
			}
			if n != tc.committed {
				t.Errorf("%d nodes committed, want %d", n, tc.committed)
			}
			if tc.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			code, full := pgCode(err), err.Error()
			var se *Error
			if errors.As(err, &se) {
				code, full = se.Code, full+" "+se.Detail+" "+se.Hint
			}
			if code != tc.code {
				t.Fatalf("error %v, want SQLSTATE %s", err, tc.code)
			}
			for _, h := range tc.msgHas {
				if !strings.Contains(full, h) {
					t.Errorf("error %q lacks %q", full, h)
				}
			}
		})
	}
}
