package router

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

var update = flag.Bool("update", false, "rewrite testdata/plans.golden")

// treeMap is a Trees for tests.
type treeMap map[string]*shardmap.Tree

func (m treeMap) Tree(name string) (*shardmap.Tree, bool) {
	t, ok := m[name]
	return t, ok
}

// Group puts accounts, invoices and payments in one colocation group.
func (m treeMap) Group(t *shardmap.Tree) string {
	switch t.Name {
	case "accounts", "invoices", "payments":
		return "accounts"
	}
	return ""
}

// Reference makes plans and regions reference tables.
func (m treeMap) Reference(name string) bool { return name == "plans" || name == "regions" }

func (m treeMap) ReferenceNames() []string { return []string{"plans", "regions"} }

func testTrees() treeMap {
	return treeMap{
		"accounts":  {Name: "accounts", KeyColumn: "account_id", KeyType: shardmap.KeyInt, Columns: []string{"account_id", "plan_id", "name"}},
		"invoices":  {Name: "invoices", KeyColumn: "account_id", KeyType: shardmap.KeyInt, Columns: []string{"account_id", "invoice_id", "amount"}},
		"payments":  {Name: "payments", KeyColumn: "acct", KeyType: shardmap.KeyInt, Columns: []string{"acct", "invoice_id", "paid"}},
		"catalogue": {Name: "catalogue", KeyColumn: "sku", KeyType: shardmap.KeyText, Columns: []string{"sku", "name", "price", "qty"}},
		"orders":    {Name: "orders", KeyColumn: "id", KeyType: shardmap.KeyInt, Columns: []string{"id", "customer", "total"}},
		"MixedCase": {Name: "MixedCase", KeyColumn: "k", KeyType: shardmap.KeyUUID, Columns: []string{"k", "v"}},
	}
}

// readStatements reads testdata/plans.txt: blocks separated by blank
// lines, # lines are comments.
func readStatements(t *testing.T) []string { return readStatementsFile(t) }

func readStatementsFile(t testing.TB) []string {
	data, err := os.ReadFile("testdata/plans.txt")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			out = append(out, strings.Join(cur, "\n"))
			cur = nil
		}
	}
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.TrimSpace(line) == "":
			flush()
		default:
			cur = append(cur, line)
		}
	}
	flush()
	return out
}

const goldenSchema = "lattice_s0005"

// goldenSources are the shards of a fan-out in the golden file: the
// second is read through a filter, as a mixed shard is.
var goldenSources = []btreeindex.Source{{Schema: "lattice_s0001"}, {Schema: "lattice_s0003", Filter: "lattice_owned"}}

// describe is the golden text of one statement string.
func describe(p *Planner, sql string) string {
	var b strings.Builder
	b.WriteString(sql + "\n")
	plans, err := p.Plan(sql, testTrees(), 1)
	if err != nil {
		var e *sqlstate.Error
		if !errors.As(err, &e) {
			return b.String() + "=> NOT AN *sqlstate.Error: " + err.Error() + "\n"
		}
		fmt.Fprintf(&b, "=> ERROR %s %q position=%d\n", e.Code, e.Message, e.Position)
		return b.String()
	}
	if len(plans) == 0 {
		b.WriteString("=> no statement\n")
	}
	for i, pl := range plans {
		prefix := "=> "
		if len(plans) > 1 {
			prefix = fmt.Sprintf("=> [%d] ", i+1)
		}
		b.WriteString(prefix + pl.String() + "\n")
		if len(plans) > 1 {
			b.WriteString("   sql: " + pl.SQL + "\n")
		}
		switch pl.Kind {
		case Single, InsertSplit:
			b.WriteString("   " + indent(pl.Render(goldenSchema)) + "\n")
		case FanOut:
			if pl.Agg != nil {
				b.WriteString("   partial: " + indent(pl.RenderPartial(goldenSources)) + "\n")
				b.WriteString("   final: " + indent(pl.Agg.template()) + "\n")
				b.WriteString("   one node: " + indent(pl.RenderWhole(goldenSources)) + "\n")
				if pl.Agg.CollationProbe != "" {
					b.WriteString("   collations: " + shortProbe(pl.Agg.CollationProbe) + "\n")
				}
				break
			}
			b.WriteString("   " + indent(pl.RenderFanOut(goldenSources, 10)) + "\n")
			if pl.CollationProbe != "" {
				b.WriteString("   collations: " + shortProbe(pl.CollationProbe) + "\n")
			}
		case Copy:
			if pl.Copy.Conflict != "" {
				b.WriteString("   " + indent(pl.Copy.RenderUpsert(goldenSchema, "(E'1', E'it''s')")) + "\n")
			} else if pl.Copy.From {
				b.WriteString("   " + indent(pl.RenderCopyFrom(goldenSchema)) + "\n")
			} else {
				b.WriteString("   " + indent(pl.RenderCopyTo(goldenSources, true)) + "\n")
			}
		case Refused:
			if pl.Err.Hint != "" {
				b.WriteString("   hint: " + pl.Err.Hint + "\n")
			}
		}
		if pl.Kind == InsertSplit {
			last := len(pl.Rows) - 1
			for _, rows := range [][]int{{last}, {last, 0}} {
				s, params := pl.RenderRows(goldenSchema, rows)
				fmt.Fprintf(&b, "   rows %v: %s params=%v\n", rows, indent(s), params)
			}
		}
	}
	return b.String()
}

// shortProbe writes a collation probe with its fixed pieces abbreviated:
// collation(expr) and bytes(name).
func shortProbe(s string) string {
	s = strings.ReplaceAll(s, probeHead, "collation(")
	s = strings.ReplaceAll(s, probeTail, ")")
	s = strings.ReplaceAll(s, bytesHead, "bytes(")
	return strings.ReplaceAll(s, bytesTail, ")")
}

func indent(s string) string { return strings.ReplaceAll(s, "\n", "\n   ") }

func TestGolden(t *testing.T) {
	stmts := readStatements(t)
	if len(stmts) < 60 {
		t.Fatalf("only %d statements in testdata/plans.txt", len(stmts))
	}
	p := NewPlanner(1000)
	var b strings.Builder
	for _, s := range stmts {
		b.WriteString(describe(p, s))
		b.WriteString("\n")
	}
	got := b.String()
	// Planning again hits the cache and must give the same text.
	var again strings.Builder
	for _, s := range stmts {
		again.WriteString(describe(p, s))
		again.WriteString("\n")
	}
	if again.String() != got {
		t.Fatal("cached plans differ from fresh plans")
	}
	const path = "testdata/plans.golden"
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./router -run TestGolden -update)", err)
	}
	if string(want) != got {
		wl, gl := strings.Split(string(want), "\n"), strings.Split(got, "\n")
		for i := 0; i < len(wl) || i < len(gl); i++ {
			var w, g string
			if i < len(wl) {
				w = wl[i]
			}
			if i < len(gl) {
				g = gl[i]
			}
			if w != g {
				t.Fatalf("golden mismatch at line %d:\nwant: %s\ngot:  %s\n(run with -update to accept)", i+1, w, g)
			}
		}
	}
}
