package router

import (
	"slices"

	pg "github.com/pganalyze/pg_query_go/v6"

	"github.com/lattice-db/lattice/sqlstate"
)

// A CTE that deletes or updates rows of a tree, fixes its key in its own
// WHERE and returns the key (WITH d AS (DELETE FROM orders WHERE
// customer_id = 7 ... RETURNING *)) gives rows of that key's shard: read by
// the statement it is defined in, it is a keyed derived table
// (keyedDerived) keyed on the returned key column, and pins that
// statement's level. So INSERT INTO archive (...) SELECT ... FROM d,
// archive colocated with orders, runs on the key's shard, moving its rows
// there.
//
// The CTE must fix the key itself. PostgreSQL runs a writing CTE to the
// end whatever the statement reads of it, so a key fixed only outside it
// (SELECT ... FROM d WHERE d.customer_id = 7) would leave its writes on
// every other shard undone. And the statement must run on one shard
// (singleWriteCTE): over every shard, a shard being migrated holds rows
// of slots it no longer owns, which the CTE's own DELETE or UPDATE cannot
// be rendered to leave alone. Only a CTE referenced once is keyed: each
// reference would be its own reference of the body's rows, which have one
// anchor. An INSERT body is not keyed: its rows are the VALUES or SELECT it
// inserts, routed by their keys.

// joinAt is a JOIN in level's FROM.
type joinAt struct {
	j     *pg.JoinExpr
	level int
}

// cteRef is a reference to a CTE in a FROM.
type cteRef struct {
	rv       *pg.RangeVar
	level    int
	nullable bool
}

// defineCTE records that CTE name's body is level body. One with a
// column list renames what it returns: it is not keyed.
func (c *colocation) defineCTE(name string, body int, columns bool) {
	if c.cteBodies == nil {
		c.cteBodies = map[string]int{}
	}
	if _, dup := c.cteBodies[name]; dup || columns {
		body = -1 // defined at two levels: which one a reference sees is not modelled
	}
	c.cteBodies[name] = body
}

// keyWriteCTEs makes each reference to a writing CTE keyed on its tree's
// key a keyed reference of the level that reads it.
func (c *colocation) keyWriteCTEs() {
	uses := map[string]int{}
	for _, r := range c.cteRefs {
		uses[r.rv.Relname]++
	}
	for _, r := range c.cteRefs {
		body, ok := c.cteBodies[r.rv.Relname]
		if !ok || body < 0 || uses[r.rv.Relname] != 1 || body >= len(c.levels) {
			continue
		}
		key, own := c.returnedKey(body)
		if own < 0 {
			continue
		}
		if !c.pinsItself(body, own) {
			c.unpinnedWrite = c.refs[own].tree.Name
			continue
		}
		c.writeBodies = append(c.writeBodies, body)
		tree := *c.refs[own].tree
		tree.KeyColumn = key
		c.refs = append(c.refs, treeRef{rv: r.rv, tree: &tree, level: r.level, nullable: r.nullable, derived: true})
		i := len(c.refs) - 1
		c.levels[r.level].refs = append(c.levels[r.level].refs, i)
		name := r.rv.Relname
		if r.rv.Alias != nil {
			name = r.rv.Alias.Aliasname
		}
		if c.levels[r.level].names[name] == noName {
			c.levels[r.level].names[name] = i
		}
		c.levels[body].keyed, c.levels[body].asRef = true, i
		c.joinUsing(r.rv, key)
	}
}

// joinUsing links, for the keyed reference rv of a writing CTE, the JOINs
// beside it by USING (key) or NATURAL, which the walk met before the
// reference was keyed. usingSide finds references by their nodes, so every
// reference is a candidate on each side.
func (c *colocation) joinUsing(rv *pg.RangeVar, key string) {
	for _, ja := range c.joins {
		j := ja.j
		if j.Larg.GetRangeVar() != rv && j.Rarg.GetRangeVar() != rv {
			continue
		}
		joined := j.IsNatural
		for _, u := range j.UsingClause {
			joined = joined || u.GetString_().GetSval() == key
		}
		a, b := c.usingSide(j.Larg, 0, len(c.refs), key), c.usingSide(j.Rarg, 0, len(c.refs), key)
		if joined && a >= 0 && b >= 0 && a != b {
			c.using = append(c.using, usingLink{level: ja.level, a: a, b: b})
		}
	}
}

// returnedKey is, for the level of a CTE body that deletes or updates a
// tree and returns its key, the returned key column's name and the tree's
// reference; own is -1 for any other body.
func (c *colocation) returnedKey(body int) (key string, own int) {
	var rel *pg.RangeVar
	var returning []*pg.Node
	switch s := c.levels[body].stmt.(type) {
	case *pg.DeleteStmt:
		rel, returning = s.Relation, s.ReturningList
	case *pg.UpdateStmt:
		rel, returning = s.Relation, s.ReturningList
	default:
		return "", -1
	}
	own = -1
	for _, i := range c.levels[body].refs {
		if c.refs[i].rv == rel {
			own = i
		}
	}
	if own < 0 {
		return "", -1
	}
	k := c.refs[own].tree.KeyColumn
	for _, x := range returning {
		rt := x.GetResTarget()
		if rt == nil {
			continue
		}
		if cr := rt.Val.GetColumnRef(); cr != nil && len(cr.Fields) == 1 && cr.Fields[0].GetAStar() != nil {
			return k, own
		}
		if namesKey(rt.Val, rel, k) {
			if rt.Name != "" {
				return rt.Name, own
			}
			return k, own
		}
	}
	return "", -1
}

// pinsItself reports whether the WHERE of level body fixes the key of its
// own reference own.
func (c *colocation) pinsItself(body, own int) bool {
	for _, n := range conjuncts(c.levels[body].where, nil) {
		if _, i, ok := c.pin(n, body); ok && i == own {
			return true
		}
	}
	return false
}

// singleWriteCTE refuses a statement with a keyed writing CTE that does
// not run on one shard, or on another key's: a pin of the reading level
// that contradicts the CTE's own empties the statement's rows, not the
// CTE's writes.
func (c *colocation) singleWriteCTE(res colocResult, name string) *sqlstate.Error {
	if !res.single && c.unpinnedWrite != "" {
		// Refused anyway (its level is anchored by nothing): say why.
		return refused("Add the key = <value> to the CTE's own WHERE, or run the CTE's statement and the rest as two statements in one transaction.",
			"%s: a CTE that writes tree %s runs only where its own WHERE fixes the shard key", name, qn(c.unpinnedWrite))
	}
	if len(c.writeBodies) == 0 {
		return nil
	}
	ok := res.single
	for _, body := range c.writeBodies {
		for _, v := range c.levels[body].pins {
			ok = ok && (v == res.key || v.Param > 0 && slices.Contains(res.also, v))
		}
	}
	if ok {
		return nil
	}
	return refused("Fix the CTE's key in the statement that reads it too, or run the CTE's statement and the rest as two statements in one transaction.",
		"%s: a CTE that writes a tree runs only where the whole statement fixes the same shard key", name)
}
