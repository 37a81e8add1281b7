package router

import (
	"sort"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// span is a byte range [start, end) of the SQL string.
type span struct{ start, end int }

// renderer holds a statement cut at each reference to the tree:
// texts[0] REF texts[1] REF ... texts[n]. Render puts schema.tree at each REF.
type renderer struct {
	texts []string
	qname string // the tree name, quoted by quote_ident rules
	// rel is the index of the reference that is the tree's FROM item (the
	// others are public.tree.col references), -1 when unknown; aliased
	// says whether an alias follows it. Set for fan-out branches, which
	// may read a shard through a filter (renderSource).
	rel     int
	aliased bool
	// table is the offset in texts[0] of the TABLE keyword of a branch
	// written TABLE tree, -1 otherwise: a filtered read needs SELECT.
	table int
	// multi is set for a statement over several tree references (of one
	// tree, or of one colocation group): each reference's tree, and
	// whether it is a FROM item (with its alias) rather than a
	// public.tree.col qualifier. Every FROM item of a fan-out branch may
	// read a shard through a filter.
	multi []refHole
	base  *shardmap.Tree // with multi: the tree whose key the sources' filters name
}

// refHole is one reference of a multi-reference statement.
type refHole struct {
	tree    *shardmap.Tree
	qname   string
	rel     bool
	aliased bool
}

func (r *renderer) qualified(schema string) string {
	return quoteIdent(schema) + "." + r.qname
}

func (r *renderer) render(schema string) string {
	if r.multi != nil {
		var b strings.Builder
		for i, t := range r.texts {
			b.WriteString(t)
			if i < len(r.multi) {
				b.WriteString(quoteIdent(schema) + "." + r.multi[i].qname)
			}
		}
		return b.String()
	}
	if len(r.texts) == 2 {
		return r.texts[0] + quoteIdent(schema) + "." + r.qname + r.texts[1]
	}
	q := r.qualified(schema)
	n := len(q) * (len(r.texts) - 1)
	for _, t := range r.texts {
		n += len(t)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(r.texts[0])
	for _, t := range r.texts[1:] {
		b.WriteString(q)
		b.WriteString(t)
	}
	return b.String()
}

// refSpans returns the byte spans of every reference to the tree in a
// routed statement: the RangeVar's (possibly schema-qualified) name, and
// the public.tree part of public.tree.column references. Each span is
// checked token by token against the parse tree.
func (p *planner) refSpans(r route) ([]span, *sqlstate.Error) {
	want := []string{r.rv.Relname}
	if r.rv.Schemaname != "" {
		want = []string{r.rv.Schemaname, r.rv.Relname}
	}
	s, ok := p.nameSpan(int(r.rv.Location), want)
	if !ok {
		return nil, internalError(r.tree.Name)
	}
	spans := []span{s}
	for _, c := range r.cols {
		s, ok := p.nameSpan(int(c.Location), []string{"public", r.rv.Relname})
		if !ok {
			return nil, internalError(r.tree.Name)
		}
		spans = append(spans, s)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	for i := 1; i < len(spans); i++ {
		if spans[i].start < spans[i-1].end {
			return nil, internalError(r.tree.Name)
		}
	}
	return spans, nil
}

func internalError(tree string) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
		Message: "the proxy could not locate the references to tree " + qn(tree) + " in this statement",
		Hint:    "Write the statement more plainly (one row per INSERT, no comments inside names) and report it as a bug."}
}

// nameSpan checks that the tokens at loc spell the dotted name want
// (identifiers compared after PostgreSQL's folding and truncation) and
// returns their span.
func (p *planner) nameSpan(loc int, want []string) (span, bool) {
	toks := p.tokens()
	i := p.tokenAt(loc)
	if i < 0 {
		return span{}, false
	}
	s := span{start: loc}
	for k, w := range want {
		if k > 0 {
			i = nextToken(toks, i)
			if i < 0 || toks[i].kind != pg.Token_ASCII_46 {
				return span{}, false
			}
			i = nextToken(toks, i)
			if i < 0 {
				return span{}, false
			}
		}
		t := toks[i]
		id, ok := identText(p.sql[t.start:t.end])
		if !ok || id != w {
			return span{}, false
		}
		s.end = int(t.end)
	}
	return s, true
}

func nextToken(toks []token, i int) int {
	for i++; i < len(toks); i++ {
		if !isComment(toks[i]) {
			return i
		}
	}
	return -1
}

// closingParen returns the index of the parenthesis that closes the one at
// toks[i], or -1.
func closingParen(toks []token, i int) int {
	for depth := 0; i >= 0; i = nextToken(toks, i) {
		switch toks[i].kind {
		case pg.Token_ASCII_40:
			depth++
		case pg.Token_ASCII_41:
			depth--
		}
		if depth == 0 {
			return i
		}
	}
	return -1
}

// identText returns the name an identifier token stands for: the contents
// of a quoted identifier, or an unquoted one folded to lower case (ASCII
// only, as PostgreSQL does for multi-byte encodings), truncated to 63 bytes.
func identText(tok string) (string, bool) {
	if tok == "" {
		return "", false
	}
	var s string
	if tok[0] == '"' {
		if len(tok) < 2 || tok[len(tok)-1] != '"' {
			return "", false
		}
		s = strings.ReplaceAll(tok[1:len(tok)-1], `""`, `"`)
	} else {
		if tok[0] == 'U' || tok[0] == 'u' {
			if len(tok) > 1 && tok[1] == '&' {
				return "", false // U&"..." identifiers: not worth decoding
			}
		}
		b := []byte(tok)
		for i, c := range b {
			if c >= 'A' && c <= 'Z' {
				b[i] = c + 'a' - 'A'
			}
		}
		s = string(b)
	}
	if len(s) > 63 {
		n := 63
		for n > 0 && s[n]&0xC0 == 0x80 {
			n--
		}
		s = s[:n]
	}
	return s, true
}

// renderer cuts sql[start:end] at the references to the tree (spans).
func (p *planner) renderer(tree *shardmap.Tree, spans []span, start, end int) (*renderer, *sqlstate.Error) {
	rd := new(renderer)
	if err := p.fillRenderer(rd, tree, spans, start, end); err != nil {
		return nil, err
	}
	return rd, nil
}

// fillRenderer is renderer into rd, whose texts may come with room.
func (p *planner) fillRenderer(rd *renderer, tree *shardmap.Tree, spans []span, start, end int) *sqlstate.Error {
	rd.qname, rd.rel, rd.table = quoteIdent(tree.Name), -1, -1
	at, after := start, ""
	for _, s := range spans {
		if s.start < start || s.end > end {
			return internalError(tree.Name)
		}
		b, a := p.pad(s)
		rd.texts = append(rd.texts, after+p.sql[at:s.start]+b)
		at, after = s.end, a
	}
	rd.texts = append(rd.texts, after+p.sql[at:end])
	return nil
}

// pad returns the white space to put around the replacement of span s so
// that it stays a token of its own: "INTO\"MixedCase\"VALUES" is valid SQL,
// but the name that replaces a quoted one may be unquoted.
func (p *planner) pad(s span) (before, after string) {
	if s.start > 0 && isIdentChar(p.sql[s.start-1]) {
		before = " "
	}
	if s.end < len(p.sql) && isIdentChar(p.sql[s.end]) {
		after = " "
	}
	return before, after
}

func isIdentChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '$' || c >= 0x80
}

