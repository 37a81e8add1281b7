package router

import (
	"fmt"
	"strings"
	"testing"

	"github.com/lattice-db/lattice/shardmap"
)

const benchPoint = "SELECT sku, name, price, qty FROM catalogue WHERE sku = $1"

// BenchmarkPlanCachedRender is the hot path of a prepared or repeated
// statement: a cache hit and the rewrite to the shard schema.
func BenchmarkPlanCachedRender(b *testing.B) {
	p := NewPlanner(10000)
	trees := testTrees()
	if _, err := p.Plan(benchPoint, trees, 1); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		plans, err := p.Plan(benchPoint, trees, 1)
		if err != nil {
			b.Fatal(err)
		}
		if s := plans[0].Render("lattice_s0005"); len(s) == 0 {
			b.Fatal("empty")
		}
	}
}

func BenchmarkPlanCachedRenderParallel(b *testing.B) {
	p := NewPlanner(10000)
	trees := testTrees()
	if _, err := p.Plan(benchPoint, trees, 1); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			plans, _ := p.Plan(benchPoint, trees, 1)
			_ = plans[0].Render("lattice_s0005")
		}
	})
}

// BenchmarkPlanCold parses and plans a point select with no cache.
func BenchmarkPlanCold(b *testing.B) {
	p := NewPlanner(0)
	trees := testTrees()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		plans, err := p.Plan(benchPoint, trees, 1)
		if err != nil || plans[0].Kind != Single {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlanColdInsert10 plans a 10-row INSERT (parse, scan, split).
func BenchmarkPlanColdInsert10(b *testing.B) {
	sql := "INSERT INTO orders (id, customer, total) VALUES "
	for i := 0; i < 10; i++ {
		if i > 0 {
			sql += ", "
		}
		sql += fmt.Sprintf("($%d, $%d, $%d)", 3*i+1, 3*i+2, 3*i+3)
	}
	p := NewPlanner(0)
	trees := testTrees()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		plans, err := p.Plan(sql, trees, 1)
		if err != nil || plans[0].Kind != InsertSplit {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlanColdInsertWide plans an INSERT of 21,845 rows, 65,535
// parameters, the most one Bind can carry: planning must stay linear in
// the statement, or one client's statement costs everyone seconds.
func BenchmarkPlanColdInsertWide(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("INSERT INTO orders (id, customer, total) VALUES ")
	for i := 0; i < 65535/3; i++ {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "($%d, $%d, $%d)", 3*i+1, 3*i+2, 3*i+3)
	}
	sql := sb.String()
	p := NewPlanner(0)
	trees := testTrees()
	for i := 0; i < b.N; i++ {
		plans, err := p.Plan(sql, trees, 1)
		if err != nil || plans[0].Kind != InsertSplit {
			b.Fatal(err)
		}
	}
}

func BenchmarkRenderRows(b *testing.B) {
	plans, _ := NewPlanner(0).Plan("INSERT INTO orders (id, customer, total) VALUES ($1, $2, $3), ($4, $5, $6), ($7, $8, $9)", testTrees(), 1)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		plans[0].RenderRows("lattice_s0005", []int{2, 0})
	}
}

// BenchmarkPlanShape plans point selects that differ only in the literal
// key (simple query protocol): each is a miss of the exact-text cache and a
// hit of the shape cache (scan, derive, no parse).
func BenchmarkPlanShape(b *testing.B) {
	p := NewPlanner(10000)
	trees := testTrees()
	sqls := make([]string, 100000)
	for i := range sqls {
		sqls[i] = fmt.Sprintf("SELECT sku, name, price, qty FROM catalogue WHERE sku = 'k%d'", i)
	}
	p.Plan(sqls[0], trees, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		plans, err := p.Plan(sqls[i%len(sqls)], trees, 1)
		if err != nil || plans[0].Kind != Single {
			b.Fatal(err)
		}
		_ = plans[0].Render("lattice_s0005")
	}
}

// BenchmarkShapeScan is the scan under every plan-cache lookup of the
// simple protocol: pg_query's Scan (cgo and a protobuf decode), which the
// router used before, against the pure-Go lexer that replaces it; both
// give the token list and the shape key.
func BenchmarkShapeScan(b *testing.B) {
	for _, c := range []struct{ name, sql string }{
		{"point", "SELECT sku, name, price, qty FROM catalogue WHERE sku = 'k12345'"},
		{"pgbench-update", "UPDATE pgbench_accounts SET abalance = abalance + -4123 WHERE aid = 81234;"},
	} {
		for _, s := range []struct {
			name string
			fn   func(string) ([]token, string, bool)
		}{{"pg_query", pgScan}, {"lexer", lex}} {
			b.Run(c.name+"/"+s.name, func(b *testing.B) {
				if _, _, ok := s.fn(c.sql); !ok {
					b.Fatal("no scan")
				}
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					s.fn(c.sql)
				}
			})
		}
	}
}

// BenchmarkResolveSingle resolves a point select's plan against a map and
// a binary Bind: hash the key, find its shard, render the statement.
func BenchmarkResolveSingle(b *testing.B) {
	plans, err := NewPlanner(0).Plan("SELECT id, customer, total FROM orders WHERE id = $1", testTrees(), 1)
	if err != nil {
		b.Fatal(err)
	}
	v := &shardmap.View{Maps: map[string]*shardmap.Map{"orders": shardmap.NewIdentityMap("t", "orders", 4096, 16, []string{"n1"})}}
	bind := &Bind{Params: [][]byte{be8(42)}, Formats: []int16{1}, OIDs: []uint32{20}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r, err := Resolve(v, plans[0], bind)
		if err != nil || len(r.Targets) != 1 {
			b.Fatal(err)
		}
	}
}

// TestPlanShapeAllocs: a statement of a known shape is planned in one
// allocation, its plan's: the scan for its shape key reuses its buffers
// (scanBuf) and the lookup makes no string of the key. An int key; every
// simple-protocol point select takes this path.
func TestPlanShapeAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops buffers at random")
	}
	p := NewPlanner(10000)
	trees := testTrees()
	if _, err := p.Plan("SELECT id, customer, total FROM orders WHERE id = 1", trees, 1); err != nil {
		t.Fatal(err)
	}
	sqls := make([]string, 100)
	for i := range sqls {
		sqls[i] = fmt.Sprintf("SELECT id, customer, total FROM orders WHERE id = %d", i+2)
	}
	i := 0
	run := func() {
		plans, err := p.Plan(sqls[i%len(sqls)], trees, 1)
		if err != nil || plans[0].Kind != Single {
			t.Fatal(plans, err)
		}
		i++
	}
	run()
	if n := testing.AllocsPerRun(1000, run); n > 1 {
		t.Errorf("%v allocations, want 1 (the plan)", n)
	}
	if hits := p.shapeHits.Load(); hits < 1000 {
		t.Errorf("%d shape hits, want every statement derived", hits)
	}
}

// BenchmarkResolveFanOut resolves a range read over 16 shards on 2 nodes:
// one statement per node, a UNION ALL branch per shard.
func BenchmarkResolveFanOut(b *testing.B) {
	plans, err := NewPlanner(0).Plan("SELECT id, total FROM orders WHERE total BETWEEN $1 AND $2 ORDER BY total", testTrees(), 1)
	if err != nil {
		b.Fatal(err)
	}
	v := &shardmap.View{Maps: map[string]*shardmap.Map{"orders": shardmap.NewIdentityMap("t", "orders", 4096, 16, []string{"n1", "n2"})}}
	bind := &Bind{Params: [][]byte{be8(1), be8(100)}, Formats: []int16{1, 1}, OIDs: []uint32{20, 20}}
	var r Routing
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := ResolveTo(&r, v, plans[0], bind); err != nil || len(r.Targets) != 2 {
			b.Fatal(err)
		}
	}
}
