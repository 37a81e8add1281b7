package router

import (
	"os"
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// FuzzPlan plans arbitrary text and checks the invariants of routed plans:
// no panic; a Single or InsertSplit plan renders to SQL that parses to the
// original tree with the relation moved to the shard schema; every single
// row of an InsertSplit renders to a Single INSERT with that row's key; a
// FanOut plan renders to a UNION ALL of one branch per schema; a WriteAll
// plan renders with a filter in its own WHERE.
func FuzzPlan(f *testing.F) {
	data, err := os.ReadFile("testdata/plans.txt")
	if err != nil {
		f.Fatal(err)
	}
	for _, block := range strings.Split(string(data), "\n\n") {
		var lines []string
		for _, l := range strings.Split(block, "\n") {
			if !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		if s := strings.TrimSpace(strings.Join(lines, "\n")); s != "" {
			f.Add(s)
		}
	}
	trees := testTrees()
	f.Fuzz(func(t *testing.T, sql string) {
		if len(sql) > 2000 {
			return
		}
		plans, err := NewPlanner(0).Plan(sql, trees, 1)
		if err != nil {
			e, ok := err.(*Error)
			if !ok {
				t.Fatalf("error of type %T", err)
			}
			if len(e.Code) != 5 || e.Message == "" {
				t.Fatalf("%q: error without SQLSTATE or message: %+v", sql, e)
			}
			return
		}
		for _, p := range plans {
			_ = p.String()
			switch p.Kind {
			case Refused:
				if p.Err == nil || p.Err.Code == "" || p.Err.Message == "" {
					t.Fatalf("refusal without error: %q", sql)
				}
			case FanOut:
				if p.Agg != nil {
					checkAggSQL(t, p)
					break
				}
				checkFanOutSQL(t, p)
			case WriteAll:
				checkWriteSQL(t, p)
			case Single, InsertSplit:
				rendered := p.Render("lattice_s0042")
				res, err := pg.Parse(rendered)
				if err != nil || len(res.Stmts) != 1 {
					t.Fatalf("%q renders to %q, which does not parse as one statement: %v", p.SQL, rendered, err)
				}
				if got, want := deparse(t, rendered), requalified(t, p.SQL, p.Tree.Name, "lattice_s0042"); got != want {
					t.Fatalf("%q renders to\n%s\nwant\n%s", p.SQL, got, want)
				}
				if p.Kind == InsertSplit {
					for i := range p.Rows {
						s, params := p.RenderRows("public", []int{i})
						sub, err := NewPlanner(0).Plan(s, trees, 1)
						if err != nil || len(sub) != 1 || sub[0].Kind != Single {
							t.Fatalf("%q row %d renders to %q: %v %v", p.SQL, i, s, sub, err)
						}
						k := sub[0].Key
						if k.Param > 0 {
							k.Param = params[k.Param-1]
						}
						if k != p.Rows[i] {
							t.Fatalf("%q row %d: key %v, want %v", p.SQL, i, k, p.Rows[i])
						}
					}
				}
			}
		}
	})
}
