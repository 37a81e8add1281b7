package router

import (
	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// A shard's tables live in a schema lattice_sNNNN of the tenant's database
// (shardmap.SchemaName), where the tenant's role may name them. Read, they
// are a diagnostic: what one shard holds. Written or changed directly,
// they bypass the map: a row whose key's slot the shard does not own is
// found by no routed statement and may duplicate a key another shard
// holds, a key changed in place stays on the wrong shard, and a column,
// index or trigger changed on one shard's table breaks the statements over
// the tree or the migrations that move its rows. So a statement that
// writes a shard table, or any statement but a read, a VACUUM or an
// ANALYZE that names a shard schema, is refused, wherever that appears in
// it.

// shardTableStatement returns the refusal of a statement that writes a
// shard table or changes a shard schema, or nil.
func shardTableStatement(n *pg.Node) *sqlstate.Error {
	// byWrites: a read, a write or a VACUUM may name a shard schema; only
	// the tables it writes are judged.
	byWrites := false
	switch n.Node.(type) {
	case *pg.Node_SelectStmt, *pg.Node_InsertStmt, *pg.Node_UpdateStmt, *pg.Node_DeleteStmt, *pg.Node_MergeStmt,
		*pg.Node_CopyStmt, *pg.Node_ExplainStmt, *pg.Node_DeclareCursorStmt, *pg.Node_PrepareStmt,
		*pg.Node_VacuumStmt:
		byWrites = true
	}
	var bad string
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if bad != "" {
			return
		}
		switch v := m.Interface().(type) {
		case *pg.A_Const:
			return // a literal's text names nothing
		case *pg.RangeVar:
			if !byWrites && shardmap.IsSchemaName(v.Schemaname) {
				bad = v.Schemaname + "." + v.Relname
			}
		case *pg.String:
			// DROP SCHEMA, DROP TABLE s.t and other lists of names.
			if !byWrites && shardmap.IsSchemaName(v.Sval) {
				bad = v.Sval
			}
		case *pg.CreateSchemaStmt:
			if shardmap.IsSchemaName(v.Schemaname) {
				bad = v.Schemaname
			}
		case *pg.AlterObjectSchemaStmt:
			if shardmap.IsSchemaName(v.Newschema) {
				bad = v.Newschema
			}
		case *pg.InsertStmt:
			bad = writtenShardTable(v.Relation)
		case *pg.UpdateStmt:
			bad = writtenShardTable(v.Relation)
		case *pg.DeleteStmt:
			bad = writtenShardTable(v.Relation)
		case *pg.MergeStmt:
			bad = writtenShardTable(v.Relation)
		case *pg.CopyStmt:
			if v.IsFrom {
				bad = writtenShardTable(v.Relation)
			}
		}
		if bad == "" {
			eachChild(m, visit)
		}
	}
	visit(n.ProtoReflect())
	if bad == "" {
		return nil
	}
	return denied("Write through the tree (INSERT INTO, UPDATE, DELETE, COPY FROM STDIN and DDL on its name): the proxy routes each row to the shard of its key and changes every shard's table alike. A shard's tables may be read by name; an operator repairs one on its node directly.",
		"permission denied for %s: the tables of a shard schema are written and changed only through their tree", bad)
}

// writtenShardTable names rv when it is a shard table, or is "".
func writtenShardTable(rv *pg.RangeVar) string {
	if rv == nil || !shardmap.IsSchemaName(rv.Schemaname) {
		return ""
	}
	return rv.Schemaname + "." + rv.Relname
}
