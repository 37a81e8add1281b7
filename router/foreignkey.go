package router

import (
	"sort"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Foreign keys of a tree (docs/DESIGN.md section 4.1, "Foreign keys"). A
// tree may reference a tree of its colocation group on columns that pair
// the two shard keys, or a reference table. Rows of equal keys share a
// shard, and every node holds a whole reference table, so shard N's table
// referencing shard N's table (or the node's reference table) enforces the
// constraint exactly. Anything else would be checked against a part of the
// referenced rows, and is refused.

// addedForeignKey returns the foreign key an ALTER TABLE adds as a table
// constraint, nil when it adds none.
func addedForeignKey(s *pg.AlterTableStmt) *pg.Constraint {
	for _, c := range s.Cmds {
		cmd := c.GetAlterTableCmd()
		if cmd == nil || cmd.Subtype != pg.AlterTableType_AT_AddConstraint {
			continue
		}
		if con := cmd.Def.GetConstraint(); con != nil && con.Contype == pg.ConstrType_CONSTR_FOREIGN {
			return con
		}
	}
	return nil
}

// foreignKeyDDL plans ALTER TABLE tree ADD FOREIGN KEY. It reports false
// when the changed table is not a tree (planned as before).
func (p *planner) foreignKeyDDL(pl *Plan, s *pg.AlterTableStmt, con *pg.Constraint, start, end int) bool {
	child, dbq := p.lookup(s.Relation)
	if child == nil || dbq || con.Pktable == nil {
		return false
	}
	if len(s.Cmds) != 1 {
		return p.refuse(pl, refused("Add the foreign key in an ALTER TABLE of its own.",
			"ALTER TABLE on tree %s adds a foreign key together with other changes", qn(child.Name)))
	}
	parent, pdbq := p.lookup(con.Pktable)
	ref := parent == nil && !pdbq && p.isReference(con.Pktable)
	if err := checkForeignKey(p.trees, child, parent, ref, con); err != nil {
		return p.refuse(pl, err)
	}
	if strings.Contains(p.sql[start:end], "{{") {
		return p.refuse(pl, refused("Write the statement without \"{{\".",
			"ALTER TABLE on tree %s contains \"{{\", which the DDL log of a tree reserves", qn(child.Name)))
	}
	rd, log, err := p.foreignKeyRenderer(child, s.Relation, parent, ref, con.Pktable, start, end)
	if err != nil {
		return p.refuse(pl, err)
	}
	pl.Kind, pl.Tree, pl.render, pl.Tag = DDL, child, rd, "ALTER TABLE"
	pl.DDL = &DDLPlan{Op: DDLAlter, Logged: true, log: log}
	return true
}

// checkForeignKey refuses a foreign key of tree child that shard-by-shard
// constraints could not enforce exactly.
func checkForeignKey(trees Trees, child, parent *shardmap.Tree, ref bool, con *pg.Constraint) *sqlstate.Error {
	target := qn(con.Pktable.Relname)
	switch {
	case parent == nil && !ref:
		return refused("Make "+target+" a reference table with lattice_create_reference_table, or a tree colocated with "+qn(child.Name)+" (colocate_with).",
			"foreign key of tree %s to table %s cannot be enforced: the table is on the catalog node only", qn(child.Name), target)
	case parent != nil && !colocated(trees, child, parent):
		return refused("Colocate the trees with colocate_with (lattice_create_tree(..., colocate_with => '"+parent.Name+"')), or keep the relationship in the application.",
			"foreign key of tree %s to tree %s cannot be enforced across shards: the trees are not colocated", qn(child.Name), qn(parent.Name))
	case len(con.PkAttrs) == 0 || len(con.PkAttrs) != len(con.FkAttrs):
		return refused("Name the referenced columns: REFERENCES "+target+" (...).",
			"foreign key of tree %s to %s does not name the referenced columns", qn(child.Name), target)
	case con.FkMatchtype == "p":
		return refused("Use MATCH SIMPLE or MATCH FULL.", "MATCH PARTIAL is not implemented")
	}
	if parent != nil && !pairsKeys(con, child, parent) {
		return refused("Include the shard keys as a pair: FOREIGN KEY ("+child.KeyColumn+", ...) REFERENCES "+qn(parent.Name)+" ("+parent.KeyColumn+", ...).",
			"foreign key of tree %s to tree %s does not pair shard key %s with shard key %s, so a row and the row it references may be on different shards",
			qn(child.Name), qn(parent.Name), qn(child.KeyColumn), qn(parent.KeyColumn))
	}
	return checkActions("tree "+qn(child.Name), target, parent != nil, con)
}

// checkActions refuses the actions of a foreign key of child (as the
// message names it) that shards could not carry out exactly. An
// action writes the referencing rows where the referenced row is: a
// cascaded delete from a tree stays in the shard (equal keys). A reference
// table's row is on every node, so any action would write every node's
// rows of the tree, moved copies included; SET NULL and SET DEFAULT could
// set a shard key. Those are refused.
func checkActions(child, target string, toTree bool, con *pg.Constraint) *sqlstate.Error {
	for _, a := range []struct{ on, action string }{{"DELETE", con.FkDelAction}, {"UPDATE", con.FkUpdAction}} {
		switch {
		case a.action == "" || a.action == "a" || a.action == "r":
		case a.action == "c" && a.on == "DELETE" && toTree:
		default:
			hint := "Use ON " + a.on + " NO ACTION or RESTRICT, and change the referencing rows in the application."
			if toTree {
				hint = "Use ON " + a.on + " NO ACTION or RESTRICT (ON DELETE CASCADE is supported between trees), and change the referencing rows in the application."
			}
			return refused(hint, "foreign key of %s to %s: ON %s %s is not supported", child, target, a.on, fkActionName(a.action))
		}
	}
	return nil
}

// createReferencing plans CREATE TABLE with a foreign key to a tree. The
// new table is ordinary, on the catalog node, and references the tree's
// empty template, so it can hold no row the key refers to until
// lattice_create_tree makes it a tree of the referenced tree's group
// (pgshard checks the key pairs then, knowing the new tree's key). What
// that cannot change is refused here, naming the fix. It reports false
// when the statement is to be planned as usual.
func (p *planner) createReferencing(pl *Plan, n *pg.Node, cs *pg.CreateStmt, start, end int) bool {
	var err *sqlstate.Error
	fkTrees := map[*pg.RangeVar]bool{}
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if c, ok := m.Interface().(*pg.Constraint); ok && c.Contype == pg.ConstrType_CONSTR_FOREIGN && c.Pktable != nil && err == nil {
			if parent, _ := p.lookup(c.Pktable); parent != nil {
				fkTrees[c.Pktable] = true
				err = checkCreateReference(cs.Relation.Relname, parent, c)
			}
		}
		eachChild(m, visit)
	}
	visit(cs.ProtoReflect())
	switch {
	case err != nil:
		return p.refuse(pl, err)
	case len(fkTrees) == 0:
		return false
	}
	root, _ := nodeMessage(n)
	for _, r := range walkStmt(root).rels {
		if t, _ := p.lookup(r.rv); t != nil && !fkTrees[r.rv] {
			return false // a tree named otherwise (LIKE, INHERITS): planned as usual
		}
	}
	p.apply(pl, route{kind: Catalog}, start, end)
	return true
}

