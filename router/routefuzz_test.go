package router

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// draws takes the decisions of a generated statement from fuzz input; once
// the input is used up every draw is zero.
type draws struct{ b []byte }

func (d *draws) byte() byte {
	if len(d.b) == 0 {
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *draws) intn(n int) int {
	if n <= 1 {
		return 0
	}
	return int(d.byte()) % n
}

func (d *draws) bool() bool { return d.byte()&1 == 1 }

func oneOf[T any](d *draws, opts ...T) T { return opts[d.intn(len(opts))] }

const routeSlots = 4096

// keyLit is a generated shard key literal: SQL text, and the slot of the
// value it denotes, computed from the value itself with the key type's
// hash function rather than from the text.
type keyLit struct {
	sql  string
	slot int
	// exact: the literal is one the router must route to a single shard
	// (a plain constant of the key's type); other spellings (casts,
	// parentheses) may also be run on every shard.
	exact bool
}

// textPieces make text keys: quotes, backslashes, line ends, multi-byte UTF-8.
var textPieces = []string{"a", "Z", "0", " ", "'", `\`, "\n", "\t", "é", "日本", "🙂", "%", "_", "$", "--", "/*", "id = 1"}

func genKeyLit(d *draws, kt shardmap.KeyType) keyLit {
	switch kt {
	case shardmap.KeyInt:
		var v int64
		switch d.intn(5) {
		case 0:
			v = int64(d.byte())
		case 1:
			v = -int64(d.byte())
		case 2:
			v = oneOf(d, int64(1<<63-1), -1<<63, 1<<31, -1<<31-1, 0)
		default:
			v = int64(binary.BigEndian.Uint64([]byte{d.byte(), d.byte(), d.byte(), d.byte(), d.byte(), d.byte(), d.byte(), d.byte()}))
		}
		slot := shardmap.SlotOf(shardmap.HashInt8(v), routeSlots)
		s := strconv.FormatInt(v, 10)
		switch d.intn(7) {
		case 0:
			return keyLit{"'" + s + "'", slot, true}
		case 1:
			return keyLit{"'  " + s + " '", slot, false}
		case 2:
			return keyLit{"'" + s + "'::bigint", slot, false}
		case 3:
			return keyLit{"CAST('" + s + "' AS int8)", slot, false}
		case 4:
			return keyLit{"(" + s + ")", slot, false}
		}
		if v == -1<<63 {
			// -9223372036854775808 is parsed as -(9223372036854775808), a
			// numeric; PostgreSQL still compares it with the bigint column.
			return keyLit{s, slot, false}
		}
		return keyLit{s, slot, true}
	case shardmap.KeyUUID:
		var u [16]byte
		for i := range u {
			u[i] = d.byte()
		}
		slot := shardmap.SlotOf(shardmap.HashUUID(u), routeSlots)
		h := hex.EncodeToString(u[:])
		canonical := h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
		switch d.intn(5) {
		case 0:
			return keyLit{"'" + strings.ToUpper(canonical) + "'", slot, true}
		case 1:
			return keyLit{"'{" + h + "}'", slot, true}
		case 2:
			return keyLit{"'" + h + "'", slot, true}
		case 3:
			return keyLit{"'" + canonical + "'::uuid", slot, false}
		}
		return keyLit{"'" + canonical + "'", slot, true}
	}
	var b strings.Builder
	for n := d.intn(6); n > 0; n-- {
		b.WriteString(oneOf(d, textPieces...))
	}
	s := b.String()
	slot := shardmap.SlotOf(shardmap.HashText([]byte(s)), routeSlots)
	switch d.intn(6) {
	case 0:
		return keyLit{"E'" + strings.NewReplacer(`\`, `\\`, "'", `\'`, "\n", `\n`, "\t", `\t`).Replace(s) + "'", slot, true}
	case 1:
		if !strings.Contains(s, "$q$") && !strings.HasSuffix(s, "$") {
			return keyLit{"$q$" + s + "$q$", slot, true}
		}
	case 2:
		return keyLit{quoteLiteral(s) + "::text", slot, false}
	case 3:
		return keyLit{"CAST(" + quoteLiteral(s) + " AS varchar)", slot, false}
	}
	return keyLit{quoteLiteral(s), slot, true}
}

