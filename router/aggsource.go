package router

import (
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
}

func newRefPlacer(rvs []*pg.RangeVar, deep bool) *refPlacer {
	rp := &refPlacer{at: map[int32]int{}, deep: deep, found: make([]int, len(rvs))}
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
	if j := n.GetJoinExpr(); j != nil && !rp.deep {
		j.Larg, j.Rarg = rp.walk(j.Larg), rp.walk(j.Rarg)
		return n
	}
	if rp.deep {
		rewriteChildren(n.ProtoReflect(), rp.walk)
	}
	return n
}

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
			b.WriteString("SELECT * FROM " + quoteIdent(s.Schema) + "." + quoteIdent(ref.tree.Name))
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
