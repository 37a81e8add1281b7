package router

import (
	"fmt"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// DDLOp is what a DDL plan does to a tree.
type DDLOp int

const (
	// DDLAlter is ALTER TABLE tree ... (and ALTER TABLE tree RENAME COLUMN/CONSTRAINT).
	DDLAlter DDLOp = iota
	// DDLCreateIndex is CREATE [UNIQUE] INDEX [CONCURRENTLY] ... ON tree.
	DDLCreateIndex
	// DDLDropIndex is DROP INDEX [CONCURRENTLY] of one index. The router
	// cannot tell which table an index belongs to: the plan's Tree is nil
	// and the proxy asks the catalog node; an index that is not a tree's
	// runs there unchanged (Plan.SQL).
	DDLDropIndex
	// DDLTruncate is TRUNCATE of one tree: every shard, not logged.
	DDLTruncate
	// DDLDropTable is DROP TABLE of one tree: shards, template and registry entry.
	DDLDropTable
	// DDLIndexCheck is ALTER INDEX, or DROP INDEX of several indexes: the
	// proxy refuses it if one of Indexes is a tree's (it would change the
	// template only) and runs it on the catalog node otherwise.
	DDLIndexCheck
	// DDLMaintain is VACUUM, ANALYZE, REINDEX TABLE or CLUSTER of one tree:
	// every shard table, one by one outside a transaction, not logged.
	DDLMaintain
)

var ddlOpNames = [...]string{"alter", "create-index", "drop-index", "truncate", "drop-table", "index-check", "maintain"}

func (o DDLOp) String() string {
	if o >= 0 && int(o) < len(ddlOpNames) {
		return ddlOpNames[o]
	}
	return fmt.Sprintf("DDLOp(%d)", int(o))
}

// DDLPlan is the tree-specific part of a DDL plan.
type DDLPlan struct {
	Op           DDLOp
	Concurrently bool     // CREATE/DROP INDEX CONCURRENTLY, VACUUM, ANALYZE, REINDEX, CLUSTER: runs per table, outside a transaction
	Index        string   // DDLDropIndex: the index name (case-folded)
	Indexes      []string // DDLDropIndex, DDLIndexCheck: the public or unqualified index names the statement names
	Cascade      bool     // DROP ... CASCADE
	Logged       bool     // appended to the tree's DDL log for shards created later

	// log is the statement for the DDL log, with "{{table}}" for the
	// qualified shard table and "{{schema}}" for the shard schema.
	log string
	// drop is, for DDLDropIndex, the statement with "{{schema}}" for the schema.
	drop string
}

// Log is the statement to append to the tree's DDL log ("" when the
// statement is not logged): "{{table}}" stands for the qualified shard
// table and "{{schema}}" for the shard schema (pgshard.ShardDDL).
func (d *DDLPlan) Log() string {
	if !d.Logged {
		return ""
	}
	return d.log
}

// RenderDDL returns the statement to run against the tree's table in schema
// ("public" for the template).
func (p *Plan) RenderDDL(schema string) string {
	if p.DDL != nil && p.DDL.Op == DDLDropIndex {
		return strings.ReplaceAll(p.DDL.drop, "{{schema}}", quoteIdent(schema))
	}
	return p.Render(schema)
}

func ddlInvalid(hint, format string, args ...any) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.InvalidTableDefinition, Message: fmt.Sprintf(format, args...), Hint: hint}
}