// routeTree is a tree of testTrees with the ways to name it and its columns.
type routeTree struct {
	name  string
	refs  []string // how a statement may name it
	key   []string // how it may name the key column, unqualified
	other []string // its other columns
	extra []string // predicates on other columns
}

var routeTrees = []routeTree{
	{"catalogue", []string{"catalogue", "CATALOGUE", "public.catalogue", `"catalogue"`, `public."catalogue"`},
		[]string{"sku", "SKU", `"sku"`}, []string{"name", "price", "qty"},
		[]string{"qty > 3", "name = 'sku = ''x'''", "price IS NULL", "(qty < 5 OR qty > 10)", "NOT (qty = 1)", "name LIKE 'a%'", "qty IN (1, 2)", "name <> 'id = 1' /* sku = 'x' */"}},
	{"orders", []string{"orders", "Orders", "public.orders", `"orders"`},
		[]string{"id", "ID", `"id"`}, []string{"customer", "total"},
		[]string{"customer = 7", "total > 10.5", "customer IS NOT NULL", "(customer = 1 OR total = 2)", "customer IN (SELECT 1)", "total BETWEEN 1 AND 2"}},
	{"MixedCase", []string{`"MixedCase"`, `public."MixedCase"`},
		[]string{"k", "K", `"k"`}, []string{"v"},
		[]string{"v = 'x'", "v IS NULL", "(v = 'a' OR v = 'b')", "v ~ '^k'"}},
}

// genWhere is a WHERE clause that fixes the key (key = lit with extra
// predicates ANDed in any order).
func genWhere(d *draws, rt routeTree, col string, lit keyLit) string {
	eq := col + " = " + lit.sql
	if d.intn(4) == 0 {
		eq = lit.sql + " = " + col
	}
	if d.intn(5) == 0 {
		eq = "(" + eq + ")"
	}
	conj := []string{eq}
	for n := d.intn(3); n > 0; n-- {
		e := oneOf(d, rt.extra...)
		if d.bool() {
			conj = append(conj, e)
		} else {
			conj = append([]string{e}, conj...)
		}
	}
	return strings.Join(conj, oneOf(d, " AND ", " and ", "\nAND "))
}

// genKeyed generates a statement that fixes the shard key, with the slots
// its rows must go to: one for SELECT, UPDATE, DELETE and single-row
// INSERT, one per row for a multi-row INSERT.
func genKeyed(d *draws) (sql string, rt routeTree, lits []keyLit) {
	rt = routeTrees[d.intn(len(routeTrees))]
	kt := testTrees()[rt.name].KeyType
	ref := oneOf(d, rt.refs...)
	key := oneOf(d, rt.key...)
	col, from := key, ref
	if d.intn(3) == 0 {
		from, col = ref+" AS x", "x."+key
	} else if d.intn(3) == 0 && !strings.Contains(ref, ".") {
		col = ref + "." + key
	}
	lit := genKeyLit(d, kt)
	switch d.intn(4) {
	case 0:
		cols := oneOf(d, "*", rt.other[0], key+", "+rt.other[0], "count(*)")
		return "SELECT " + cols + " FROM " + from + " WHERE " + genWhere(d, rt, col, lit) + oneOf(d, "", " ORDER BY 1", " LIMIT 3", " FOR UPDATE"), rt, []keyLit{lit}
	case 1:
		set := rt.other[d.intn(len(rt.other))] + " = " + oneOf(d, "NULL", "DEFAULT", "'1'")
		return "UPDATE " + from + " SET " + set + " WHERE " + genWhere(d, rt, col, lit) + oneOf(d, "", " RETURNING *"), rt, []keyLit{lit}
	case 2:
		return "DELETE FROM " + from + " WHERE " + genWhere(d, rt, col, lit) + oneOf(d, "", " RETURNING 1"), rt, []keyLit{lit}
	}
	// INSERT: the key somewhere in the column list, or no list at all.
	tree := testTrees()[rt.name]
	cols := append([]string(nil), tree.Columns...)
	keyAt := 0
	if d.bool() {
		keyAt = d.intn(len(cols))
		cols[0], cols[keyAt] = cols[keyAt], cols[0]
	}
	list := ""
	if keyAt != 0 || d.bool() {
		quoted := make([]string, len(cols))
		for i, c := range cols {
			quoted[i] = c
			if c == tree.KeyColumn {
				quoted[i] = key
			}
		}
		list = " (" + strings.Join(quoted, ", ") + ")"
	}
	var rows []string
	for n := 1 + d.intn(4); n > 0; n-- {
		lit := genKeyLit(d, kt)
		if !lit.exact && d.bool() {
			lit = genKeyLit(d, kt)
		}
		vals := make([]string, len(cols))
		for i := range vals {
			vals[i] = oneOf(d, "NULL", "DEFAULT", "'x'")
			if cols[i] == "price" || cols[i] == "qty" || cols[i] == "customer" || cols[i] == "total" {
				vals[i] = oneOf(d, "NULL", "DEFAULT", "1", "2.5")
			}
		}
		vals[keyAt] = lit.sql
		rows = append(rows, "("+strings.Join(vals, ", ")+")")
		lits = append(lits, lit)
	}
	return "INSERT INTO " + ref + list + " VALUES " + strings.Join(rows, ", ") + oneOf(d, "", " RETURNING *", " ON CONFLICT DO NOTHING"), rt, lits
}

