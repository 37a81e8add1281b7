package router

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
)

// EXPLAIN of a statement over several shards (a FanOut, a WriteAll or an
// InsertSplit), or in text of one on one shard (a Single),
// shows Lattice's plan first, as Citus's EXPLAIN does: the nodes and the
// shards each reads, the statement each node runs, and the merge. Then
// comes PostgreSQL's own EXPLAIN of one part, the first node's, run there
// with the client's options. A Single's is the shard and node and the
// statement it runs, and EXPLAIN ANALYZE runs it whole, as PostgreSQL
// would. The explained statement is planned as if it
// had been sent alone, so the SQL shown is what the proxy would send.
//
// EXPLAIN ANALYZE runs what it explains. Of a SELECT it runs the first
// node's part only, and says so. Of a write over several shards it is
// refused: running the part of one shard would change that shard and no
// other, and rolling it back would still have fired its triggers and
// taken its sequence values.

// ExplainPlan is an EXPLAIN of a statement over several shards.
type ExplainPlan struct {
	// Query is the explained statement's plan, as if it were sent alone:
	// FanOut, WriteAll, InsertSplit or Single.
	Query *Plan
	// Prefix is the EXPLAIN and its options as the client wrote them, put
	// before the part the first node explains.
	Prefix  string
	Analyze bool     // ANALYZE: the first node's part runs
	Verb    string   // SELECT, INSERT, UPDATE or DELETE
	Trees   []string // the trees the statement names, in order of first reference
}

// explain plans EXPLAIN of a FanOut, WriteAll or InsertSplit route r.
func (p *planner) explain(pl *Plan, s *pg.ExplainStmt, r route, start, end int) {
	analyze, format := explainOptions(s.Options)
	verb := "SELECT"
	switch s.Query.Node.(type) {
	case *pg.Node_UpdateStmt:
		verb = "UPDATE"
	case *pg.Node_DeleteStmt:
		verb = "DELETE"
	case *pg.Node_InsertStmt:
		verb = "INSERT"
	}
	switch {
	case format != "text":
		pl.Kind, pl.Err = Refused, refused("Use FORMAT TEXT (the default).",
			"EXPLAIN (FORMAT %s) of a statement over several shards of tree %s is not supported", strings.ToUpper(format), qn(r.tree.Name))
		return
	case analyze && r.kind == WriteAll:
		pl.Kind, pl.Err = Refused, refused("EXPLAIN it without ANALYZE to see the plan, or with "+r.tree.KeyColumn+" = <value> in WHERE to analyze it on one shard.",
			"EXPLAIN ANALYZE of %s over every shard of tree %s is not supported: it would change some shards and not the others", verb, qn(r.tree.Name))
		return
	case analyze && r.kind == InsertSplit:
		pl.Kind, pl.Err = Refused, refused("EXPLAIN it without ANALYZE to see the plan, or EXPLAIN ANALYZE a single-row INSERT.",
			"EXPLAIN ANALYZE of a multi-row INSERT into tree %s is not supported: its rows may go to several shards, and it would change some and not the others", qn(r.tree.Name))
		return
	}
	qstart := p.explainedStart(start, end)
	if qstart < 0 {
		pl.Kind, pl.Err = Refused, internalError(r.tree.Name)
		return
	}
	q := &Plan{SQL: p.sql[qstart:end]}
	p.apply(q, r, qstart, end)
	q.src = nil
	if q.Kind == Refused {
		pl.Kind, pl.Err = Refused, q.Err
		return
	}
	var trees []string
	if r.multi == nil {
		trees = []string{r.tree.Name}
	}
	for _, ref := range r.multi {
		if !slices.Contains(trees, ref.tree.Name) {
			trees = append(trees, ref.tree.Name)
		}
	}
	pl.Kind, pl.Tree = Explain, q.Tree
	pl.Explain = &ExplainPlan{Query: q, Prefix: p.sql[start:qstart], Analyze: analyze, Verb: verb, Trees: trees}
}

// explainOptions reads ANALYZE and FORMAT from EXPLAIN's options. A
// boolean that is not plainly false counts as true: the node rejects a
// bad one, and a write is refused rather than run.
func explainOptions(opts []*pg.Node) (analyze bool, format string) {
	format = "text"
	for _, o := range opts {
		d := o.GetDefElem()
		if d == nil {
			continue
		}
		switch d.Defname {
		case "analyze":
			analyze = true
			if d.Arg != nil {
				switch v := strings.ToLower(d.Arg.GetString_().GetSval()); {
				case v == "false" || v == "off":
					analyze = false
				case d.Arg.GetInteger() != nil:
					analyze = d.Arg.GetInteger().Ival != 0
				}
			}
		case "format":
			format = strings.ToLower(d.Arg.GetString_().GetSval())
		}
	}
	return analyze, format
}