// ddl plans DDL naming a tree. It reports false when the statement names no
// tree (it is then planned as usual).
func (p *planner) ddl(pl *Plan, n *pg.Node, start, end int) bool {
	var (
		op     DDLOp
		target *pg.RangeVar
	)
	switch s := n.Node.(type) {
	case *pg.Node_AlterTableStmt:
		switch s.AlterTableStmt.Objtype {
		case pg.ObjectType_OBJECT_INDEX:
			return indexCheck(pl, "ALTER INDEX", s.AlterTableStmt.Relation)
		case pg.ObjectType_OBJECT_TABLE:
		default:
			return false
		}
		if fk := addedForeignKey(s.AlterTableStmt); fk != nil && p.foreignKeyDDL(pl, s.AlterTableStmt, fk, start, end) {
			return true
		}
		op, target = DDLAlter, s.AlterTableStmt.Relation
	case *pg.Node_RenameStmt:
		if s.RenameStmt.RenameType == pg.ObjectType_OBJECT_INDEX {
			return indexCheck(pl, "ALTER INDEX", s.RenameStmt.Relation)
		}
		op, target = DDLAlter, s.RenameStmt.Relation
	case *pg.Node_AlterObjectSchemaStmt:
		op, target = DDLAlter, s.AlterObjectSchemaStmt.Relation
	case *pg.Node_IndexStmt:
		op, target = DDLCreateIndex, s.IndexStmt.Relation
	case *pg.Node_TruncateStmt:
		op = DDLTruncate
	case *pg.Node_VacuumStmt:
		op = DDLMaintain
	case *pg.Node_ClusterStmt:
		if s.ClusterStmt.Relation == nil {
			return false // every table clustered before: the catalog node's
		}
		op, target = DDLMaintain, s.ClusterStmt.Relation
	case *pg.Node_ReindexStmt:
		switch s.ReindexStmt.Kind {
		case pg.ReindexObjectType_REINDEX_OBJECT_INDEX:
			return indexCheck(pl, "REINDEX", s.ReindexStmt.Relation)
		case pg.ReindexObjectType_REINDEX_OBJECT_TABLE:
			op, target = DDLMaintain, s.ReindexStmt.Relation
		default:
			return false // a schema, the database or the system: the catalog node's
		}
	case *pg.Node_DropStmt:
		return p.dropDDL(pl, s.DropStmt)
	case *pg.Node_CreateStmt:
		return p.createReferencing(pl, n, s.CreateStmt, start, end)
	case *pg.Node_GrantStmt:
		return p.grantAllInSchema(pl, s.GrantStmt, start, end)
	default:
		return false
	}
	root, _ := nodeMessage(n)
	w := walkStmt(root)
	var tree *shardmap.Tree
	var ref *pg.RangeVar
	var other *pg.RangeVar
	for _, r := range w.rels {
		t, dbq := p.lookup(r.rv)
		switch {
		case t == nil:
			if other == nil {
				other = r.rv
			}
			continue
		case dbq:
			return p.refuse(pl, refused("Leave out the database name: "+qn(t.Name)+" or public."+qn(t.Name)+".",
				"%s names tree %s with a database qualifier, which the proxy cannot route", stmtName(n), qn(t.Name)))
		case tree != nil:
			return p.refuse(pl, refused("Change one tree per statement.",
				"%s names tree %s more than once, or more than one tree", stmtName(n), qn(tree.Name)))
		}
		tree, ref = t, r.rv
	}
	if tree == nil {
		return false
	}
	name := stmtName(n)
	if target != nil && target != ref {
		// A tree named elsewhere than as the changed table: a foreign key
		// REFERENCES tree, or INHERIT tree.
		return p.refuse(pl, refused("Keep the relationship in the application: rows of a tree live on many nodes.",
			"%s of %s refers to tree %s, which cannot be enforced across shards", name, relText(target), qn(tree.Name)))
	}
	if as := n.GetAlterTableStmt(); as != nil && other != nil {
		if err := checkAlter(tree, as); err != nil {
			return p.refuse(pl, err)
		}
	}
	if other != nil {
		return p.refuse(pl, refused("Change the tree in a statement that names no other table.",
			"%s on tree %s also names %s", name, qn(tree.Name), relText(other)))
	}
	d := &DDLPlan{Op: op}
	var err *sqlstate.Error
	switch s := n.Node.(type) {
	case *pg.Node_AlterTableStmt:
		err = checkAlter(tree, s.AlterTableStmt)
		d.Logged = true
	case *pg.Node_RenameStmt:
		err = checkRename(tree, s.RenameStmt)
		d.Logged = true
	case *pg.Node_AlterObjectSchemaStmt:
		err = refused("A tree keeps its schema (public): create a new tree in the schema you want and copy the rows.",
			"ALTER TABLE ... SET SCHEMA on tree %s is not supported", qn(tree.Name))
	case *pg.Node_IndexStmt:
		err = checkIndex(tree, s.IndexStmt)
		d.Concurrently, d.Logged = s.IndexStmt.Concurrent, true
	case *pg.Node_VacuumStmt, *pg.Node_ReindexStmt:
		d.Concurrently = true
	case *pg.Node_ClusterStmt:
		// USING marks the index to cluster on, as ALTER TABLE ... CLUSTER
		// ON does: logged as that, a shard made later gets the mark, and a
		// CLUSTER without USING finds it there too.
		d.Concurrently = true
		if ix := s.ClusterStmt.Indexname; ix != "" {
			d.Logged, d.log = true, "ALTER TABLE {{table}} CLUSTER ON "+quoteIdent(ix)
		}
	case *pg.Node_TruncateStmt:
		if len(s.TruncateStmt.Relations) != 1 {
			err = refused("Truncate the tree in a statement of its own.",
				"TRUNCATE of tree %s together with other tables is not supported", qn(tree.Name))
		}
	}
	if err != nil {
		return p.refuse(pl, err)
	}
	if strings.Contains(p.sql[start:end], "{{") {
		return p.refuse(pl, refused("Write the statement without \"{{\".",
			"%s on tree %s contains \"{{\", which the DDL log of a tree reserves", name, qn(tree.Name)))
	}
	spans, err := p.refSpans(route{tree: tree, rv: ref})
	var rd *renderer
	if err == nil {
		rd, err = p.renderer(tree, spans, start, end)
	}
	if err != nil {
		return p.refuse(pl, err)
	}
	if d.log == "" {
		d.log = strings.Join(rd.texts, "{{table}}")
	}
	if d.Concurrently {
		d.log = p.withoutConcurrently(d.log)
	}
	pl.Kind, pl.Tree, pl.DDL, pl.render = DDL, tree, d, rd
	pl.Tag = ddlTag(n)
	return true
}

