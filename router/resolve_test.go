package router

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Resolution golden cases live in testdata/resolve/TOPIC.txt, one block per
// case (blocks separated by blank lines):
//
//	## case name
//	map: plain | onenode | mixed | frozen | copying
//	bind: PARAM PARAM ...
//	SQL (one or more lines)
//
// A PARAM is null, or FORMAT:TYPE=VALUE with FORMAT t (text) or b
// (binary), TYPE a type name (int2, int4, int8, text, varchar, uuid,
// float8, int8[], text[] ...) declared as the parameter's type, or
// TYPE? to encode as TYPE but leave the type undeclared (oid 0). The
// golden text of each case is in TOPIC.golden. Run one topic with
// -run 'TestResolveGolden/TOPIC', one case with
// -run 'TestResolveGolden/TOPIC/case_name'; -update rewrites the cases run.

func be8(v int64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, uint64(v))
	return b
}

func TestKeySlot(t *testing.T) {
	want42 := shardmap.SlotOf(shardmap.HashInt8(42), 4096)
	cases := []struct {
		name     string
		key      Value
		bind     *Bind
		wantSlot int
		wantCode string
	}{
		{name: "literal", key: Value{Text: "42"}, wantSlot: want42},
		{name: "null literal", key: Value{Null: true}, wantSlot: 0},
		{name: "text param", key: Value{Param: 1}, bind: &Bind{Params: [][]byte{[]byte("42")}}, wantSlot: want42},
		{name: "binary int8 param", key: Value{Param: 1},
			bind: &Bind{Formats: []int16{1}, Params: [][]byte{be8(42)}, OIDs: []uint32{pgtype.Int8OID}}, wantSlot: want42},
		{name: "binary float8 param refused", key: Value{Param: 1},
			bind: &Bind{Formats: []int16{1}, Params: [][]byte{be8(42)}, OIDs: []uint32{pgtype.Float8OID}}, wantCode: "0A000"},
		{name: "null param", key: Value{Param: 1}, bind: &Bind{Params: [][]byte{nil}}, wantSlot: 0},
		{name: "missing param", key: Value{Param: 2}, bind: &Bind{Params: [][]byte{[]byte("1")}}, wantCode: "08P01"},
		{name: "no bind", key: Value{Param: 1}, wantCode: "08P01"},
		{name: "bad literal", key: Value{Text: "4x2"}, wantCode: "22P02"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			slot, err := KeySlot(shardmap.KeyInt, 4096, tc.key, tc.bind)
			if tc.wantCode != "" {
				if err == nil || err.Code != tc.wantCode {
					t.Fatalf("got %v, want SQLSTATE %s", err, tc.wantCode)
				}
				return
			}
			if err != nil || slot != tc.wantSlot {
				t.Fatalf("got slot %d, %v; want %d", slot, err, tc.wantSlot)
			}
		})
	}
}

// resolveView builds the view of a golden case: every test tree with 4
// shards of 4096 slots.
func resolveView(t *testing.T, kind string) *shardmap.View {
	v := &shardmap.View{Tenant: "t", TreesVersion: 1, Trees: map[string]*shardmap.Tree{}, Maps: map[string]*shardmap.Map{}}
	for name, tree := range testTrees() {
		nodes := []string{"n1", "n2"}
		if kind == "onenode" {
			nodes = []string{"n1"}
		}
		m := shardmap.NewIdentityMap("t", name, 4096, 4, nodes)
		switch kind {
		case "plain", "onenode", "copying":
		case "mixed":
			// A split of shard 1 ([1024, 2047]) after the flip: shard 4 on
			// n3 owns the upper half, and shard 1 still holds its rows.
			for s := 1536; s < 2048; s++ {
				m.Slots[s] = 4
			}
			m.Shards[4] = shardmap.Shard{Index: 4, Node: "n3", State: shardmap.ShardActive}
			sh := m.Shards[1]
			sh.Mixed = true
			m.Shards[1] = sh
			m.HighWater = 5
		case "frozen":
			// The slots of key 42 (orders), 'abc' (catalogue) are moving.
			for _, s := range []int{
				shardmap.SlotOf(shardmap.HashInt8(42), 4096),
				shardmap.SlotOf(shardmap.HashText([]byte("abc")), 4096),
			} {
				m.Frozen = append(m.Frozen, [2]int{s, s})
			}
		default:
			t.Fatalf("unknown map %q", kind)
		}
		v.Trees[name], v.Maps[name] = tree, m
	}
	// The reference tables of testTrees, on every node of the maps; under
	// "copying", node n2 has no copy of regions yet.
	plans := []string{"n1", "n2"}
	if kind == "mixed" {
		plans = append(plans, "n3")
	}
	regions := plans
	if kind == "copying" {
		regions = []string{"n1"}
	}
	v.References = map[string]*shardmap.Reference{
		"plans":   {Tenant: "t", Name: "plans", Nodes: plans},
		"regions": {Tenant: "t", Name: "regions", Nodes: regions},
	}
	return v
}