// explainedStart is the offset of the statement EXPLAIN explains: after
// the EXPLAIN keyword and its options, (...) or ANALYZE and VERBOSE.
// -1 when the tokens are not that.
func (p *planner) explainedStart(start, end int) int {
	toks := p.tokens()
	i := p.tokenAt(start)
	if i < 0 || toks[i].kind != pg.Token_EXPLAIN {
		return -1
	}
	i = nextToken(toks, i)
	if i >= 0 && toks[i].kind == pg.Token_ASCII_40 {
		if i = closingParen(toks, i); i >= 0 {
			i = nextToken(toks, i)
		}
	} else {
		for i >= 0 && (toks[i].kind == pg.Token_ANALYZE || toks[i].kind == pg.Token_ANALYSE || toks[i].kind == pg.Token_VERBOSE) {
			i = nextToken(toks, i)
		}
	}
	if i < 0 || int(toks[i].start) >= end {
		return -1
	}
	return int(toks[i].start)
}

// resolveExplain resolves the explained statement and returns its first
// target, explained with the client's options, and Lattice's plan.
func resolveExplain(v *shardmap.View, p *Plan, b *Bind) (*Routing, error) {
	e := p.Explain
	r, err := Resolve(v, e.Query, b)
	if err != nil {
		return nil, err
	}
	first := r.Targets[0]
	first.SQL = e.Prefix + first.SQL
	// Only what runs waits for frozen slots to settle.
	out := &Routing{Targets: []Target{first}, Whole: r.Whole, Limit: -1, PerNode: -1, Frozen: e.Analyze && r.Frozen}
	out.Explain = explainLines(v.Maps[p.Tree.Name], p, r)
	return out, nil
}

// explainLines is Lattice's plan of an explained statement resolved as r.
func explainLines(m *shardmap.Map, p *Plan, r *Routing) []string {
	e, q := p.Explain, p.Explain.Query
	var out []string
	add := func(depth int, text string) {
		for _, line := range strings.Split(text, "\n") {
			out = append(out, strings.Repeat("  ", depth)+line)
		}
	}
	nodes := r.Nodes()
	shards := 0
	for _, t := range r.Targets {
		shards += max(len(t.Shards), 1)
	}
	trees := "tree " + strings.Join(e.Trees, ", ")
	if len(e.Trees) > 1 {
		trees = "colocated trees " + strings.Join(e.Trees, ", ")
	}
	over := fmt.Sprintf("%d %s of %s on %d %s", shards, plural(shards, "shard"), trees, len(nodes), plural(len(nodes), "node"))
	switch {
	case q.Kind == Single:
		t := r.Targets[0]
		add(0, fmt.Sprintf("Lattice Single: %s on shard %d of %s on node %s", e.Verb, t.Shard, trees, t.Node))
		add(1, "SQL: "+t.SQL)
		what := fmt.Sprintf("PostgreSQL plan on node %s, shard %d", t.Node, t.Shard)
		if e.Analyze {
			what += " (ANALYZE ran the statement)"
		}
		add(0, what+":")
		return out
	case q.Kind == WriteAll || q.Kind == InsertSplit:
		how := "in one transaction"
		if len(nodes) > 1 {
			how = "in one transaction committed on every node by two-phase commit"
		}
		if q.Kind == WriteAll {
			add(0, "Lattice WriteAll: "+e.Verb+" on every shard, "+over+", "+how)
		} else {
			add(0, fmt.Sprintf("Lattice InsertSplit: INSERT of %d %s split by shard, %s, %s", len(q.Rows), plural(len(q.Rows), "row"), over, how))
		}
		for _, node := range nodes {
			add(1, "Node "+node+":")
			for _, t := range r.Targets {
				if t.Node != node {
					continue
				}
				add(2, "Shard "+strconv.Itoa(t.Shard)+":")
				if len(t.Rows) > 0 {
					add(3, "VALUES rows: "+rowList(t.Rows))
				}
				if len(t.Params) > 0 {
					add(3, "Parameters: "+paramList(t.Params))
				}
				if q.Kind == WriteAll && m.Shards[t.Shard].Mixed {
					add(3, "Mixed shard: writes only its own slots: "+btreeindex.SlotPredicate(q.Tree, "", m.SlotRanges(t.Shard)))
				}
				add(3, "SQL: "+t.SQL)
			}
		}
		add(1, "Result: the shards' command tags added up")
	case q.Agg != nil && r.Whole:
		add(0, "Lattice FanOut: aggregate over "+over+": it runs whole there, with no final step")
		explainNodes(add, r)
	case q.Agg != nil:
		switch {
		case q.Agg.Window:
			add(0, "Lattice FanOut: rows gathered for window functions over "+over)
		case q.Agg.Gathered:
			add(0, "Lattice FanOut: rows gathered for aggregates over "+over)
		case q.Agg.SetOp:
			add(0, "Lattice FanOut: branch rows gathered for a set operation over "+over)
		default:
			add(0, "Lattice FanOut: two-step aggregate over "+over)
		}
		explainNodes(add, r)
		add(1, "Final step on the catalog node, over the nodes' partial rows:")
		add(2, "SQL: "+q.Agg.template())
	default:
		add(0, "Lattice FanOut: SELECT over "+over)
		explainNodes(add, r)
		add(1, "Merge: "+mergeText(q, r))
	}
	part := "PostgreSQL plan of the part on node " + nodes[0]
	if q.Kind != FanOut {
		part += ", shard " + strconv.Itoa(r.Targets[0].Shard)
	}
	if e.Analyze {
		part += " (ANALYZE ran this part only)"
	}
	add(0, part+":")
	return out
}

