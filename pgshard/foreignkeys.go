package pgshard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// checkForeignKey refuses a foreign key of tree t's template (t's own, or
// another table's referencing t) that shard-by-shard constraints could not
// enforce: one between t and a tree of another colocation group or an
// ordinary table, or from a reference table to t. The router refuses
// these forms before they run (router/foreignkey.go, which also checks the
// paired keys and the actions); this catches what only the catalog knows.
func checkForeignKey(ctx context.Context, store shardmap.Store, t *shardmap.Tree, con constraintInfo) error {
	other := con.To
	if !con.Outgoing {
		other = con.From
	}
	ot, err := store.Tree(ctx, t.Tenant, other)
	switch {
	case err == nil && ot.MapName() == t.MapName():
		return nil
	case err != nil && !errors.Is(err, shardmap.ErrNotFound):
		return fmt.Errorf("pgshard: foreign key %s: %w", quoted(con.Name), err)
	}
	if rs, ok := store.(shardmap.ReferenceStore); ok && con.Outgoing && err != nil {
		refs, err := rs.References(ctx, t.Tenant)
		if err != nil {
			return fmt.Errorf("pgshard: foreign key %s: %w", quoted(con.Name), err)
		}
		if slices.ContainsFunc(refs, func(r *shardmap.Reference) bool { return r.Name == other }) {
			return nil
		}
	}
	return &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
		Message: fmt.Sprintf("foreign key %s from %s to %s cannot be enforced across shards", quoted(con.Name), quoted(con.From), quoted(con.To)),
		Hint:    "A tree may reference a tree of its colocation group (on both shard keys) or a reference table; drop the foreign key: ALTER TABLE " + con.FromSQL + " DROP CONSTRAINT " + quoteIdent(con.Name)}
}

// refuseReferenceCycle refuses foreign keys by which t's template reaches
// itself through other tables: a reshard builds a group's shard tables in
// an order their foreign keys allow (migrator/foreignkeys.go), and a cycle
// allows none. A table referencing itself is no cycle.
func refuseReferenceCycle(ctx context.Context, tx pgx.Tx, t *shardmap.Tree) error {
	var cycle bool
	err := tx.QueryRow(ctx, `WITH RECURSIVE reach (rel) AS (
    SELECT confrelid FROM pg_catalog.pg_constraint WHERE contype = 'f' AND conrelid = $1::regclass AND confrelid <> conrelid
  UNION
    SELECT c.confrelid FROM pg_catalog.pg_constraint c JOIN reach ON c.conrelid = reach.rel WHERE c.contype = 'f' AND c.confrelid <> c.conrelid
) SELECT EXISTS (SELECT 1 FROM reach WHERE rel = $1::regclass)`, pgx.Identifier{"public", t.Name}.Sanitize()).Scan(&cycle)
	switch {
	case err != nil:
		return fmt.Errorf("pgshard: foreign keys of %s: %w", quoted(t.Name), err)
	case cycle:
		return &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
			Message: fmt.Sprintf("the foreign keys of tree %s would make a cycle back to it", quoted(t.Name)),
			Detail:  "A reshard builds each shard's tables in an order their foreign keys allow; a cycle allows none.",
			Hint:    "Keep one direction of the relationship as a foreign key, and the other in the application."}
	}
	return nil
}

// fkTarget is what a foreign key of a tree references, as far as the shard
// tables are concerned.
type fkTarget struct {
	self      bool           // the tree itself
	tree      *shardmap.Tree // a tree, nil otherwise
	reference bool           // a reference table
}

// createTreeForeignKeys checks the foreign keys of the table that
// lattice_create_tree makes tree t, in colocation group co (nil: a group
// of its own), and returns the statements that add them to each shard
// table, for its DDL log. CREATE TABLE through the proxy lets a table
// reference a tree on its key (router/foreignkey.go); only here, with the
// new tree's key and group chosen, can the pairing be checked.
func createTreeForeignKeys(ctx context.Context, store shardmap.Store, t *shardmap.Tree, co *colocation, ti *tableInfo) ([]string, error) {
	var refs []*shardmap.Reference
	if rs, ok := store.(shardmap.ReferenceStore); ok {
		var err error
		if refs, err = rs.References(ctx, t.Tenant); err != nil {
			return nil, fmt.Errorf("pgshard: foreign keys of %s: %w", quoted(t.Name), err)
		}
	}
	var out []string
	for _, con := range ti.Constraints {
		if con.Type != "f" || !con.Outgoing {
			continue
		}
		var to fkTarget
		switch ot, err := store.Tree(ctx, t.Tenant, con.To); {
		case con.To == t.Name:
			to.self = true
		case err == nil:
			to.tree = ot
		case !errors.Is(err, shardmap.ErrNotFound):
			return nil, fmt.Errorf("pgshard: foreign key %s: %w", quoted(con.Name), err)
		default:
			to.reference = slices.ContainsFunc(refs, func(r *shardmap.Reference) bool { return r.Name == con.To })
		}
		group := ""
		if co != nil {
			group = co.anchor.MapName()
		}
		if err := checkTreeForeignKey(t, group, con, to); err != nil {
			return nil, err
		}
		out = append(out, foreignKeyStatement(con, to))
	}
	return out, nil
}