var typeOIDs = map[string]uint32{
	"int2": pgtype.Int2OID, "int4": pgtype.Int4OID, "int8": pgtype.Int8OID, "text": pgtype.TextOID,
	"varchar": pgtype.VarcharOID, "uuid": pgtype.UUIDOID, "float8": pgtype.Float8OID, "bool": pgtype.BoolOID,
	"int2[]": pgtype.Int2ArrayOID, "int4[]": pgtype.Int4ArrayOID, "int8[]": pgtype.Int8ArrayOID,
	"text[]": pgtype.TextArrayOID, "uuid[]": pgtype.UUIDArrayOID, "float8[]": pgtype.Float8ArrayOID,
}

// parseBind reads the bind: line of a golden case.
func parseBind(t *testing.T, line string) *Bind {
	b := &Bind{}
	for _, f := range strings.Fields(line) {
		if f == "null" {
			b.Params, b.Formats, b.OIDs = append(b.Params, nil), append(b.Formats, 0), append(b.OIDs, 0)
			continue
		}
		spec, val, ok := strings.Cut(f, "=")
		format, typ, ok2 := strings.Cut(spec, ":")
		if !ok || !ok2 || format != "t" && format != "b" {
			t.Fatalf("bad bind parameter %q", f)
		}
		declared := !strings.HasSuffix(typ, "?")
		typ = strings.TrimSuffix(typ, "?")
		oid, known := typeOIDs[typ]
		if !known {
			t.Fatalf("unknown type %q", typ)
		}
		raw := []byte(val)
		code := int16(0)
		if format == "b" {
			code = 1
			var v any
			if err := typeMap.Scan(oid, 0, []byte(val), &v); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			enc, err := typeMap.Encode(oid, 1, v, nil)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			raw = enc
		}
		if !declared {
			oid = 0
		}
		b.Params, b.Formats, b.OIDs = append(b.Params, raw), append(b.Formats, code), append(b.OIDs, oid)
	}
	return b
}

type resolveCase struct {
	name, mapKind, sql string
	bind               *Bind
}

func readResolveCases(t *testing.T, path string) []resolveCase {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []resolveCase
	for _, block := range strings.Split(strings.TrimSpace(string(data)), "\n\n") {
		c := resolveCase{mapKind: "plain"}
		var sql []string
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, "## "):
				c.name = strings.TrimPrefix(line, "## ")
			case strings.HasPrefix(line, "# "):
			case strings.HasPrefix(line, "map: "):
				c.mapKind = strings.TrimPrefix(line, "map: ")
			case strings.HasPrefix(line, "bind:"):
				c.bind = parseBind(t, strings.TrimPrefix(line, "bind:"))
			default:
				sql = append(sql, line)
			}
		}
		if c.name == "" || len(sql) == 0 {
			t.Fatalf("%s: a case needs a ## name and SQL:\n%s", path, block)
		}
		c.sql = strings.Join(sql, "\n")
		out = append(out, c)
	}
	return out
}