// explainNodes writes each node of a fan-out with the shards it reads and
// the statement it runs.
func explainNodes(add func(int, string), r *Routing) {
	for _, t := range r.Targets {
		names := make([]string, len(t.Shards))
		for i, s := range t.Shards {
			names[i] = strconv.Itoa(s)
		}
		add(1, "Node "+t.Node+": "+plural(len(t.Shards), "shard")+" "+strings.Join(names, ", "))
		for i, src := range t.Sources {
			if src.Filter != "" {
				add(2, "Mixed shard "+strconv.Itoa(t.Shards[i])+": reads only its own slots: "+src.Filter)
			}
		}
		add(2, "SQL: "+t.SQL)
	}
}

// PostgresSortNote ends the merge line of a fan-out whose keys may be
// text in a collation the merge cannot reproduce; the proxy drops it when
// the collation probe finds that every key orders as bytes.
const PostgresSortNote = " (text keys in a collation that does not order as bytes: sorted by PostgreSQL on the catalog node)"

// mergeText says how the proxy merges a plain fan-out's rows.
func mergeText(q *Plan, r *Routing) string {
	var b strings.Builder
	if len(q.Sort) == 0 {
		b.WriteString("the nodes' rows concatenated")
	} else {
		b.WriteString("k-way merge on ORDER BY ")
		for i, k := range q.Sort {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("column " + strconv.Itoa(k.Column+1) + " " + k.Order())
		}
		if q.CollationProbe != "" {
			b.WriteString(PostgresSortNote)
		}
	}
	if q.Hidden > 0 {
		fmt.Fprintf(&b, "; the %d trailing sort %s dropped", q.Hidden, plural(q.Hidden, "column"))
	}
	if r.Offset > 0 {
		fmt.Fprintf(&b, "; OFFSET %d", r.Offset)
	}
	if r.Limit >= 0 {
		fmt.Fprintf(&b, "; LIMIT %d", r.Limit)
	}
	if r.PerNode >= 0 {
		fmt.Fprintf(&b, " (each node returns at most %d %s)", r.PerNode, plural(int(min(r.PerNode, 2)), "row"))
	}
	return b.String()
}

// rowList numbers VALUES rows from 1, as a reader counts them.
func rowList(rows []int) string {
	names := make([]string, len(rows))
	for i, row := range rows {
		names[i] = strconv.Itoa(row + 1)
	}
	return strings.Join(names, ", ")
}

// paramList says which of the client's parameters a split INSERT's part
// takes under its own numbers.
func paramList(params []int) string {
	names := make([]string, len(params))
	for i, orig := range params {
		names[i] = "$" + strconv.Itoa(i+1) + " is the client's $" + strconv.Itoa(orig)
	}
	return strings.Join(names, ", ")
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// template is the final query of an aggregate with its holes named: the
// partial rows, and each combined aggregate by its kind and column.
func (a *AggPlan) template() string {
	var b strings.Builder
	b.WriteString(a.final[0])
	for i, h := range a.holes {
		if h < 0 {
			b.WriteString("<partial rows>")
		} else {
			if c := a.aggs[h]; c.kind == AggDistinct {
				b.WriteString(c.text)
			} else {
				fmt.Fprintf(&b, "<%s of lattice_c%d>", []string{"count", "sum", "min", "max", "avg"}[c.kind], c.col+1)
			}
		}
		b.WriteString(a.final[i+1])
	}
	return b.String()
}