func (p *planner) refuse(pl *Plan, e *sqlstate.Error) bool {
	pl.Kind, pl.Err = Refused, e
	return true
}

// withoutConcurrently drops the CONCURRENTLY keyword from a statement for
// the DDL log, which CreateShard replays inside a transaction.
func (p *planner) withoutConcurrently(sql string) string {
	toks, _, ok := scan(sql)
	if !ok {
		return sql
	}
	for _, t := range toks {
		if t.kind == pg.Token_CONCURRENTLY {
			return sql[:t.start] + strings.TrimLeft(sql[t.end:], " \t\n")
		}
	}
	return sql
}

func ddlTag(n *pg.Node) string {
	switch n.Node.(type) {
	case *pg.Node_IndexStmt:
		return "CREATE INDEX"
	case *pg.Node_TruncateStmt:
		return "TRUNCATE TABLE"
	case *pg.Node_VacuumStmt, *pg.Node_ReindexStmt, *pg.Node_ClusterStmt:
		return stmtName(n)
	}
	return "ALTER TABLE"
}

// checkAlter refuses ALTER TABLE subcommands that would break routing or
// the rules of a tree (docs/DESIGN.md section 2), and those not supported on trees.
func checkAlter(t *shardmap.Tree, s *pg.AlterTableStmt) *sqlstate.Error {
	for _, c := range s.Cmds {
		cmd := c.GetAlterTableCmd()
		if cmd == nil {
			continue
		}
		key := cmd.Name == t.KeyColumn
		switch cmd.Subtype {
		case pg.AlterTableType_AT_AddColumn:
			if err := checkColumnDef(t, cmd.Def.GetColumnDef()); err != nil {
				return err
			}
		case pg.AlterTableType_AT_DropColumn:
			if key {
				return keyChange(t, "drop")
			}
		case pg.AlterTableType_AT_AlterColumnType:
			if key {
				return keyChange(t, "change the type of")
			}
		case pg.AlterTableType_AT_ColumnDefault:
			if callsNextval(cmd.Def) {
				return sequenceDefault(t, cmd.Name)
			}
		case pg.AlterTableType_AT_AddConstraint:
			if err := checkConstraint(t, cmd.Def.GetConstraint()); err != nil {
				return err
			}
		case pg.AlterTableType_AT_AddIdentity, pg.AlterTableType_AT_SetIdentity:
			return sequenceDefault(t, cmd.Name)
		case pg.AlterTableType_AT_SetNotNull, pg.AlterTableType_AT_DropNotNull,
			pg.AlterTableType_AT_DropConstraint, pg.AlterTableType_AT_ValidateConstraint,
			pg.AlterTableType_AT_AlterConstraint, pg.AlterTableType_AT_SetStatistics,
			pg.AlterTableType_AT_SetStorage, pg.AlterTableType_AT_SetCompression,
			pg.AlterTableType_AT_SetOptions, pg.AlterTableType_AT_ResetOptions,
			pg.AlterTableType_AT_SetRelOptions, pg.AlterTableType_AT_ResetRelOptions,
			pg.AlterTableType_AT_DropExpression, pg.AlterTableType_AT_CookedColumnDefault:
		default:
			what := strings.TrimPrefix(cmd.Subtype.String(), "AT_")
			return refused("Supported on a tree: ADD/DROP COLUMN, ALTER COLUMN TYPE/SET DEFAULT/DROP DEFAULT/SET NOT NULL/DROP NOT NULL/SET STATISTICS/SET STORAGE, ADD/DROP/VALIDATE CONSTRAINT, RENAME COLUMN/CONSTRAINT, SET/RESET (storage parameters).",
				"ALTER TABLE on tree %s: subcommand %s is not supported", qn(t.Name), camelWords(what))
		}
	}
	return nil
}

