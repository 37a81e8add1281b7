package router

import (
	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// An UPDATE may name the shard key in SET when it cannot change it, as
// generic ORM updates that set every column do: SET key = key, or SET key
// = X beside key = X in an AND of the WHERE, X one $n or one constant
// written alike. Every row it updates keeps its key, so it stays in its
// slot. Any other assignment of the key is refused: the row would belong
// to another shard. (Key columns have deterministic collations,
// lattice_create_tree refuses others, so values equal under the key's =
// are one value.) A plan that two constants being alike allowed is not
// derived from a shape (shape.go): SET key = 'a' WHERE key = 'b' has the
// shape of SET key = 'a' WHERE key = 'a'.

// keyKept reports whether assignment rt of the key column of tree
// reference rel keeps every updated row's key, and whether it does so by
// two constants being alike.
func keyKept(rt *pg.ResTarget, rel *pg.RangeVar, key string, where *pg.Node) (kept, byConstants bool) {
	if len(rt.Indirection) > 0 || rt.Val == nil {
		return false, false
	}
	if namesKey(rt.Val, rel, key) {
		return true, false
	}
	for _, n := range conjuncts(where, nil) {
		e := n.GetAExpr()
		if e == nil || e.Kind != pg.A_Expr_Kind_AEXPR_OP || !isPlainEq(e.Name) {
			continue
		}
		for _, x := range [][2]*pg.Node{{e.Lexpr, e.Rexpr}, {e.Rexpr, e.Lexpr}} {
			if !namesKey(x[0], rel, key) {
				continue
			}
			if same, constant := sameValue(x[1], rt.Val); same {
				return true, constant
			}
		}
	}
	return false, false
}

// namesKey reports whether n is a reference to rel's column key: bare,
// qualified by rel's alias (or its name, when it has none), or
// public.rel.key when it has no alias.
func namesKey(n *pg.Node, rel *pg.RangeVar, key string) bool {
	f, ok := columnFields(n)
	if !ok {
		return false
	}
	name := rel.Relname
	if rel.Alias != nil {
		name = rel.Alias.Aliasname
	}
	switch len(f) {
	case 1:
		return f[0] == key
	case 2:
		return f[0] == name && f[1] == key
	case 3:
		return rel.Alias == nil && f[0] == "public" && f[1] == rel.Relname && f[2] == key
	}
	return false
}

// sameValue reports whether a and b are one parameter, or constants
// written alike (then constant is true).
func sameValue(a, b *pg.Node) (same, constant bool) {
	if pa, pb := a.GetParamRef(), b.GetParamRef(); pa != nil || pb != nil {
		return pa != nil && pb != nil && pa.Number == pb.Number, false
	}
	ca, cb := a.GetAConst(), b.GetAConst()
	if ca == nil || cb == nil || ca.Isnull || cb.Isnull {
		return false, false
	}
	switch {
	case ca.GetIval() != nil && cb.GetIval() != nil:
		return ca.GetIval().Ival == cb.GetIval().Ival, true
	case ca.GetSval() != nil && cb.GetSval() != nil:
		return ca.GetSval().Sval == cb.GetSval().Sval, true
	case ca.GetFval() != nil && cb.GetFval() != nil:
		return ca.GetFval().Fval == cb.GetFval().Fval, true
	}
	return false, false
}

// keyAssignRefusal is the error of an UPDATE that may change t's key.
func keyAssignRefusal(t *shardmap.Tree) *sqlstate.Error {
	return refused("Delete the row and insert it again with the new key. An UPDATE that keeps the key leaves it out of SET, or sets it to itself or to the value (constant or $n) that the WHERE compares it with.",
		"UPDATE of tree %s assigns the shard key %s, which would move the row to another shard", qn(t.Name), qn(t.KeyColumn))
}

// upsertKeyRefusal is the error of an INSERT ... ON CONFLICT DO UPDATE on
// tree t (into ins) that may change the key, nil when none may. DO UPDATE
// SET key = excluded.key keeps it when the conflict target names the key
// column: the conflicting row then has the proposed row's key. SET key =
// key keeps it always.
func upsertKeyRefusal(ins *pg.InsertStmt, t *shardmap.Tree) *sqlstate.Error {
	oc := ins.OnConflictClause
	if oc == nil {
		return nil
	}
	for _, x := range oc.TargetList {
		rt := x.GetResTarget()
		if rt == nil || rt.Name != t.KeyColumn {
			continue
		}
		if len(rt.Indirection) == 0 && (namesKey(rt.Val, ins.Relation, t.KeyColumn) || isExcludedKey(rt.Val, t.KeyColumn) && conflictOnKey(oc, t.KeyColumn)) {
			continue
		}
		return refused("Leave the key out of DO UPDATE SET, or set it to excluded."+quoteIdent(t.KeyColumn)+" with the key in the conflict target: the conflicting row already has it.",
			"INSERT ... ON CONFLICT DO UPDATE on tree %s assigns the shard key %s", qn(t.Name), qn(t.KeyColumn))
	}
	return nil
}

// isExcludedKey reports whether n is excluded.key.
func isExcludedKey(n *pg.Node, key string) bool {
	c := n.GetColumnRef()
	if c == nil || len(c.Fields) != 2 {
		return false
	}
	a, b := c.Fields[0].GetString_(), c.Fields[1].GetString_()
	return a != nil && b != nil && a.Sval == "excluded" && b.Sval == key
}

// conflictOnKey reports whether the conflict target of oc names column key
// itself among its columns.
func conflictOnKey(oc *pg.OnConflictClause, key string) bool {
	if oc.Infer == nil {
		return false
	}
	for _, e := range oc.Infer.IndexElems {
		if ie := e.GetIndexElem(); ie != nil && ie.Expr == nil && ie.Name == key {
			return true
		}
	}
	return false
}

// columnFields are the names of a column reference (col, t.col,
// schema.t.col); false for anything else, a * among them.
func columnFields(n *pg.Node) ([]string, bool) {
	c := n.GetColumnRef()
	if c == nil {
		return nil, false
	}
	f := make([]string, len(c.Fields))
	for i, x := range c.Fields {
		s := x.GetString_()
		if s == nil {
			return nil, false
		}
		f[i] = s.Sval
	}
	return f, true
}