// describeResolution is the golden text of one case.
func describeResolution(t *testing.T, c resolveCase) string {
	var b strings.Builder
	plans, err := NewPlanner(0).Plan(c.sql, testTrees(), 1)
	if err != nil || len(plans) != 1 {
		t.Fatalf("%s: planning gave %d plans, %v", c.name, len(plans), err)
	}
	p := plans[0]
	b.WriteString("plan: " + p.String() + "\n")
	if p.Agg != nil {
		b.WriteString("final: " + p.Agg.template() + "\n")
	}
	if p.Kind == Refused && p.Err.Hint != "" {
		b.WriteString("hint: " + p.Err.Hint + "\n")
	}
	r, rerr := Resolve(resolveView(t, c.mapKind), p, c.bind)
	if rerr != nil {
		var e *sqlstate.Error
		if !errors.As(rerr, &e) {
			t.Fatalf("%s: not an *sqlstate.Error: %v", c.name, rerr)
		}
		fmt.Fprintf(&b, "error: %s %s\n", e.Code, e.Message)
		if e.Hint != "" {
			b.WriteString("hint: " + e.Hint + "\n")
		}
		return b.String()
	}
	var flags []string
	if r.Whole {
		flags = append(flags, "whole")
	}
	if r.Frozen {
		flags = append(flags, "frozen")
	}
	if p.Kind == FanOut && p.Agg == nil {
		flags = append(flags, fmt.Sprintf("limit=%d offset=%d per-node=%d", r.Limit, r.Offset, r.PerNode))
	}
	if len(flags) > 0 {
		b.WriteString("routing: " + strings.Join(flags, " ") + "\n")
	}
	for _, line := range r.Explain {
		b.WriteString("| " + line + "\n")
	}
	for _, tg := range r.Targets {
		b.WriteString("target " + tg.Node)
		if tg.Shard >= 0 {
			b.WriteString(" shard " + strconv.Itoa(tg.Shard))
		}
		if tg.Rows != nil {
			fmt.Fprintf(&b, " rows %v params %v", tg.Rows, tg.Params)
		}
		for _, s := range tg.Sources {
			if s.Filter != "" {
				fmt.Fprintf(&b, "\n  filter %s: %s", s.Schema, s.Filter)
			}
		}
		b.WriteString("\n  " + strings.ReplaceAll(tg.SQL, "\n", "\n  ") + "\n")
	}
	if p.Kind == Copy && p.Copy.Source != nil {
		// The SELECT the proxy reads for the load, as it would for a client.
		src := describeResolution(t, resolveCase{name: c.name, sql: p.Copy.Source.SQL, mapKind: c.mapKind, bind: c.bind})
		b.WriteString("source " + strings.ReplaceAll(strings.TrimSuffix(src, "\n"), "\n", "\nsource ") + "\n")
	}
	return b.String()
}

// goldenSections reads a .golden file: "## name" headers, each followed by
// that case's text.
func goldenSections(data string) map[string]string {
	out := map[string]string{}
	var name string
	var cur strings.Builder
	flush := func() {
		if name != "" {
			out[name] = cur.String()
		}
		cur.Reset()
	}
	for _, line := range strings.SplitAfter(data, "\n") {
		if strings.HasPrefix(line, "## ") {
			flush()
			name = strings.TrimSpace(strings.TrimPrefix(line, "## "))
			continue
		}
		if name != "" && line != "\n" {
			cur.WriteString(line)
		}
	}
	flush()
	return out
}

func TestResolveGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/resolve/*.txt")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no testdata/resolve/*.txt: %v", err)
	}
	for _, in := range inputs {
		topic := strings.TrimSuffix(filepath.Base(in), ".txt")
		t.Run(topic, func(t *testing.T) {
			cases := readResolveCases(t, in)
			goldenPath := strings.TrimSuffix(in, ".txt") + ".golden"
			data, err := os.ReadFile(goldenPath)
			if err != nil && !*update {
				t.Fatalf("%v (run go test ./router -run TestResolveGolden -update)", err)
			}
			want := goldenSections(string(data))
			got := map[string]string{}
			for _, c := range cases {
				name := strings.ReplaceAll(c.name, " ", "_")
				if _, dup := got[name]; dup {
					t.Fatalf("two cases named %q", c.name)
				}
				got[name] = want[name] // kept as is unless the case runs
				t.Run(name, func(t *testing.T) {
					text := describeResolution(t, c)
					if *update {
						got[name] = text
						return
					}
					if want[name] != text {
						t.Fatalf("golden mismatch for %s:\nwant:\n%s\ngot:\n%s(run with -update to accept)", name, want[name], text)
					}
				})
			}
			if !*update {
				return
			}
			var b strings.Builder
			for _, c := range cases {
				name := strings.ReplaceAll(c.name, " ", "_")
				b.WriteString("## " + name + "\n" + got[name] + "\n")
			}
			if err := os.WriteFile(goldenPath, []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Every input case has a golden section, and every section a case, so
// that a case cannot be dropped from one file silently.
func TestResolveGoldenComplete(t *testing.T) {
	inputs, _ := filepath.Glob("testdata/resolve/*.txt")
	for _, in := range inputs {
		data, err := os.ReadFile(strings.TrimSuffix(in, ".txt") + ".golden")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range readResolveCases(t, in) {
			names = append(names, strings.ReplaceAll(c.name, " ", "_"))
		}
		var golden []string
		for n := range goldenSections(string(data)) {
			golden = append(golden, n)
		}
		slices.Sort(names)
		slices.Sort(golden)
		if !slices.Equal(names, golden) {
			t.Errorf("%s: cases %v, golden sections %v", in, names, golden)
		}
	}
}

func TestSchemaName(t *testing.T) {
	for _, idx := range []int{0, 7, 1023, 1024, 4095, 123456} {
		if got, want := schemaName(idx), shardmap.SchemaName(idx); got != want {
			t.Errorf("schemaName(%d) = %q, want %q", idx, got, want)
		}
	}
}

// TestResolveToAllocs: a point statement resolved into a reused Routing
// allocates only its rendered text, and gives the target Resolve gives,
// which allocates the Routing and its one target together.
func TestResolveToAllocs(t *testing.T) {
	plans, err := NewPlanner(0).Plan("SELECT id, customer, total FROM orders WHERE id = $1", testTrees(), 1)
	if err != nil {
		t.Fatal(err)
	}
	v := &shardmap.View{Maps: map[string]*shardmap.Map{"orders": shardmap.NewIdentityMap("t", "orders", 4096, 16, []string{"n1"})}}
	bind := &Bind{Params: [][]byte{be8(42)}, Formats: []int16{1}, OIDs: []uint32{20}}
	var r Routing
	run := func() {
		if err := ResolveTo(&r, v, plans[0], bind); err != nil || len(r.Targets) != 1 {
			t.Fatal(err)
		}
	}
	run()
	if n := testing.AllocsPerRun(100, run); n != 1 {
		t.Errorf("%v allocations, want 1 (the rendered statement)", n)
	}
	want, err := Resolve(v, plans[0], bind)
	if err != nil || !reflect.DeepEqual(r, *want) {
		t.Errorf("ResolveTo gave %+v, Resolve %+v (%v)", r, want, err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = Resolve(v, plans[0], bind) }); n != 2 {
		t.Errorf("Resolve: %v allocations, want 2 (the routing with its target, the rendered statement)", n)
	}
}

// TestResolveFanOutReuse: a fan-out over every shard resolves on one map
// as it did the first time, and on a new map (a shard moved) as a fresh
// plan does; one whose WHERE picks shards by key resolves per Bind.
func TestResolveFanOutReuse(t *testing.T) {
	plan := func(sql string) *Plan {
		t.Helper()
		plans, err := NewPlanner(0).Plan(sql, testTrees(), 1)
		if err != nil || plans[0].Kind != FanOut {
			t.Fatalf("plan %q: %v %v", sql, plans, err)
		}
		return plans[0]
	}
	m := shardmap.NewIdentityMap("t", "orders", 4096, 16, []string{"n1", "n2"})
	moved := m.Clone()
	sh := moved.Shards[3]
	sh.Node = "n3"
	moved.Shards[3] = sh
	bind := func(vals ...int64) *Bind {
		b := &Bind{}
		for _, v := range vals {
			b.Params, b.Formats, b.OIDs = append(b.Params, be8(v)), append(b.Formats, 1), append(b.OIDs, 20)
		}
		return b
	}
	for _, c := range []struct {
		sql   string
		binds []*Bind
	}{
		{"SELECT id, total FROM orders WHERE total BETWEEN $1 AND $2 ORDER BY total", []*Bind{bind(1, 2), bind(5, 9)}},
		{"SELECT id FROM orders ORDER BY id LIMIT $1", []*Bind{bind(5), bind(7), bind(5)}},
		{"SELECT count(*) FROM orders WHERE total > $1", []*Bind{bind(1), bind(2)}},
		{"SELECT total FROM orders WHERE id IN ($1, $2)", []*Bind{bind(1, 2), bind(3, 900), bind(1, 2)}},
	} {
		t.Run(c.sql, func(t *testing.T) {
			shared := plan(c.sql)
			for _, mp := range []*shardmap.Map{m, moved, m} {
				v := &shardmap.View{Maps: map[string]*shardmap.Map{"orders": mp}}
				for _, b := range c.binds {
					var got Routing
					if err := ResolveTo(&got, v, shared, b); err != nil {
						t.Fatal(err)
					}
					want, err := Resolve(v, plan(c.sql), b)
					if err != nil {
						t.Fatal(err)
					}
					if fmt.Sprint(got) != fmt.Sprint(*want) {
						t.Fatalf("reused:\n%v\nfresh:\n%v", got, *want)
					}
				}
			}
		})
	}
}
