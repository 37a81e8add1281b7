package proxy

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

func TestRenderComposed(t *testing.T) {
	two := []pgproto3.FieldDescription{{Name: []byte("shard"), DataTypeOID: pgtype.Int4OID}, {Name: []byte("Node"), DataTypeOID: pgtype.TextOID}}
	one := []pgproto3.FieldDescription{{Name: []byte("lattice_reshard_complete"), DataTypeOID: pgtype.BoolOID}}
	cases := []struct {
		sql    string
		fields []pgproto3.FieldDescription
		want   string
	}{
		{`SELECT count(*) FROM lattice_shards('t')`, two,
			`SELECT count(*) FROM unnest(A0::int4[], A1::text[]) AS "lattice_shards"("shard", "Node")`},
		{`SELECT * FROM lattice_shards('t') s(a)`, two,
			`SELECT * FROM unnest(A0::int4[], A1::text[]) AS "s"("a", "Node")`},
		{`SELECT * FROM lattice_shards('t') WITH ORDINALITY s(a, b, c)`, two,
			`SELECT * FROM unnest(A0::int4[], A1::text[]) WITH ORDINALITY AS "s"("a", "b", "c")`},
		{`SELECT * FROM lattice_shards('t') WITH ORDINALITY`, two,
			`SELECT * FROM unnest(A0::int4[], A1::text[]) WITH ORDINALITY AS "lattice_shards"("shard", "Node", "ordinality")`},
		// A function of one column takes the alias as its column's name.
		{`SELECT * FROM lattice_reshard_complete('t') AS done`, one,
			`SELECT * FROM unnest(A0::bool[]) AS "done"("done")`},
		{`SELECT * FROM lattice_reshard_complete('t') WITH ORDINALITY AS done`, one,
			`SELECT * FROM unnest(A0::bool[]) WITH ORDINALITY AS "done"("done", "ordinality")`},
		{`SELECT NOT lattice_reshard_complete('t')`, one,
			`SELECT NOT (A0::bool) AS "?column?"`},
	}
	planner := router.NewPlanner(0)
	for _, c := range cases {
		plans, err := planner.Plan(c.sql, nil, 0)
		if err != nil || len(plans) != 1 || plans[0].Compose == nil {
			t.Fatalf("%s: not a composed plan (%v, %v)", c.sql, plans, err)
		}
		cp := plans[0].Compose
		got, err := renderComposed(cp, [][]pgproto3.FieldDescription{c.fields}, func(call, col int) string {
			return "A" + string(rune('0'+col))
		})
		if err != nil || got != c.want {
			t.Errorf("%s:\ngot  %s (%v)\nwant %s", c.sql, got, err, c.want)
		}
	}
}

func TestArrayLiterals(t *testing.T) {
	vals := [][]byte{[]byte(`plain`), nil, []byte(`q'u"o\te`), {}}
	if got, want := string(arrayText(vals)), `{"plain",NULL,"q'u\"o\\te",""}`; got != want {
		t.Errorf("arrayText: %s, want %s", got, want)
	}
	if got, want := escapeLiteral([]byte(`it's \ok`)), `E'it''s \\ok'`; got != want {
		t.Errorf("escapeLiteral: %s, want %s", got, want)
	}
}

// fakeFunctions returns rows rows of one text column of size bytes.
type fakeFunctions struct {
	cols       int
	rows, size int
}

func (f fakeFunctions) Describe(name string) ([]pgproto3.FieldDescription, error) {
	out := make([]pgproto3.FieldDescription, f.cols)
	for i := range out {
		out[i] = pgproto3.FieldDescription{Name: []byte("c"), DataTypeOID: pgtype.TextOID}
	}
	return out, nil
}

func (f fakeFunctions) Call(context.Context, string, string, []*string, map[string]*string) ([][]any, error) {
	rows := make([][]any, f.rows)
	for i := range rows {
		rows[i] = make([]any, f.cols)
		for j := range rows[i] {
			rows[i][j] = strings.Repeat("x", f.size)
		}
	}
	return rows, nil
}

// TestEvalComposedRefuses checks the bounds of evaluating a composed
// statement's calls: a value call of several columns or other than one
// row, and rows past maxComposedBytes.
func TestEvalComposedRefuses(t *testing.T) {
	cases := []struct {
		sql  string
		fn   fakeFunctions
		code string
	}{
		{`SELECT NOT lattice_reshard_complete('t')`, fakeFunctions{cols: 2, rows: 1, size: 1}, sqlstate.FeatureNotSupported},
		{`SELECT NOT lattice_reshard_complete('t')`, fakeFunctions{cols: 1, rows: 2, size: 1}, sqlstate.CardinalityViolation},
		{`SELECT NOT lattice_reshard_complete('t')`, fakeFunctions{cols: 1, rows: 0, size: 1}, sqlstate.CardinalityViolation},
		{`SELECT count(*) FROM lattice_shards('t')`, fakeFunctions{cols: 1, rows: 17, size: 1 << 20}, sqlstate.ProgramLimitExceeded},
		{`SELECT count(*) FROM lattice_shards('t')`, fakeFunctions{cols: 1, rows: 15, size: 1 << 20}, ""},
	}
	planner := router.NewPlanner(0)
	for _, c := range cases {
		plans, err := planner.Plan(c.sql, nil, 0)
		if err != nil || plans[0].Compose == nil {
			t.Fatalf("%s: not composed (%v)", c.sql, err)
		}
		s := &session{srv: &Server{functions: c.fn}}
		_, err = s.evalComposed(context.Background(), plans[0].Compose, func(*router.FuncCall) ([]*string, map[string]*string, error) {
			return nil, nil, nil
		})
		got := ""
		if err != nil {
			got = AsError(err).Code
		}
		if got != c.code {
			t.Errorf("%s with %+v: %v, want code %q", c.sql, c.fn, err, c.code)
		}
	}
}
