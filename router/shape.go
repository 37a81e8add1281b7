package router

import (
	"slices"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lattice-db/lattice/shardmap"
)

// Statements that differ only in literal constants share one plan
// template ("shape"), so that the simple query protocol, where every value
// is a literal, skips the parse of a statement it has seen with other
// values. Why a derived plan is the plan a full parse would give:
//
//  1. The shape key is the statement's whole token sequence, as
//     PostgreSQL's own scanner (pg_query's Scan) cuts it; lexer.go cuts it
//     the same way in Go and leaves what it is unsure of to Scan. The key
//     holds the kind of every token, and the exact text of every token
//     except the constants (string, integer, numeric and bit-string
//     literals; keywords are known by their kind). The grammar decides on token kinds, and identifiers,
//     operators, parameters and comments are compared by text, so two
//     statements of one shape have the same parse tree except for the
//     values of constants. Lexical errors in the new text make Scan fail,
//     and the statement is then parsed as usual.
//  2. A constant may differ from the template only where the template's
//     parse tree holds an A_Const for it (the grammar copies such values
//     into the tree without looking at them, apart from folding a unary
//     minus). Constants the grammar reads itself (float(53), the string of
//     UESCAPE, column numbers of ALTER INDEX ...) must keep their text.
//  3. The routing decisions read nothing of a constant but the shard key:
//     table and column names, operators, the statement's structure and the
//     kind of each constant. Plans whose outcome depends on other values
//     are never templated: lattice functions (arguments), SET and RESET
//     (values), transactions, refusals (messages quote values), and strings
//     of several statements.
//  4. The shard key is read from the new token only when its text maps
//     to its value without decoding: '...' with ” for a quote, or decimal
//     digits; then it goes through the same check (keyValue) as a parsed
//     key. Any other form (E”, $$, U&”, continued strings, 0x, 1_000),
//     and any key the check refuses, takes the full parse.
//  5. Offsets come from the new statement's own tokens, by index.
//  6. A template is kept only if deriving the plan of the statement it was
//     made from gives exactly the plan the full parse gave.
//
// What differs: a value the server rejects only after parsing (an
// interval '1 dya', a date out of range) is reported by the backend, as it
// would be without the cache; nothing of this kind is checked by the raw
// parser for the constants that may vary.
type shapeTemplate struct {
	kind     Kind
	anywhere bool     // Catalog: Plan.Anywhere
	refTabs  []string // Plan.References: names, which no constant changes
	notify   bool     // Catalog: Plan.Notify
	hides    Hides    // Plan.Hides: from function names, which are in the shape
	tree     *shardmap.Tree
	anyVer   bool
	semi     int            // index of the trailing ';' token, or -1
	fixed    []fixedTok     // constant tokens that must keep their text
	keys     []keySource    // Single: the key; InsertSplit: each row's key
	refs     [][2]int       // token index range (first, last) of each reference to the tree
	rows     [][2]int       // InsertSplit: token index of each row's ( and )
	prep     *preparedShape // Single: how its statements run prepared (prepared.go), or nil
}

type fixedTok struct {
	i    int
	text string
}

// keySource says where a derived plan finds a key.
type keySource struct {
	val  *Value       // a parameter or NULL: the same in every statement of the shape
	tok  int          // index of the constant token
	neg  bool         // a unary minus before it was folded into the constant
	cast *pg.TypeName // the cast over it, or nil
}

func isConstToken(t pg.Token) bool {
	switch t {
	case pg.Token_SCONST, pg.Token_ICONST, pg.Token_FCONST, pg.Token_BCONST, pg.Token_XCONST:
		return true
	}
	return false
}

// shapeKey is the token sequence of sql without the text of constants and
// keywords: for each token its kind, then, unless it is a constant or a
// keyword, its text and a NUL (which a query string cannot contain).
func shapeKey(sql string, toks []token) string {
	var b strings.Builder
	b.Grow(len(sql) + 2*len(toks))
	for _, t := range toks {
		k := int(t.kind)
		b.WriteByte(byte(k >> 8))
		b.WriteByte(byte(k))
		if !isConstToken(t.kind) && t.kw == pg.KeywordKind_NO_KEYWORD {
			b.WriteString(sql[t.start:t.end])
			b.WriteByte(0)
		}
	}
	return b.String()
}