func keyChange(t *shardmap.Tree, what string) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
		Message: fmt.Sprintf("cannot %s shard key column %s of tree %s", what, qn(t.KeyColumn), qn(t.Name)),
		Detail:  "Every row's shard is computed from the key column's value and type.",
		Hint:    "Create a new table with the key you want, make it a tree with lattice_create_tree, and copy the rows."}
}

func sequenceDefault(t *shardmap.Tree, col string) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
		Message: fmt.Sprintf("column %s of tree %s cannot take its values from a sequence or identity", qn(col), qn(t.Name)),
		Detail:  "Each shard would draw from its own sequence and hand out the same values twice.",
		Hint:    "Supply the values from the application, or use uuid with DEFAULT gen_random_uuid()."}
}

// checkColumnDef checks a column added to a tree.
func checkColumnDef(t *shardmap.Tree, cd *pg.ColumnDef) *sqlstate.Error {
	if cd == nil {
		return nil
	}
	if tn := cd.TypeName; tn != nil && len(tn.Names) > 0 {
		switch strings.ToLower(tn.Names[len(tn.Names)-1].GetString_().GetSval()) {
		case "serial", "serial2", "serial4", "serial8", "smallserial", "bigserial":
			return sequenceDefault(t, cd.Colname)
		}
	}
	for _, cn := range cd.Constraints {
		c := cn.GetConstraint()
		if c == nil {
			continue
		}
		switch c.Contype {
		case pg.ConstrType_CONSTR_IDENTITY:
			return sequenceDefault(t, cd.Colname)
		case pg.ConstrType_CONSTR_DEFAULT:
			if callsNextval(c.RawExpr) {
				return sequenceDefault(t, cd.Colname)
			}
		case pg.ConstrType_CONSTR_UNIQUE, pg.ConstrType_CONSTR_PRIMARY:
			return uniqueWithoutKey(t, "unique constraint on column "+qn(cd.Colname))
		case pg.ConstrType_CONSTR_FOREIGN:
			return foreignKey(t)
		}
	}
	return nil
}

func uniqueWithoutKey(t *shardmap.Tree, what string) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.InvalidTableDefinition,
		Message: fmt.Sprintf("%s of tree %s does not include the shard key column %s", what, qn(t.Name), qn(t.KeyColumn)),
		Detail:  "Each shard enforces uniqueness only for its own rows.",
		Hint:    "Add " + qn(t.KeyColumn) + " to the key columns."}
}

