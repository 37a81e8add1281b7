package router

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
)

// The partial query of an aggregating fan-out reads each tree reference as
// the union of the node's shards of that tree, under the reference's name
// or alias. With one tree that is the statement's own FROM item. With
// several tree references of one colocation group (joined, correlated or
// compared by IN on equal shard keys: colocate.go), every reference, in a
// join, a subquery of WHERE or a derived table, reads its node's shards:
// every row the statement's FROM and WHERE yield combines rows of one key
// (or of one key and NULLs), and the rows of one key are all in one shard
// of every member, so the node's part is the union of its shards' parts,
// which is what the per-shard fan-out reads too. A mixed shard is read
// through the slot predicate of each reference's own key, so that no row
// of any member is read twice.

// aggRef is one tree reference of an aggregating fan-out.
type aggRef struct {
	tree  *shardmap.Tree
	alias string // the reference's alias, or the tree's name
	// sample is the reference's TABLESAMPLE clause, " TABLESAMPLE ...",
	// which each of its shards takes: as PostgreSQL samples each partition
	// of a partitioned table, the shards' samples together are a sample of
	// the tree.
	sample  string
	sampled *pg.RangeTableSample // the clause sample is deparsed from
}

// aggText is a deparsed statement cut at its tree references: holes[i]
// (an index into AggPlan.refs) stands between pieces[i] and pieces[i+1].
type aggText struct {
	pieces []string
	holes  []int
}

// refPlaceholder is the name a tree reference takes while the statement is
// deparsed; the rendering puts the node's shards there.
const refPlaceholder = "lattice_src_"

// refPlacer replaces tree references, by their location, with placeholders.
type refPlacer struct {
	at    map[int32]int // a reference's location -> its index
	names []string      // each reference's relation name
	deep  bool          // inside subqueries too, or only in FROM lists and joins
	found []int         // how often each reference was placed
	// samples are the TABLESAMPLE clauses of sampled references, which the
	// placeholders replace with the references.
	samples []*pg.RangeTableSample
}

func newRefPlacer(rvs []*pg.RangeVar, deep bool) *refPlacer {
	rp := &refPlacer{at: map[int32]int{}, deep: deep, found: make([]int, len(rvs)), samples: make([]*pg.RangeTableSample, len(rvs))}
	for i, rv := range rvs {
		rp.at[rv.Location] = i
		rp.names = append(rp.names, rv.Relname)
	}
	return rp
}

// place returns a copy of n with the references replaced.
func (rp *refPlacer) place(n *pg.Node) *pg.Node {
	if n == nil {
		return nil
	}
	return rp.walk(proto.Clone(n).(*pg.Node))
}

func (rp *refPlacer) walk(n *pg.Node) *pg.Node {
	if v := n.GetRangeVar(); v != nil {
		if i, ok := rp.at[v.Location]; ok && v.Relname == rp.names[i] {
			rp.found[i]++
			return &pg.Node{Node: &pg.Node_RangeVar{RangeVar: &pg.RangeVar{Relname: refPlaceholder + strconv.Itoa(i+1), Inh: true, Relpersistence: "p"}}}
		}
		return n
	}
	if ts := n.GetRangeTableSample(); ts != nil {
		if v := ts.Relation.GetRangeVar(); v != nil {
			if i, ok := rp.at[v.Location]; ok && v.Relname == rp.names[i] {
				rp.samples[i] = ts
				return rp.walk(ts.Relation)
			}
		}
	}
	if j := n.GetJoinExpr(); j != nil && !rp.deep {
		j.Larg, j.Rarg = rp.walk(j.Larg), rp.walk(j.Rarg)
		return n
	}
	if rp.deep {
		rewriteChildren(n.ProtoReflect(), rp.walk)
	}
	return n
}