// template makes the shape template of a single-statement string planned
// as pl (nil when the plan cannot be derived from tokens).
func (p *planner) template(stmt *pg.Node, pl *Plan) *shapeTemplate {
	if pl.Kind != Catalog && pl.Kind != Single && pl.Kind != InsertSplit || pl.Pin|pl.Unpin != 0 || len(pl.KeyAlso) > 0 || pl.Cursor != nil || callsSetConfig(stmt) ||
		pl.src != nil && pl.src.keyByConstants {
		// Session state can depend on a constant (set_config's is_local
		// 'on' or 'off', its setting's name, which guardSetConfig
		// checks), a cursor statement carries what its constants say
		// (FETCH's count), and an UPDATE may set the key to the constant
		// its WHERE compares it with (keyassign.go): such plans are never
		// derived from a shape.
		return nil
	}
	toks := p.tokens()
	if toks == nil {
		return nil
	}
	t := &shapeTemplate{kind: pl.Kind, anywhere: pl.Anywhere, notify: pl.Notify, refTabs: pl.References, hides: pl.Hides, tree: pl.Tree, semi: -1}
	last := -1
	for i, tk := range toks {
		if !isComment(tk) {
			last = i
		}
		if tk.kind == pg.Token_ASCII_59 {
			if t.semi >= 0 {
				return nil
			}
			t.semi = i
		}
	}
	if t.semi >= 0 && t.semi != last {
		return nil
	}

	// Constants held as A_Const may vary; the others keep their text.
	free := make(map[int]bool)
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if c, ok := m.Interface().(*pg.A_Const); ok {
			if i := p.tokenAt(int(c.Location)); i >= 0 {
				if isConstToken(toks[i].kind) {
					free[i] = true
				} else if toks[i].kind == pg.Token_ASCII_45 {
					if j := nextToken(toks, i); j >= 0 && isConstToken(toks[j].kind) {
						free[j] = true
					}
				}
			}
			return
		}
		eachChild(m, visit)
	}
	visit(stmt.ProtoReflect())
	for i, tk := range toks {
		if isConstToken(tk.kind) && !free[i] {
			t.fixed = append(t.fixed, fixedTok{i, p.sql[tk.start:tk.end]})
		}
	}

	if pl.Kind != Catalog {
		src := pl.src
		if src == nil {
			return nil
		}
		for k, loc := range src.keyLocs {
			v := pl.Key
			if pl.Kind == InsertSplit {
				v = pl.Rows[k]
			}
			if v.Param > 0 || v.Null {
				vv := v
				t.keys = append(t.keys, keySource{val: &vv})
				continue
			}
			i := p.tokenAt(int(loc))
			if i < 0 {
				return nil
			}
			ks := keySource{cast: src.keyCasts[k]}
			if toks[i].kind == pg.Token_ASCII_45 {
				ks.neg = true
				if i = nextToken(toks, i); i < 0 {
					return nil
				}
			}
			if !free[i] {
				return nil
			}
			ks.tok = i
			t.keys = append(t.keys, ks)
		}
		for _, s := range src.refs {
			r, ok := p.tokenRange(s)
			if !ok {
				return nil
			}
			t.refs = append(t.refs, r)
		}
		for _, s := range src.rows {
			r, ok := p.tokenRange(s)
			if !ok {
				return nil
			}
			t.rows = append(t.rows, r)
		}
	}

	got, ok := t.derive(p.sql, toks)
	if !ok || !samePlan(got[0], pl) {
		return nil
	}
	start, end := 0, len(p.sql)
	if t.semi >= 0 {
		end = int(toks[t.semi].start)
	}
	start, end = p.trim(start, end)
	t.prep = p.preparedShape(stmt, t, free, start, end)
	return t
}

// tokenRange returns the indexes of the first and last token of a span.
func (p *planner) tokenRange(s span) ([2]int, bool) {
	toks := p.tokens()
	a := p.tokenAt(s.start)
	if a < 0 {
		return [2]int{}, false
	}
	for b := a; b < len(toks); b++ {
		if int(toks[b].end) == s.end {
			return [2]int{a, b}, true
		}
		if int(toks[b].end) > s.end {
			break
		}
	}
	return [2]int{}, false
}