func foreignKey(t *shardmap.Tree) *sqlstate.Error {
	return refused("A tree may reference a colocated tree on both shard keys, or a reference table: make the referencing table a tree colocated with "+qn(t.Name)+" (colocate_with), then ALTER TABLE ... ADD FOREIGN KEY (key, ...) REFERENCES ... (key, ...) in a statement of its own.",
		"foreign keys from or to tree %s are not supported in this form: they cannot be enforced across shards", qn(t.Name))
}

// checkConstraint checks a constraint added to a tree.
func checkConstraint(t *shardmap.Tree, c *pg.Constraint) *sqlstate.Error {
	if c == nil {
		return nil
	}
	switch c.Contype {
	case pg.ConstrType_CONSTR_UNIQUE, pg.ConstrType_CONSTR_PRIMARY:
		if c.Indexname != "" {
			return refused("Name the columns: ADD CONSTRAINT ... UNIQUE ("+t.KeyColumn+", ...).",
				"ADD CONSTRAINT ... USING INDEX on tree %s is not supported", qn(t.Name))
		}
		for _, k := range c.Keys {
			if k.GetString_().GetSval() == t.KeyColumn {
				return nil
			}
		}
		what := "unique constraint " + qn(c.Conname)
		switch {
		case c.Contype == pg.ConstrType_CONSTR_PRIMARY:
			what = "primary key"
		case c.Conname == "":
			what = "unique constraint"
		}
		return uniqueWithoutKey(t, what)
	case pg.ConstrType_CONSTR_EXCLUSION:
		for _, e := range c.Exclusions {
			l := e.GetList()
			if l == nil || len(l.Items) != 2 {
				continue
			}
			ie := l.Items[0].GetIndexElem()
			ops := l.Items[1].GetList()
			if ie != nil && ie.Name == t.KeyColumn && ops != nil && len(ops.Items) > 0 &&
				ops.Items[len(ops.Items)-1].GetString_().GetSval() == "=" {
				return nil
			}
		}
		return &sqlstate.Error{Code: sqlstate.InvalidTableDefinition,
			Message: fmt.Sprintf("exclusion constraint %s of tree %s does not compare the shard key column %s with =", qn(c.Conname), qn(t.Name), qn(t.KeyColumn)),
			Detail:  "Each shard enforces an exclusion constraint only among its own rows.",
			Hint:    "Add " + qn(t.KeyColumn) + " WITH = to the constraint."}
	case pg.ConstrType_CONSTR_FOREIGN:
		return foreignKey(t)
	case pg.ConstrType_CONSTR_DEFAULT:
		if callsNextval(c.RawExpr) {
			return sequenceDefault(t, "")
		}
	}
	return nil
}

// checkIndex checks CREATE INDEX on a tree.
func checkIndex(t *shardmap.Tree, s *pg.IndexStmt) *sqlstate.Error {
	if !s.Unique && !s.Primary {
		return nil
	}
	for _, p := range s.IndexParams {
		if ie := p.GetIndexElem(); ie != nil && ie.Name == t.KeyColumn {
			return nil
		}
	}
	what := "unique index"
	if s.Idxname != "" {
		what += " " + qn(s.Idxname)
	}
	return uniqueWithoutKey(t, what)
}

// checkRename allows renaming a column other than the key, and a constraint.
func checkRename(t *shardmap.Tree, s *pg.RenameStmt) *sqlstate.Error {
	switch s.RenameType {
	case pg.ObjectType_OBJECT_COLUMN:
		if s.Subname == t.KeyColumn {
			return keyChange(t, "rename")
		}
		return nil
	case pg.ObjectType_OBJECT_TABCONSTRAINT:
		return nil
	case pg.ObjectType_OBJECT_TABLE:
		return refused("Keep the tree's name: create a new table with the name you want, make it a tree and copy the rows.",
			"ALTER TABLE ... RENAME TO on tree %s is not supported", qn(t.Name))
	}
	return refused("", "%s on tree %s is not supported", "ALTER "+objectWord(s.RenameType)+" ... RENAME", qn(t.Name))
}