// valueSlot is the slot the proxy routes a plan's key value to: the proxy
// hashes Value.Text with shardmap.SlotForText.
func valueSlot(t *testing.T, sql string, kt shardmap.KeyType, v Value) int {
	t.Helper()
	if v.Param != 0 || v.Null {
		t.Fatalf("%s: key %+v, want the literal", sql, v)
	}
	slot, err := shardmap.SlotForText(kt, []byte(v.Text), routeSlots)
	if err != nil {
		t.Fatalf("%s: key %q does not hash: %v", sql, v.Text, err)
	}
	return slot
}

// FuzzRoute generates statements that fix the shard key (SELECT, UPDATE,
// DELETE ... WHERE key = literal with extra predicates; INSERT ... VALUES),
// with text, integer and uuid keys, varied quoting, case and literal
// spellings, and checks that the plan sends each row to the slot the key's
// value hashes to, computed from the generated value; that plain literals
// are routed to one shard; and that the rendered statement parses. It also
// checks that statements the key does not pin (key = a OR ..., key <> a,
// key IN (a, b)) are never planned for a single shard.
func FuzzRoute(f *testing.F) {
	for _, seed := range []string{"", "\x00", "\x01\x02\x03", "\x02\x00\x05\x01", "\x03\x01\x02\x03\x04", "\x01\x00\x02\x03\x04\x05\x06\x07\x08\x09",
		"\x00\x00\x00\x03\x07\x01\x00\x05", "\x02\x04\x01\x00\x01\x00\x02\x00\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13"} {
		f.Add([]byte(seed), false)
		f.Add([]byte(seed), true)
	}
	trees := testTrees()
	f.Fuzz(func(t *testing.T, in []byte, unpinned bool) {
		d := &draws{b: in}
		if unpinned {
			checkUnpinned(t, d, trees)
			return
		}
		sql, rt, lits := genKeyed(d)
		plans, err := NewPlanner(0).Plan(sql, trees, 1)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		if len(plans) != 1 {
			t.Fatalf("%s: %d plans", sql, len(plans))
		}
		p := plans[0]
		kt := trees[rt.name].KeyType
		switch p.Kind {
		case Single:
			if len(lits) != 1 {
				t.Fatalf("%s: a %d-row INSERT planned Single", sql, len(lits))
			}
			if got := valueSlot(t, sql, kt, p.Key); got != lits[0].slot {
				t.Fatalf("%s: routed by key %q to slot %d, want slot %d", sql, p.Key.Text, got, lits[0].slot)
			}
			rendered := p.Render("lattice_s0042")
			if res, err := pg.Parse(rendered); err != nil || len(res.Stmts) != 1 {
				t.Fatalf("%s renders to %q, which does not parse: %v", sql, rendered, err)
			}
		case InsertSplit:
			if len(p.Rows) != len(lits) {
				t.Fatalf("%s: %d row keys, want %d", sql, len(p.Rows), len(lits))
			}
			for i, v := range p.Rows {
				if got := valueSlot(t, sql, kt, v); got != lits[i].slot {
					t.Fatalf("%s: row %d routed by key %q to slot %d, want slot %d", sql, i, v.Text, got, lits[i].slot)
				}
			}
			for i := range p.Rows {
				s, _ := p.RenderRows("lattice_s0042", []int{i})
				if res, err := pg.Parse(s); err != nil || len(res.Stmts) != 1 {
					t.Fatalf("%s: row %d renders to %q, which does not parse: %v", sql, i, s, err)
				}
			}
		case FanOut, WriteAll:
			// Correct on every shard; but a plain literal must pin one.
			if len(lits) == 1 && lits[0].exact {
				t.Fatalf("%s: planned %v, want Single for a plain key literal", sql, p.Kind)
			}
		case Refused:
			// Not routed at all: never wrong, but it must say why.
			if p.Err == nil || len(p.Err.Code) != 5 {
				t.Fatalf("%s: refused without a SQLSTATE", sql)
			}
		default:
			t.Fatalf("%s: planned %v", sql, p.Kind)
		}
	})
}