// checkCreateReference checks a foreign key of new table child to tree
// parent in CREATE TABLE, as far as it can be checked before child's shard
// key is chosen: the referenced columns include parent's key.
func checkCreateReference(child string, parent *shardmap.Tree, con *pg.Constraint) *sqlstate.Error {
	target := qn(parent.Name)
	keyed := false
	for _, a := range con.PkAttrs {
		keyed = keyed || a.GetString_().GetSval() == parent.KeyColumn
	}
	switch {
	case len(con.PkAttrs) == 0:
		return refused("Name the referenced columns: REFERENCES "+target+" ("+parent.KeyColumn+", ...).",
			"foreign key of %s to tree %s does not name the referenced columns", qn(child), target)
	case !keyed:
		return refused("Reference the shard key: REFERENCES "+target+" ("+parent.KeyColumn+", ...), from the column that will be "+qn(child)+"'s shard key, and make "+qn(child)+" a tree colocated with "+target+" (colocate_with).",
			"foreign key of %s to tree %s does not reference its shard key %s, so a row and the row it references may be on different shards", qn(child), target, qn(parent.KeyColumn))
	case con.FkMatchtype == "p":
		return refused("Use MATCH SIMPLE or MATCH FULL.", "MATCH PARTIAL is not implemented")
	}
	return checkActions(qn(child), "tree "+target, true, con)
}

// pairsKeys reports whether the key column of child is paired with the key
// column of parent.
func pairsKeys(con *pg.Constraint, child, parent *shardmap.Tree) bool {
	for i, fk := range con.FkAttrs {
		if fk.GetString_().GetSval() == child.KeyColumn && con.PkAttrs[i].GetString_().GetSval() == parent.KeyColumn {
			return true
		}
	}
	return false
}

func fkActionName(a string) string {
	switch a {
	case "c":
		return "CASCADE"
	case "n":
		return "SET NULL"
	case "d":
		return "SET DEFAULT"
	}
	return a
}

// foreignKeyRenderer cuts the statement at the references to child (the
// shard table), parent (the same shard's table of the parent tree) and a
// referenced reference table, which every shard DDL names as public.table
// whatever the search path. log is the DDL log's form.
func (p *planner) foreignKeyRenderer(child *shardmap.Tree, crv *pg.RangeVar, parent *shardmap.Tree, ref bool, prv *pg.RangeVar,
	start, end int) (*renderer, string, *sqlstate.Error) {
	type hole struct {
		span
		tree *shardmap.Tree // nil: the reference table
	}
	var holes []hole
	for _, h := range []struct {
		t  *shardmap.Tree
		rv *pg.RangeVar
	}{{child, crv}, {parent, prv}} {
		if h.t == nil && !ref {
			continue
		}
		name := child
		if h.t != nil {
			name = h.t
		}
		spans, err := p.refSpans(route{tree: name, rv: h.rv})
		if err != nil {
			return nil, "", err
		}
		for _, s := range spans {
			holes = append(holes, hole{s, h.t})
		}
	}
	sort.Slice(holes, func(i, j int) bool { return holes[i].start < holes[j].start })
	rd := &renderer{rel: -1, table: -1, base: child}
	var log strings.Builder
	text, at, after := "", start, ""
	for _, h := range holes {
		if h.start < start || h.end > end || h.start < at {
			return nil, "", internalError(child.Name)
		}
		b, a := p.pad(h.span)
		text += after + p.sql[at:h.start] + b
		at, after = h.end, a
		if h.tree == nil {
			text += "public." + quoteIdent(prv.Relname)
			continue
		}
		rd.texts = append(rd.texts, text)
		rd.multi = append(rd.multi, refHole{tree: h.tree, qname: quoteIdent(h.tree.Name)})
		log.WriteString(text)
		if h.tree == child { // also a tree referencing itself: the same table
			log.WriteString("{{table}}")
		} else {
			log.WriteString("{{schema}}." + quoteIdent(h.tree.Name))
		}
		text = ""
	}
	text += after + p.sql[at:end]
	rd.texts = append(rd.texts, text)
	log.WriteString(text)
	return rd, log.String(), nil
}