// callsNextval reports whether an expression calls nextval anywhere.
func callsNextval(n *pg.Node) bool {
	if n == nil {
		return false
	}
	found := false
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if found {
			return
		}
		if fc, ok := m.Interface().(*pg.FuncCall); ok && len(fc.Funcname) > 0 &&
			strings.EqualFold(fc.Funcname[len(fc.Funcname)-1].GetString_().GetSval(), "nextval") {
			found = true
			return
		}
		eachChild(m, visit)
	}
	visit(n.ProtoReflect())
	return found
}

// dropDDL plans DROP TABLE of a tree and DROP INDEX of public indexes.
func (p *planner) dropDDL(pl *Plan, d *pg.DropStmt) bool {
	switch d.RemoveType {
	case pg.ObjectType_OBJECT_TABLE:
		t := p.droppedTree(d)
		if t == nil {
			return false
		}
		if len(d.Objects) != 1 {
			return p.refuse(pl, refused("Drop the tree in a statement of its own.",
				"DROP TABLE of tree %s together with other tables is not supported", qn(t.Name)))
		}
		pl.Kind, pl.Tree, pl.Tag = DDL, t, "DROP TABLE"
		pl.DDL = &DDLPlan{Op: DDLDropTable, Cascade: d.Behavior == pg.DropBehavior_DROP_CASCADE}
		return true
	case pg.ObjectType_OBJECT_INDEX:
		if len(d.Objects) != 1 {
			var names []string
			for _, o := range d.Objects {
				if n, ok := publicName(o.GetList()); ok {
					names = append(names, n)
				}
			}
			if len(names) == 0 {
				return false
			}
			pl.Kind, pl.Tag, pl.DDL = DDL, "DROP INDEX", &DDLPlan{Op: DDLIndexCheck, Indexes: names}
			return true
		}
		l := d.Objects[0].GetList()
		if l == nil || len(l.Items) == 0 || len(l.Items) > 2 {
			return false
		}
		if len(l.Items) == 2 && l.Items[0].GetString_().GetSval() != "public" {
			return false
		}
		idx := l.Items[len(l.Items)-1].GetString_().GetSval()
		var b strings.Builder
		b.WriteString("DROP INDEX ")
		if d.Concurrent {
			b.WriteString("CONCURRENTLY ")
		}
		if d.MissingOk {
			b.WriteString("IF EXISTS ")
		}
		b.WriteString("{{schema}}." + quoteIdent(idx))
		if d.Behavior == pg.DropBehavior_DROP_CASCADE {
			b.WriteString(" CASCADE")
		}
		dp := &DDLPlan{Op: DDLDropIndex, Index: idx, Indexes: []string{idx}, Concurrently: d.Concurrent,
			Cascade: d.Behavior == pg.DropBehavior_DROP_CASCADE, Logged: true, drop: b.String()}
		dp.log = strings.Replace(dp.drop, "CONCURRENTLY ", "", 1)
		pl.Kind, pl.Tag, pl.DDL = DDL, "DROP INDEX", dp
		return true
	}
	return false
}

// publicName returns the name of a public or unqualified object.
func publicName(l *pg.List) (string, bool) {
	if l == nil || len(l.Items) == 0 || len(l.Items) > 2 {
		return "", false
	}
	if len(l.Items) == 2 && l.Items[0].GetString_().GetSval() != "public" {
		return "", false
	}
	return l.Items[len(l.Items)-1].GetString_().GetSval(), true
}

// indexCheck plans a statement on an index the router cannot tell is a
// tree's (DDLIndexCheck).
func indexCheck(pl *Plan, tag string, rv *pg.RangeVar) bool {
	if rv == nil || rv.Catalogname != "" || rv.Schemaname != "" && rv.Schemaname != "public" {
		return false
	}
	pl.Kind, pl.Tag, pl.DDL = DDL, tag, &DDLPlan{Op: DDLIndexCheck, Indexes: []string{rv.Relname}}
	return true
}