// piece is literal text followed by a hole: the qualified tree name
// (param < 0), a parameter (param > 0), or nothing (param == 0).
type piece struct {
	text  string
	param int
}

// splitter holds a multi-row INSERT as head, rows and tail, each cut at
// the tree references and at the parameters.
type splitter struct {
	head, tail []piece
	rows       [][]piece
	maxParam   int
}

func splitError(tree string) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
		Message: "the proxy could not split the VALUES rows of this INSERT into tree " + qn(tree),
		Hint:    "Send one row per INSERT, or a plain INSERT INTO t (...) VALUES (...), (...)."}
}

// valuesRows finds the VALUES rows of an INSERT by its tokens: the VALUES
// keyword before the first row's key, then parenthesised rows separated by
// commas. Each row found must contain its own key constant, so a row can
// never be cut wrongly without the plan being refused.
func (p *planner) valuesRows(r route) ([]span, *sqlstate.Error) {
	bad := splitError(r.tree.Name)
	toks := p.tokens()
	first := int(r.keyLocs[0])
	v := -1
	for i, t := range toks {
		if int(t.start) >= first {
			break
		}
		if t.kind == pg.Token_VALUES && int(t.start) > int(r.rv.Location) {
			v = i
		}
	}
	if v < 0 {
		return nil, bad
	}
	var rows []span
	i := nextToken(toks, v)
	for i >= 0 && toks[i].kind == pg.Token_ASCII_40 {
		s := span{start: int(toks[i].start)}
		if i = closingParen(toks, i); i < 0 {
			return nil, bad
		}
		s.end = int(toks[i].end)
		rows = append(rows, s)
		i = nextToken(toks, i)
		if i < 0 || toks[i].kind != pg.Token_ASCII_44 {
			break
		}
		i = nextToken(toks, i)
	}
	if len(rows) != len(r.keyLocs) {
		return nil, bad
	}
	for k, s := range rows {
		if a := int(r.keyLocs[k]); a <= s.start || a >= s.end {
			return nil, bad
		}
	}
	return rows, nil
}

