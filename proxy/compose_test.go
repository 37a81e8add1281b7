package proxy

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/router"
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