// checkTreeForeignKey refuses a foreign key con of tree t, in colocation
// group group ("": a group of its own), that shard-by-shard constraints
// could not enforce exactly: the rules of ALTER TABLE ... ADD FOREIGN KEY
// through the proxy (router/foreignkey.go), which see the statement where
// this sees the catalog.
func checkTreeForeignKey(t *shardmap.Tree, group string, con constraintInfo, to fkTarget) error {
	refuse := func(msg, hint string) error {
		return &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
			Message: fmt.Sprintf("foreign key %s of %s to %s ", quoted(con.Name), quoted(t.Name), quoted(con.To)) + msg, Hint: hint}
	}
	drop := " Or drop it: ALTER TABLE " + quoteIdent(t.Name) + " DROP CONSTRAINT " + quoteIdent(con.Name) + "."
	parentKey := t.KeyColumn
	switch {
	case to.tree != nil && to.tree.MapName() != group:
		return refuse("cannot be enforced across shards: the trees are not colocated",
			"Colocate the trees with colocate_with (lattice_create_tree("+quoteLiteral(t.Name)+", "+quoteLiteral(t.KeyColumn)+", colocate_with => "+quoteLiteral(to.tree.Name)+"))."+drop)
	case to.tree != nil:
		parentKey = to.tree.KeyColumn
	case !to.self && !to.reference:
		return refuse("cannot be enforced: the table is on the catalog node only",
			"Make "+quoted(con.To)+" a reference table with lattice_create_reference_table, or a tree colocated with "+quoted(t.Name)+" (colocate_with)."+drop)
	}
	if !to.reference {
		paired := false
		for i, c := range con.FkCols {
			paired = paired || c == t.KeyColumn && i < len(con.PkCols) && con.PkCols[i] == parentKey
		}
		if !paired {
			return refuse(fmt.Sprintf("does not pair shard key %s with shard key %s, so a row and the row it references may be on different shards", quoted(t.KeyColumn), quoted(parentKey)),
				"Include the shard keys as a pair: FOREIGN KEY ("+t.KeyColumn+", ...) REFERENCES "+quoteIdent(con.To)+" ("+parentKey+", ...)."+drop)
		}
	}
	if con.MatchType == "p" {
		return refuse("uses MATCH PARTIAL", "Use MATCH SIMPLE or MATCH FULL.")
	}
	// As in the router: a cascaded delete between trees stays in the shard;
	// any other action could write other shards' or nodes' rows, or set a
	// shard key.
	for _, a := range []struct{ on, action string }{{"DELETE", con.DelAction}, {"UPDATE", con.UpdAction}} {
		if a.action == "a" || a.action == "r" || a.action == "c" && a.on == "DELETE" && !to.reference {
			continue
		}
		return refuse("has ON "+a.on+" "+fkActions[a.action]+", which is not supported",
			"Use ON "+a.on+" NO ACTION or RESTRICT (ON DELETE CASCADE is supported between trees)."+drop)
	}
	return nil
}

var fkActions = map[string]string{"a": "NO ACTION", "r": "RESTRICT", "c": "CASCADE", "n": "SET NULL", "d": "SET DEFAULT"}

// foreignKeyStatement adds con to a shard table ({{table}}), referencing
// the same shard's table of a tree ({{schema}}.name), itself, or the
// node's copy of a reference table (public.name).
func foreignKeyStatement(con constraintInfo, to fkTarget) string {
	ref := quoteIdent("public") + "." + quoteIdent(con.To)
	switch {
	case to.self:
		ref = "{{table}}"
	case to.tree != nil:
		ref = "{{schema}}." + quoteIdent(con.To)
	}
	cols := func(names []string) string {
		q := make([]string, len(names))
		for i, n := range names {
			q[i] = quoteIdent(n)
		}
		return strings.Join(q, ", ")
	}
	s := "ALTER TABLE {{table}} ADD CONSTRAINT " + quoteIdent(con.Name) + " FOREIGN KEY (" + cols(con.FkCols) + ") REFERENCES " + ref + " (" + cols(con.PkCols) + ")"
	if con.MatchType == "f" {
		s += " MATCH FULL"
	}
	if con.UpdAction != "a" {
		s += " ON UPDATE " + fkActions[con.UpdAction]
	}
	if con.DelAction != "a" {
		s += " ON DELETE " + fkActions[con.DelAction]
	}
	if con.Deferrable {
		s += " DEFERRABLE"
	}
	if con.InitiallyDeferred {
		s += " INITIALLY DEFERRED"
	}
	return s
}

// templateForeignKey is a foreign key of a tree's template and what it
// references.
type templateForeignKey struct {
	con constraintInfo
	to  fkTarget
}

// templateForeignKeys reads what the outgoing foreign keys of template ti
// reference, inside tx on the catalog node: another template (a fenced
// table, a tree) or else a reference table, the only targets tree DDL
// lets a template keep (checkTemplate).
func templateForeignKeys(ctx context.Context, tx pgx.Tx, ti *tableInfo) ([]templateForeignKey, error) {
	var out []templateForeignKey
	for _, con := range ti.Constraints {
		if con.Type != "f" || !con.Outgoing {
			continue
		}
		fk := templateForeignKey{con: con}
		if con.To == ti.Name {
			fk.to.self = true
		} else {
			var tree bool
			err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = $2)`,
				pgx.Identifier{"public", con.To}.Sanitize(), fenceTrigger).Scan(&tree)
			if err != nil {
				return nil, fmt.Errorf("foreign key %s: %w", quoted(con.Name), err)
			}
			if tree {
				fk.to.tree = &shardmap.Tree{Name: con.To}
			} else {
				fk.to.reference = true
			}
		}
		out = append(out, fk)
	}
	return out, nil
}