// sampleRefs gives refs the TABLESAMPLE clauses the placer took out.
func (rp *refPlacer) sampleRefs(refs []aggRef) bool {
	for i, ts := range rp.samples {
		if ts == nil {
			continue
		}
		rv := &pg.RangeVar{Relname: sampleName, Inh: true, Relpersistence: "p"}
		from := &pg.RangeTableSample{Relation: &pg.Node{Node: &pg.Node_RangeVar{RangeVar: rv}}, Method: ts.Method, Args: ts.Args, Repeatable: ts.Repeatable}
		sel := &pg.SelectStmt{TargetList: []*pg.Node{starTarget()}, FromClause: []*pg.Node{{Node: &pg.Node_RangeTableSample{RangeTableSample: from}}}}
		text, err := pg.Deparse(&pg.ParseResult{Version: parseVersion, Stmts: []*pg.RawStmt{{Stmt: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: sel}}}}})
		_, clause, ok := strings.Cut(text, sampleName)
		if err != nil || !ok {
			return false
		}
		refs[i].sample, refs[i].sampled = clause, ts
	}
	return true
}

// sampleName stands for a sampled reference while its clause is deparsed.
const sampleName = "lattice_sampled"

// once reports whether every reference was placed exactly once.
func (rp *refPlacer) once() bool {
	for _, f := range rp.found {
		if f != 1 {
			return false
		}
	}
	return true
}

// cutRefs cuts a deparsed statement at its placeholders, each of the n
// references exactly once.
func cutRefs(text string, n int) (aggText, bool) {
	toks, _, ok := scan(text)
	if !ok {
		return aggText{}, false
	}
	var out aggText
	seen := make([]bool, n)
	last := 0
	for _, t := range toks {
		if t.kind != pg.Token_IDENT {
			continue
		}
		num, found := strings.CutPrefix(t.text(text), refPlaceholder)
		if !found {
			continue
		}
		k, err := strconv.Atoi(num)
		if err != nil || k < 1 || k > n || seen[k-1] {
			return aggText{}, false
		}
		seen[k-1] = true
		out.pieces = append(out.pieces, text[last:t.start])
		out.holes = append(out.holes, k-1)
		last = int(t.end)
	}
	out.pieces = append(out.pieces, text[last:])
	return out, len(out.holes) == n
}

// renderRefs renders t with each reference reading the given shards of its
// tree: (SELECT * FROM s1.tree UNION ALL ...) AS name. A mixed shard's
// filter, made for the plan's tree, is turned to each reference's key.
func (p *Plan) renderRefs(t aggText, schemas []btreeindex.Source) string {
	var b strings.Builder
	b.WriteString(t.pieces[0])
	for i, h := range t.holes {
		ref := p.Agg.refs[h]
		b.WriteByte('(')
		for j, s := range schemas {
			if j > 0 {
				b.WriteString(" UNION ALL ")
			}
			b.WriteString("SELECT * FROM " + quoteIdent(s.Schema) + "." + quoteIdent(ref.tree.Name) + ref.sample)
			if s.Filter != "" {
				b.WriteString(" WHERE " + memberFilter(s.Filter, p.Tree, ref.tree))
			}
		}
		b.WriteString(") AS ")
		b.WriteString(quoteIdent(ref.alias))
		b.WriteString(t.pieces[i+1])
	}
	return b.String()
}

// memberFilter turns a mixed shard's filter on base's key into the same
// slots of member, a tree of base's colocation group: the group shares one
// map, so only the key column differs.
func memberFilter(filter string, base, member *shardmap.Tree) string {
	if member.Name == base.Name {
		return filter
	}
	return strings.ReplaceAll(filter, btreeindex.SlotExpr(base, ""), btreeindex.SlotExpr(member, ""))
}

// stepIn is what the partial query of a two-step fan-out (aggregates,
// or windows in the final step: windowstep.go) takes from the statement:
// its tree references, FROM and WHERE with each reference replaced by a
// placeholder, and its select list with * expanded and every output
// name explicit, since the final step computes the select list anew.
type stepIn struct {
	refs    []aggRef
	src     []*pg.Node
	where   *pg.Node
	targets []*pg.ResTarget
	joined  bool // the FROM list is more than the one tree
}

// stepWords name the form in refusals.
type stepWords struct {
	in, sel, plural string
}

var aggWords = stepWords{in: "in an aggregate", sel: "an aggregating SELECT", plural: "aggregates"}

// noFunc is a planner's refusal of a fan-out, prefixed with what the
// statement does not fix.
type noFunc func(hint, format string, args ...any) route