// checkUnpinned generates a statement whose WHERE clause does not fix the
// key to one value, and fails t if it is planned for a single shard.
func checkUnpinned(t *testing.T, d *draws, trees treeMap) {
	rt := routeTrees[d.intn(len(routeTrees))]
	kt := trees[rt.name].KeyType
	key := oneOf(d, rt.key...)
	a, b := genKeyLit(d, kt), genKeyLit(d, kt)
	if a.slot == b.slot {
		b = genKeyLit(d, kt)
		if a.slot == b.slot {
			return // the same slot: either is right
		}
	}
	extra := oneOf(d, rt.extra...)
	where := oneOf(d,
		key+" = "+a.sql+" OR "+extra,
		extra+" OR "+key+" = "+a.sql,
		key+" = "+a.sql+" OR "+key+" = "+b.sql,
		"("+key+" = "+a.sql+" AND "+extra+") OR "+key+" = "+b.sql,
		"NOT ("+key+" = "+a.sql+")",
		key+" <> "+a.sql,
		key+" IN ("+a.sql+", "+b.sql+")",
		key+" = "+a.sql+" IS NOT TRUE",
		"("+key+" = "+a.sql+") IS NULL",
		"coalesce("+key+" = "+a.sql+", true)",
		"CASE WHEN "+key+" = "+a.sql+" THEN true ELSE "+extra+" END",
		"EXISTS (SELECT 1 FROM pg_class WHERE "+key+" = "+a.sql+") OR "+extra,
		rt.other[0]+" = "+rt.other[0]+" OR "+key+" = "+a.sql,
	)
	sql := oneOf(d, "SELECT * FROM ", "DELETE FROM ", "UPDATE ") + oneOf(d, rt.refs...)
	if strings.HasPrefix(sql, "UPDATE") {
		sql += " SET " + rt.other[0] + " = NULL"
	}
	sql += " WHERE " + where
	plans, err := NewPlanner(0).Plan(sql, trees, 1)
	if err != nil {
		if e, ok := err.(*sqlstate.Error); !ok || len(e.Code) != 5 {
			t.Fatalf("%s: error without SQLSTATE: %v", sql, err)
		}
		return
	}
	for _, p := range plans {
		if p.Kind == Single || p.Kind == InsertSplit {
			t.Fatalf("%s: planned %v with key %v, but the key is not fixed", sql, p.Kind, fmt.Sprint(p.Key))
		}
	}
}
