package router

import (
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// CopyFormat is the data format of a COPY.
type CopyFormat int

const (
	CopyText CopyFormat = iota
	CopyCSV
	CopyBinary
)

var copyFormatNames = [...]string{"text", "csv", "binary"}

func (f CopyFormat) String() string { return copyFormatNames[f] }

// CopySpec is a COPY of a tree, FROM STDIN or TO STDOUT. The proxy reads
// (FROM) or writes (TO) the rows in the client's format; the statements it
// sends to the nodes come from RenderCopyFrom and RenderCopyTo.
type CopySpec struct {
	From bool // FROM STDIN; otherwise TO STDOUT
	// Columns are the columns of each row, in order: the column list, or
	// the tree's columns. Empty for COPY (query) TO.
	Columns []string
	// KeyIndex is the position of the shard key column in Columns (FROM).
	KeyIndex  int
	Format    CopyFormat
	Delimiter byte   // text and CSV
	Null      string // the NULL marker, raw as it appears in the data
	Quote     byte   // CSV
	Escape    byte   // CSV
	Header    bool   // text and CSV: the first line is a header
	// KeyForceNull and KeyForceNotNull say whether the key column is listed
	// in FORCE_NULL or FORCE_NOT_NULL (CSV FROM), which change when the
	// key's field reads as NULL.
	KeyForceNull, KeyForceNotNull bool
	// Select, for an INSERT ... SELECT loaded as a COPY FROM (insertpull.go),
	// is the SELECT whose rows the proxy runs on the catalog node and
	// loads, in text format, into Columns. Without a column list
	// (AllColumns) the SELECT may give fewer: FirstColumns.
	Select     string
	AllColumns bool
	// Source, when the SELECT reads trees, is its plan: Single, or a
	// FanOut whose rows are every shard's put together. The proxy reads
	// it as a client's SELECT is read, rather than on the catalog node.
	Source *Plan
	// Conflict is the INSERT's ON CONFLICT clause (with a leading space):
	// its rows then go to each shard as one INSERT ... VALUES with it
	// (RenderUpsert), rather than as COPY.
	Conflict string
	alias    string // " AS alias" of the INSERT's target, for Conflict
	// Query marks COPY (query) TO STDOUT. QueryKind is Single (Plan.Key
	// fixes the one shard; Plan.Render renders the whole statement) or
	// FanOut (RenderCopyTo glues the node's shards with UNION ALL).
	Query     bool
	QueryKind Kind

	opts  []string // options for the nodes' statements, without HEADER
	tree  string   // quoted tree name
	qcols string   // quoted column list
}

// RenderCopyFrom is the statement that loads rows of the client's format,
// without a header line, into the tree's table in schema.
func (p *Plan) RenderCopyFrom(schema string) string { return p.Copy.RenderFrom(schema) }

// RenderFrom is RenderCopyFrom of c.
func (c *CopySpec) RenderFrom(schema string) string {
	return "COPY " + quoteIdent(schema) + "." + c.tree + " (" + c.qcols + ") FROM STDIN" + c.options(false)
}

// RenderUpsert is the statement that inserts rows, a VALUES list, into
// the tree's table in schema under the INSERT's ON CONFLICT clause.
func (c *CopySpec) RenderUpsert(schema, rows string) string {
	return "INSERT INTO " + quoteIdent(schema) + "." + c.tree + c.alias + " (" + c.qcols + ") VALUES " + rows + c.Conflict
}

// FirstColumns is c over its first n columns: an INSERT without a column
// list fills the columns its SELECT gives, in order, and the rest take
// their defaults.
func (c *CopySpec) FirstColumns(n int) (*CopySpec, *sqlstate.Error) {
	cp := *c
	cp.Columns = c.Columns[:n]
	quoted := make([]string, n)
	for i, col := range cp.Columns {
		quoted[i] = quoteIdent(col)
	}
	cp.qcols = strings.Join(quoted, ", ")
	if cp.KeyIndex >= n {
		return nil, refused("Give the shard key column in the SELECT, or name the columns: INSERT INTO "+c.tree+" (col, ...).",
			"INSERT ... SELECT into tree %s gives %d of its columns, without its shard key", c.tree, n)
	}
	return &cp, nil
}

// RenderCopyTo is the statement one node runs for COPY ... TO STDOUT over
// the given shard schemas of that node: the rows of each shard glued with
// UNION ALL, in the client's format, with a header line only when header.
// For a Single query it is the whole statement for the one shard.
func (p *Plan) RenderCopyTo(schemas []btreeindex.Source, header bool) string {
	c := p.Copy
	if c.Query && c.QueryKind == Single {
		return p.Render(schemas[0].Schema)
	}
	var b strings.Builder
	b.WriteString("COPY (")
	if c.Query {
		b.WriteString(p.RenderFanOut(schemas, -1))
	} else {
		for i, s := range schemas {
			if i > 0 {
				b.WriteString(" UNION ALL ")
			}
			b.WriteString("SELECT " + c.qcols + " FROM " + quoteIdent(s.Schema) + "." + c.tree)
			if s.Filter != "" {
				b.WriteString(" WHERE " + s.Filter)
			}
		}
	}
	b.WriteString(") TO STDOUT")
	b.WriteString(c.options(header && c.Header))
	return b.String()
}

func (c *CopySpec) options(header bool) string {
	opts := append([]string{"FORMAT " + c.Format.String()}, c.opts...)
	if header {
		opts = append(opts, "HEADER")
	}
	return " (" + strings.Join(opts, ", ") + ")"
}

func (c *CopySpec) String() string {
	dir := "to"
	if c.From {
		dir = "from"
	}
	s := fmt.Sprintf("%s format=%s", dir, c.Format)
	if c.From {
		s += fmt.Sprintf(" key=%d", c.KeyIndex)
	}
	if c.Query {
		s += " query=" + c.QueryKind.String()
	}
	if c.Select != "" {
		s += " select=" + c.Select
	}
	if c.Source != nil {
		s += " source=(" + c.Source.String() + ")"
	}
	if c.Conflict != "" {
		s += " conflict=" + strings.TrimSpace(c.Conflict)
	}
	if len(c.opts) > 0 {
		s += " opts=[" + strings.Join(c.opts, ", ") + "]"
	}
	if c.Header {
		s += " header"
	}
	return s
}

// escLiteral quotes s as an E-string (E'...'), which reads the same whatever
// standard_conforming_strings is.
func escLiteral(s string) string {
	return "E'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// copyRoute plans COPY of a tree: FROM STDIN split by shard, TO STDOUT
// from every node. Everything else is refused.
func (p *planner) copyRoute(s *pg.CopyStmt) route {
	name := "tree"
	if s.Relation != nil {
		name = qn(s.Relation.Relname)
	}
	if s.Filename != "" || s.IsProgram {
		where := "a server file"
		if s.IsProgram {
			where = "a server program"
		}
		return refusedRoute(refused("Use COPY ... FROM STDIN or TO STDOUT (psql's \\copy reads and writes client files that way).",
			"COPY of %s with %s is not supported through the Lattice proxy", name, where))
	}
	if s.WhereClause != nil {
		return refusedRoute(refused("Filter the rows before loading them, or load them into an ordinary table and INSERT the ones you want.",
			"COPY FROM with WHERE into tree %s is not supported", name))
	}
	c := &CopySpec{From: s.IsFrom}
	forceCols, err := c.parseOptions(s.Options)
	if err != nil {
		return refusedRoute(err)
	}
	if s.Query != nil {
		return p.copyQuery(c, s)
	}
	tree, _ := p.lookup(s.Relation)
	var names []string
	for _, n := range s.Attlist {
		names = append(names, n.GetString_().GetSval())
	}
	if err := c.setColumns(tree, names, "COPY"); err != nil {
		return refusedRoute(err)
	}
	for i, o := range c.opts {
		// FORCE_NULL / FORCE_NOT_NULL name columns: record what they do to the key.
		for _, f := range []struct {
			name string
			flag *bool
		}{{"FORCE_NULL", &c.KeyForceNull}, {"FORCE_NOT_NULL", &c.KeyForceNotNull}} {
			if !strings.HasPrefix(o, f.name+" (") {
				continue
			}
			for _, col := range forceCols[i] {
				if !contains(c.Columns, col) {
					return refusedRoute(&sqlstate.Error{Code: sqlstate.InvalidColumnReference, Message: fmt.Sprintf("%s column %s not referenced by COPY", f.name, qn(col))})
				}
				if col == tree.KeyColumn {
					*f.flag = true
				}
			}
		}
	}
	return route{kind: Copy, tree: tree, rv: s.Relation, cp: c}
}

// setColumns sets the columns of a COPY (or of an INSERT loaded as one,
// verb) of tree: names, or every column of the tree when there are none.
func (c *CopySpec) setColumns(tree *shardmap.Tree, names []string, verb string) *sqlstate.Error {
	c.tree = quoteIdent(tree.Name)
	for _, col := range names {
		if len(tree.Columns) > 0 && !contains(tree.Columns, col) {
			return &sqlstate.Error{Code: sqlstate.UndefinedColumn, Message: fmt.Sprintf("column %s of relation %s does not exist", qn(col), qn(tree.Name))}
		}
		if contains(c.Columns, col) {
			return &sqlstate.Error{Code: sqlstate.DuplicateColumn, Message: fmt.Sprintf("column %s specified more than once", qn(col))}
		}
		c.Columns = append(c.Columns, col)
	}
	if len(c.Columns) == 0 {
		if len(tree.Columns) == 0 {
			return refused("Name the columns: "+verb+" "+qn(tree.Name)+" (col, ...).",
				"the columns of tree %s are not known to the proxy", qn(tree.Name))
		}
		c.Columns = append([]string(nil), tree.Columns...)
	}
	quoted := make([]string, len(c.Columns))
	c.KeyIndex = -1
	for i, col := range c.Columns {
		quoted[i] = quoteIdent(col)
		if col == tree.KeyColumn {
			c.KeyIndex = i
		}
	}
	c.qcols = strings.Join(quoted, ", ")
	if c.From && c.KeyIndex < 0 {
		return refused("Include "+tree.KeyColumn+" in the column list: every row needs its shard key.",
			"%s into tree %s without its shard key column %s is not supported", verb, qn(tree.Name), qn(tree.KeyColumn))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// copyQuery plans COPY (query) TO STDOUT. A query on one shard runs there
// whole; plain rows of every shard are each node's COPY of its shards,
// concatenated. A query that needs rows of several shards combined
// (aggregates, DISTINCT, windows, set operations, ORDER BY, LIMIT,
// OFFSET) runs as the same SELECT would, in two steps, and its final step
// on the catalog node is the COPY, in the client's options
// (AggPlan.CopyTo): PostgreSQL formats the output.
func (p *planner) copyQuery(c *CopySpec, s *pg.CopyStmt) route {
	c.Query = true
	r := p.route(s.Query)
	switch r.kind {
	case Refused:
		return r
	case Single:
		c.QueryKind = Single
		r.cp = c
		r.kind = Copy
		return r
	case FanOut:
		if r.fan.agg == nil && (len(r.fan.sort) > 0 || r.fan.limit != nil || r.fan.offset != nil) {
			// The proxy merges a SELECT's sorted rows itself; here
			// PostgreSQL sorts the gathered rows in the final step.
			if r = p.rowsFanOut(r, r.sel, copyWords, nil); r.kind != FanOut {
				return r
			}
		}
		if r.fan.agg != nil {
			r.fan.agg.CopyTo = c.options(c.Header)
			return r
		}
		c.QueryKind = FanOut
		r.cp = c
		r.kind = Copy
		return r
	}
	return refusedRoute(refused("Fix the shard key in WHERE so that the statement runs on one shard.",
		"COPY (%s) over several shards of tree %s is not supported", stmtName(s.Query), qn(r.tree.Name)))
}

// parenSpan finds the text between the first "(" of sql[start:end] and its
// matching ")", without surrounding white space.
func (p *planner) parenSpan(start, end int) (int, int, bool) {
	depth, open := 0, -1
	for _, t := range p.tokens() {
		if int(t.start) < start || int(t.end) > end {
			continue
		}
		switch t.kind {
		case pg.Token_ASCII_40:
			if depth == 0 && open < 0 {
				open = int(t.end)
			}
			depth++
		case pg.Token_ASCII_41:
			depth--
			if depth == 0 && open >= 0 {
				qs, qe := p.trim(open, int(t.start))
				return qs, qe, true
			}
		}
	}
	return 0, 0, false
}

// parseOptions reads COPY options as PostgreSQL 15's ProcessCopyOptions
// does, far enough to read rows; the nodes check the rest. forceCols maps
// the index in c.opts of a FORCE_NULL or FORCE_NOT_NULL option to its
// column names.
func (c *CopySpec) parseOptions(opts []*pg.Node) (forceCols map[int][]string, _ *sqlstate.Error) {
	forceCols = map[int][]string{}
	seen := map[string]bool{}
	var delim, null, quote, escape *string
	for _, n := range opts {
		d := n.GetDefElem()
		if d == nil {
			continue
		}
		if seen[d.Defname] {
			return nil, &sqlstate.Error{Code: sqlstate.SyntaxError, Message: "conflicting or redundant options"}
		}
		seen[d.Defname] = true
		str, isStr := defString(d.Arg)
		switch d.Defname {
		case "format":
			switch str {
			case "text":
				c.Format = CopyText
			case "csv":
				c.Format = CopyCSV
			case "binary":
				c.Format = CopyBinary
			default:
				return nil, &sqlstate.Error{Code: sqlstate.InvalidParameterValue, Message: fmt.Sprintf("COPY format \"%s\" not recognized", str)}
			}
		case "delimiter", "null", "quote", "escape":
			if !isStr {
				return nil, &sqlstate.Error{Code: sqlstate.SyntaxError, Message: fmt.Sprintf("%s requires a parameter", d.Defname)}
			}
			v := str
			switch d.Defname {
			case "delimiter":
				delim = &v
			case "null":
				null = &v
			case "quote":
				quote = &v
			case "escape":
				escape = &v
			}
		case "header":
			if isStr && strings.EqualFold(str, "match") {
				return nil, refused("Leave out HEADER MATCH, or use HEADER to skip the header line.",
					"COPY FROM with HEADER MATCH into a tree is not supported yet")
			}
			b, ok := defBool(d.Arg)
			if !ok {
				return nil, &sqlstate.Error{Code: sqlstate.InvalidParameterValue, Message: "header requires a Boolean value or \"match\""}
			}
			c.Header = b
		case "freeze":
			if b, ok := defBool(d.Arg); ok && !b {
				continue
			}
			return nil, refused("Leave out FREEZE: the shard tables are not created in the COPY's transaction.",
				"COPY FREEZE into a tree is not supported")
		case "force_quote", "force_not_null", "force_null":
			if d.Arg != nil && d.Arg.GetAStar() != nil {
				if d.Defname != "force_quote" {
					return nil, &sqlstate.Error{Code: sqlstate.SyntaxError, Message: fmt.Sprintf("argument to option \"%s\" must be a list of column names", d.Defname)}
				}
				c.opts = append(c.opts, "FORCE_QUOTE *")
				continue
			}
			l := d.Arg.GetList()
			if l == nil {
				return nil, &sqlstate.Error{Code: sqlstate.SyntaxError, Message: fmt.Sprintf("argument to option \"%s\" must be a list of column names", d.Defname)}
			}
			var cols, quoted []string
			for _, it := range l.Items {
				col := it.GetString_().GetSval()
				cols = append(cols, col)
				quoted = append(quoted, quoteIdent(col))
			}
			forceCols[len(c.opts)] = cols
			c.opts = append(c.opts, strings.ToUpper(d.Defname)+" ("+strings.Join(quoted, ", ")+")")
		default:
			return nil, refused("Leave out the option "+strings.ToUpper(d.Defname)+"; COPY of a tree accepts FORMAT, DELIMITER, NULL, HEADER, QUOTE, ESCAPE, FORCE_QUOTE, FORCE_NOT_NULL and FORCE_NULL.",
				"COPY option %s is not supported for trees", strings.ToUpper(d.Defname))
		}
	}
	if c.Format == CopyBinary {
		for _, o := range []struct {
			set  bool
			name string
		}{{delim != nil, "DELIMITER"}, {null != nil, "NULL"}, {seen["header"], "HEADER"}} {
			if o.set {
				return nil, &sqlstate.Error{Code: sqlstate.FeatureNotSupported, Message: "cannot specify " + o.name + " in BINARY mode"}
			}
		}
	}
	if c.Format != CopyCSV {
		for _, o := range []struct {
			set  bool
			name string
		}{{quote != nil, "quote"}, {escape != nil, "escape"}, {seen["force_quote"], "force quote"}, {seen["force_not_null"], "force not null"}, {seen["force_null"], "force null"}} {
			if o.set {
				return nil, &sqlstate.Error{Code: sqlstate.FeatureNotSupported, Message: "COPY " + o.name + " available only in CSV mode"}
			}
		}
	}
	if seen["force_quote"] && c.From {
		return nil, &sqlstate.Error{Code: sqlstate.FeatureNotSupported, Message: "COPY force quote only available using COPY TO"}
	}
	if (seen["force_not_null"] || seen["force_null"]) && !c.From {
		return nil, &sqlstate.Error{Code: sqlstate.FeatureNotSupported, Message: "COPY force not null only available using COPY FROM"}
	}
	// Defaults, as PostgreSQL sets them.
	c.Delimiter, c.Null = '\t', `\N`
	if c.Format == CopyCSV {
		c.Delimiter, c.Null, c.Quote = ',', "", '"'
	}
	one := func(v *string, what string, dst *byte) *sqlstate.Error {
		if v == nil {
			return nil
		}
		if len(*v) != 1 {
			return &sqlstate.Error{Code: sqlstate.FeatureNotSupported, Message: "COPY " + what + " must be a single one-byte character"}
		}
		*dst = (*v)[0]
		return nil
	}
	if err := one(delim, "delimiter", &c.Delimiter); err != nil {
		return nil, err
	}
	if err := one(quote, "quote", &c.Quote); err != nil {
		return nil, err
	}
	c.Escape = c.Quote
	if err := one(escape, "escape", &c.Escape); err != nil {
		return nil, err
	}
	if null != nil {
		c.Null = *null
	}
	if c.Format != CopyBinary {
		// The nodes get every value explicitly, ahead of FORCE_*, so that
		// they read the rows exactly as the proxy did.
		extra := []string{"DELIMITER " + escLiteral(string(c.Delimiter)), "NULL " + escLiteral(c.Null)}
		if c.Format == CopyCSV {
			extra = append(extra, "QUOTE "+escLiteral(string(c.Quote)), "ESCAPE "+escLiteral(string(c.Escape)))
		}
		shifted := map[int][]string{}
		for i, cols := range forceCols {
			shifted[i+len(extra)] = cols
		}
		forceCols = shifted
		c.opts = append(extra, c.opts...)
	}
	return forceCols, nil
}

func defString(n *pg.Node) (string, bool) {
	if n == nil {
		return "", false
	}
	if s := n.GetString_(); s != nil {
		return s.Sval, true
	}
	return "", false
}

// defBool is defGetBoolean: no argument, 1/0, true/false/on/off.
func defBool(n *pg.Node) (bool, bool) {
	if n == nil {
		return true, true
	}
	if i := n.GetInteger(); i != nil {
		switch i.Ival {
		case 0:
			return false, true
		case 1:
			return true, true
		}
		return false, false
	}
	if b := n.GetBoolean(); b != nil {
		return b.Boolval, true
	}
	s, _ := defString(n)
	switch strings.ToLower(s) {
	case "true", "on":
		return true, true
	case "false", "off":
		return false, true
	}
	return false, false
}

// applyCopy renders a Copy route: a Single query is rendered whole for its
// shard; a fan-out query's branch is cut from between the parentheses.
func (p *planner) applyCopy(pl *Plan, r route, start, end int) {
	pl.Tree, pl.Copy = r.tree, r.cp
	if !r.cp.Query {
		return
	}
	fail := func(e *sqlstate.Error) {
		pl.Kind, pl.Tree, pl.Copy, pl.Key, pl.render, pl.fan, pl.Err = Refused, nil, nil, Value{}, nil, nil, e
	}
	if r.cp.QueryKind == Single {
		refs, err := p.refSpans(r)
		var rd *renderer
		if err == nil {
			rd, err = p.renderer(r.tree, refs, start, end)
		}
		if err != nil {
			fail(err)
			return
		}
		pl.Key, pl.render = r.key, rd
		return
	}
	qs, qe, ok := p.parenSpan(start, end)
	if !ok {
		fail(fanError(r.tree.Name))
		return
	}
	fr, err := p.fanRenderer(r, qs, qe)
	if err != nil {
		fail(err)
		return
	}
	pl.fan, pl.Calls = fr, r.fan.calls
}