// derive builds the plan of sql, a statement of this shape scanned as toks.
// It reports false when the statement must be parsed instead.
func (t *shapeTemplate) derive(sql string, toks []token) ([]*Plan, bool) {
	for _, f := range t.fixed {
		if f.i >= len(toks) || sql[toks[f.i].start:toks[f.i].end] != f.text {
			return nil, false
		}
	}
	// The plan of a point statement, and what it is made of, in one
	// allocation: every simple-protocol point query takes this path.
	one := &struct {
		pl    Plan
		list  [1]*Plan
		rd    renderer
		texts [3]string
		vals  [1]Value
		prep  Prepared
		pvals [4]string
		poids [4]uint32
	}{}
	p := &planner{sql: sql, toks: toks, scanned: true}
	start, end := 0, len(sql)
	if t.semi >= 0 {
		end = int(toks[t.semi].start)
	}
	start, end = p.trim(start, end)
	pl := &one.pl
	*pl = Plan{Kind: t.kind, SQL: sql[start:end], Anywhere: t.anywhere, Notify: t.notify, References: t.refTabs, Hides: t.hides}
	one.list[0] = pl
	if t.kind == Catalog {
		if t.prep != nil {
			pl.Prepared = t.prep.bind(&one.prep, sql, toks, one.pvals[:0], one.poids[:0])
		}
		return one.list[:], true
	}
	var vals []Value
	if len(t.keys) <= len(one.vals) {
		vals = one.vals[:len(t.keys)]
	} else {
		vals = make([]Value, len(t.keys))
	}
	for i, k := range t.keys {
		if k.val != nil {
			vals[i] = *k.val
			continue
		}
		c, ok := tokenConstant(sql, toks[k.tok], k.neg)
		if !ok {
			return nil, false
		}
		c.cast = k.cast
		v, msg := keyValue(t.tree, c)
		if msg != "" {
			return nil, false // refused: the full parse words the refusal
		}
		vals[i] = v
	}
	var spanBuf [2]span
	spans := spanBuf[:0]
	for _, r := range t.refs {
		spans = append(spans, span{int(toks[r[0]].start), int(toks[r[1]].end)})
	}
	rd := &one.rd
	rd.texts = one.texts[:0]
	if err := p.fillRenderer(rd, t.tree, spans, start, end); err != nil {
		return nil, false
	}
	pl.Tree, pl.render = t.tree, rd
	if t.kind == Single {
		pl.Key = vals[0]
		if t.prep != nil {
			pl.Prepared = t.prep.bind(&one.prep, sql, toks, one.pvals[:0], one.poids[:0])
		}
		return one.list[:], true
	}
	rows := make([]span, len(t.rows))
	for i, r := range t.rows {
		rows[i] = span{int(toks[r[0]].start), int(toks[r[1]].end)}
	}
	sp, err := p.splitter(t.tree, rows, spans, start, end)
	if err != nil {
		return nil, false
	}
	pl.Rows, pl.split = vals, sp
	return one.list[:], true
}

// tokenConstant reads a constant token whose text is its value: a string
// in single quotes with ” for a quote, or decimal digits. neg applies a
// folded unary minus.
func tokenConstant(sql string, tk token, neg bool) (constant, bool) {
	text := sql[tk.start:tk.end]
	switch tk.kind {
	case pg.Token_SCONST:
		if neg || len(text) < 2 || text[0] != '\'' || text[len(text)-1] != '\'' {
			return constant{}, false
		}
		in := text[1 : len(text)-1]
		if strings.IndexByte(in, '\'') < 0 {
			return constant{kind: litString, text: in}, true // no copy
		}
		var b strings.Builder
		for i := 0; i < len(in); i++ {
			if in[i] == '\'' {
				if i+1 >= len(in) || in[i+1] != '\'' {
					return constant{}, false // a continued string
				}
				i++
			}
			b.WriteByte(in[i])
		}
		return constant{kind: litString, text: b.String()}, true
	case pg.Token_ICONST:
		if !allDigits(text) {
			return constant{}, false
		}
		v, err := strconv.ParseInt(text, 10, 64)
		if err != nil || v > 1<<31 {
			return constant{}, false
		}
		if neg {
			v = -v
		}
		return constant{kind: litInt, text: strconv.FormatInt(v, 10)}, true
	case pg.Token_FCONST:
		if !allDigits(text) {
			return constant{}, false
		}
		if neg {
			text = "-" + text
		}
		return constant{kind: litNumeric, text: text}, true
	}
	return constant{}, false
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// samePlan reports whether two plans route and render identically.
func samePlan(a, b *Plan) bool {
	if a.Kind != b.Kind || a.SQL != b.SQL || a.Tree != b.Tree || a.Key != b.Key || a.Tag != b.Tag ||
		a.Anywhere != b.Anywhere || a.Notify != b.Notify || !slices.Equal(a.References, b.References) ||
		a.Func != nil || b.Func != nil || a.Err != nil || b.Err != nil || a.String() != b.String() ||
		len(a.Rows) != len(b.Rows) {
		return false
	}
	for i := range a.Rows {
		if a.Rows[i] != b.Rows[i] {
			return false
		}
	}
	for _, schema := range []string{"lattice_s0005", "Odd Schema"} {
		if a.Render(schema) != b.Render(schema) {
			return false
		}
		if a.Kind != InsertSplit {
			continue
		}
		all := make([]int, len(a.Rows))
		rev := make([]int, len(a.Rows))
		for i := range all {
			all[i], rev[i] = i, len(all)-1-i
		}
		sets := [][]int{all, rev}
		for i := range a.Rows {
			sets = append(sets, []int{i})
		}
		for _, rows := range sets {
			sa, pa := a.RenderRows(schema, rows)
			sb, pb := b.RenderRows(schema, rows)
			if sa != sb || len(pa) != len(pb) {
				return false
			}
			for i := range pa {
				if pa[i] != pb[i] {
					return false
				}
			}
		}
	}
	return true
}