// fanRefusal returns the hint that fixes the key and the refusal of a
// SELECT on tree over several shards.
func fanRefusal(tree *shardmap.Tree) (string, noFunc) {
	return "Add " + tree.KeyColumn + " = <value> (or IN with one value) to the WHERE clause to read one shard",
		func(hint, format string, args ...any) route {
			return refusedRoute(refused(hint, "SELECT on tree %s does not fix the shard key %s, and %s",
				qn(tree.Name), qn(tree.KeyColumn), fmt.Sprintf(format, args...)))
		}
}

// stepInput reads the statement for a two-step fan-out; on a form it
// cannot carry it returns the refusal, given the caller's no and key hint.
func stepInput(r route, s *pg.SelectStmt, w stepWords) (stepIn, func(no noFunc, keyHint string) route) {
	tree := r.tree
	refuse := func(hint, why string) func(noFunc, string) route {
		return func(no noFunc, keyHint string) route { return no(keyHint+hint, "%s", why) }
	}
	multi := r.multi != nil
	refs, rvs := aggRefs(r)
	in := stepIn{refs: refs, joined: multi || len(s.FromClause) != 1 || s.FromClause[0].GetRangeVar() != r.rv}
	if len(r.cols) > 0 {
		return in, refuse(", or name columns without the schema (tree.column).", "schema-qualified column references "+w.in+" over several shards are not supported")
	}
	for _, rv := range rvs {
		if rv.Alias != nil && len(rv.Alias.Colnames) > 0 {
			return in, refuse(", or leave out the column aliases of the table alias.", "column aliases on the tree "+w.in+" over several shards are not supported")
		}
	}
	// The partial query's FROM and WHERE are the statement's, each tree
	// reference replaced by its node's shards: joined with reference
	// tables and colocated trees, each node's part is then the join of
	// its shards' rows. One tree must be in the FROM list itself or in its
	// joins; several are placed wherever they are, and must all be in
	// FROM or WHERE, which the partial query keeps.
	placer := newRefPlacer(rvs, multi)
	in.src = make([]*pg.Node, len(s.FromClause))
	for i, n := range s.FromClause {
		in.src[i] = placer.place(n)
	}
	in.where = s.WhereClause
	if multi {
		in.where = placer.place(in.where)
	}
	if !placer.once() || !placer.sampleRefs(in.refs) {
		if multi {
			return in, refuse(".", "a tree reference outside FROM and WHERE in "+w.sel+" over several shards is not supported")
		}
		return in, refuse(".", w.plural+" over several shards need the tree in the FROM list itself or in its joins, not inside a subquery")
	}

	// The select list, * expanded from the tree's columns, with every
	// output name explicit: the final step computes other expressions.
	for _, t := range s.TargetList {
		rt := t.GetResTarget()
		if rt == nil {
			return in, func(noFunc, string) route { return refusedRoute(fanError(tree.Name)) }
		}
		if isStar(rt.Val) {
			if len(tree.Columns) == 0 || len(rt.Val.GetColumnRef().Fields) > 1 || in.joined {
				return in, refuse(", or list the columns instead of *.", "the proxy does not know the columns of * "+w.in+" over several shards")
			}
			for _, c := range tree.Columns {
				in.targets = append(in.targets, &pg.ResTarget{Name: c, Val: columnNode(c)})
			}
			continue
		}
		rt = proto.Clone(rt).(*pg.ResTarget)
		if rt.Name == "" {
			name, ok := figureName(rt.Val)
			if !ok {
				return in, refuse(", or give every output column an alias.", "the proxy cannot tell the name of an output column")
			}
			rt.Name = name
		}
		in.targets = append(in.targets, rt)
	}
	return in, nil
}

// finalSort rewrites the final step's ORDER BY in place: a position or an
// output column name (which takes precedence, SQL92) stays, any other
// expression goes through rewrite. False on an item that is not a SortBy.
func finalSort(sorts []*pg.Node, targets []*pg.ResTarget, rewrite func(*pg.Node) *pg.Node) bool {
	for _, sn := range sorts {
		sb := sn.GetSortBy()
		if sb == nil {
			return false
		}
		if c := sb.Node.GetAConst(); c != nil && c.GetIval() != nil {
			continue
		}
		if name, ok := bareName(sb.Node); ok && slices.ContainsFunc(targets, func(t *pg.ResTarget) bool { return t.Name == name }) {
			continue
		}
		sb.Node = rewrite(sb.Node)
	}
	return true
}