// splitter cuts the INSERT sql[start:end] into head, rows and tail, each
// cut again at the tree references (refs) and at the parameters.
func (p *planner) splitter(tree *shardmap.Tree, rows, refs []span, start, end int) (*splitter, *sqlstate.Error) {
	bad := splitError(tree.Name)
	if len(rows) == 0 || rows[0].start < start || rows[len(rows)-1].end > end {
		return nil, bad
	}
	toks := p.tokens()
	type hole struct {
		span
		param int
	}
	var holes []hole
	for _, s := range refs {
		holes = append(holes, hole{s, -1})
	}
	sp := &splitter{}
	for _, t := range toks {
		if int(t.start) >= start && int(t.end) <= end && t.kind == pg.Token_PARAM {
			n, err := strconv.Atoi(p.sql[t.start+1 : t.end])
			if err != nil || n <= 0 {
				return nil, bad
			}
			if n > sp.maxParam {
				sp.maxParam = n
			}
			holes = append(holes, hole{span{int(t.start), int(t.end)}, n})
		}
	}
	sort.Slice(holes, func(i, j int) bool { return holes[i].start < holes[j].start })
	cut := func(a, b int) []piece {
		var out []piece
		at, lead := a, ""
		// Holes do not overlap, so sorted by start they are sorted by end:
		// a search finds the first that reaches past a, which keeps a
		// statement of many rows linear.
		first := sort.Search(len(holes), func(i int) bool { return holes[i].end > a })
		for _, h := range holes[first:] {
			if h.start >= b {
				break
			}
			if h.start < a || h.end > b {
				return nil // a hole across a boundary: impossible, refuse
			}
			var before, next string
			if h.param < 0 {
				before, next = p.pad(h.span)
			}
			out = append(out, piece{text: lead + p.sql[at:h.start] + before, param: h.param})
			at, lead = h.end, next
		}
		return append(out, piece{text: lead + p.sql[at:b]})
	}
	sp.head = cut(start, rows[0].start)
	sp.tail = cut(rows[len(rows)-1].end, end)
	if sp.head == nil || sp.tail == nil {
		return nil, bad
	}
	for _, s := range rows {
		c := cut(s.start, s.end)
		if c == nil {
			return nil, bad
		}
		sp.rows = append(sp.rows, c)
	}
	return sp, nil
}

func (sp *splitter) renderRows(qualified string, rows []int) (string, []int) {
	if len(rows) == 0 {
		panic("router: RenderRows with no rows")
	}
	newNum := make([]int, sp.maxParam+1)
	var params []int
	var b strings.Builder
	emit := func(ps []piece) {
		for _, pc := range ps {
			b.WriteString(pc.text)
			switch {
			case pc.param < 0:
				b.WriteString(qualified)
			case pc.param > 0:
				if newNum[pc.param] == 0 {
					params = append(params, pc.param)
					newNum[pc.param] = len(params)
				}
				b.WriteByte('$')
				b.WriteString(strconv.Itoa(newNum[pc.param]))
			}
		}
	}
	emit(sp.head)
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		emit(sp.rows[r])
	}
	emit(sp.tail)
	return b.String(), params
}

// quoteIdent quotes an identifier by PostgreSQL's quote_ident rules: left
// alone when it is lower-case letters, digits and underscores not starting
// with a digit and not a keyword other than an unreserved one.
func quoteIdent(s string) string {
	if !safeIdent(s) {
		return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
	}
	// No PostgreSQL keyword starts with "lattice_": shard schemas are the
	// common case and need no keyword lookup.
	if strings.HasPrefix(s, "lattice_") {
		return s
	}
	if isKeyword(s) {
		return `"` + s + `"`
	}
	return s
}

func safeIdent(s string) bool {
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] == '_') {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// isKeyword reports whether s is a keyword that quote_ident would quote
// (any keyword but an unreserved one), by PostgreSQL's own keyword table.
func isKeyword(s string) bool {
	k, ok := keywords()[s]
	return ok && k.kw != pg.KeywordKind_UNRESERVED_KEYWORD
}
