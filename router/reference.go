package router

import (
	"slices"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Statements that name reference tables and no tree (docs/DESIGN.md,
// "Reference tables"). Every node holds the same rows, so:
//
//   - a read of reference tables alone runs on any one copy: Catalog with
//     Anywhere, which follows the session's transaction to its node and
//     otherwise goes to the catalog node; a read that locks rows (FOR
//     UPDATE/SHARE), or that also names an ordinary table, goes to the
//     catalog node, whose copy every write also takes;
//   - a write (INSERT, UPDATE, DELETE, TRUNCATE) or DDL of a reference
//     table is RefWrite: the statement runs unchanged on every copy, in one
//     transaction across nodes;
//   - what the copies would compute differently is refused: a write that
//     reads an ordinary table (the other nodes have none), or that calls a
//     function whose value differs by node or by call (now(), random(),
//     nextval() ...), a dropped reference table (turn it back into an
//     ordinary table first).

// perNode are functions whose result differs between the nodes that run
// one statement: time, randomness, sequences, the backend itself.
var perNode = map[string]bool{
	"now": true, "clock_timestamp": true, "statement_timestamp": true, "transaction_timestamp": true,
	"timeofday": true, "random": true, "random_normal": true, "setseed": true, "gen_random_uuid": true,
	"uuid_generate_v1": true, "uuid_generate_v1mc": true, "uuid_generate_v4": true,
	"nextval": true, "currval": true, "lastval": true, "setval": true,
	"txid_current": true, "pg_current_xact_id": true, "pg_backend_pid": true,
	"inet_server_addr": true, "inet_server_port": true, "pg_postmaster_start_time": true,
}

// PerNodeValue is the first call in the statement or expression sql whose
// value could differ between the nodes that run it ("" for none): the
// functions of perNode, CURRENT_TIMESTAMP and its kin, and serial or
// identity columns. lattice_create_reference_table checks the table's
// column defaults with it.
func PerNodeValue(sql string) string {
	res, err := pg.Parse(sql)
	if err != nil {
		return ""
	}
	for _, s := range res.Stmts {
		if f := perNodeCall(s.Stmt); f != "" {
			return f
		}
	}
	return ""
}

func perNodeCall(n *pg.Node) string {
	found := ""
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if found != "" {
			return
		}
		switch v := m.Interface().(type) {
		case *pg.FuncCall:
			if len(v.Funcname) > 0 {
				if name := strings.ToLower(v.Funcname[len(v.Funcname)-1].GetString_().GetSval()); perNode[name] {
					found = name + "()"
					return
				}
			}
		case *pg.SQLValueFunction:
			switch v.Op {
			case pg.SQLValueFunctionOp_SVFOP_CURRENT_DATE, pg.SQLValueFunctionOp_SVFOP_CURRENT_TIME, pg.SQLValueFunctionOp_SVFOP_CURRENT_TIME_N,
				pg.SQLValueFunctionOp_SVFOP_CURRENT_TIMESTAMP, pg.SQLValueFunctionOp_SVFOP_CURRENT_TIMESTAMP_N,
				pg.SQLValueFunctionOp_SVFOP_LOCALTIME, pg.SQLValueFunctionOp_SVFOP_LOCALTIME_N,
				pg.SQLValueFunctionOp_SVFOP_LOCALTIMESTAMP, pg.SQLValueFunctionOp_SVFOP_LOCALTIMESTAMP_N:
				found = "CURRENT_TIMESTAMP"
				return
			}
		case *pg.TypeName:
			if len(v.Names) > 0 {
				switch t := strings.ToLower(v.Names[len(v.Names)-1].GetString_().GetSval()); t {
				case "serial", "serial2", "serial4", "serial8", "smallserial", "bigserial":
					found = t
					return
				}
			}
		case *pg.Constraint:
			if v.Contype == pg.ConstrType_CONSTR_IDENTITY {
				found = "GENERATED AS IDENTITY"
				return
			}
		case *pg.AlterTableCmd:
			if v.Subtype == pg.AlterTableType_AT_AddIdentity || v.Subtype == pg.AlterTableType_AT_SetIdentity {
				found = "GENERATED AS IDENTITY"
				return
			}
		}
		eachChild(m, visit)
	}
	visit(n.ProtoReflect())
	return found
}

// referenceRoute routes a statement that names reference tables refs and
// no tree. written is a reference table it writes (INSERT, UPDATE or
// DELETE target), ordinary the first table it names that is neither.
func (p *planner) referenceRoute(n *pg.Node, name string, refs []string, written, ordinary *pg.RangeVar) route {
	var cp *CopySpec // COPY FROM STDIN
	ref := written
	if ref == nil {
		ref = &pg.RangeVar{Relname: refs[0]}
	}
	switch s := n.Node.(type) {
	case *pg.Node_SelectStmt:
		if written == nil {
			sel := s.SelectStmt
			return route{kind: Catalog, refs: refs, anywhere: ordinary == nil && sel.IntoClause == nil && !locks(sel)}
		}
	case *pg.Node_InsertStmt, *pg.Node_UpdateStmt, *pg.Node_DeleteStmt:
		if written == nil {
			return route{kind: Catalog, refs: refs} // an ordinary table written from a reference table
		}
	case *pg.Node_CopyStmt:
		c := s.CopyStmt
		if !c.IsFrom {
			return route{kind: Catalog, refs: refs}
		}
		// The rows go unchanged to every copy (proxy/refcopy.go); the
		// options only need to be valid. A server file is refused before
		// (guard.go).
		cp = &CopySpec{From: true}
		if _, err := cp.parseOptions(c.Options); err != nil {
			return refusedRoute(err)
		}
	case *pg.Node_AlterObjectSchemaStmt:
		return refusedRoute(refused("A reference table stays in public; turn it back into an ordinary table first (lattice_undistribute_table).",
			"%s on reference table %s is not supported", name, qn(ref.Relname)))
	case *pg.Node_AlterTableStmt, *pg.Node_RenameStmt, *pg.Node_IndexStmt, *pg.Node_TruncateStmt,
		*pg.Node_CreateTrigStmt, *pg.Node_RuleStmt, *pg.Node_CreatePolicyStmt, *pg.Node_AlterPolicyStmt,
		*pg.Node_GrantStmt, *pg.Node_CreateStatsStmt:
		if ix := n.GetIndexStmt(); ix != nil && ix.Concurrent {
			return refusedRoute(refused("Create the index without CONCURRENTLY: a reference table is small, and its DDL runs on every node in one transaction.",
				"CREATE INDEX CONCURRENTLY on reference table %s is not supported", qn(ref.Relname)))
		}
	default:
		return route{kind: Catalog, refs: refs} // LOCK, VACUUM, CREATE TABLE ... REFERENCES: the catalog node's copy
	}
	if ordinary != nil {
		return refusedRoute(refused("Change the reference table in a statement that names no ordinary table: the other nodes have only the reference tables.",
			"%s of reference table %s also names %s, which only the catalog node holds", name, qn(ref.Relname), relText(ordinary)))
	}
	if f := perNodeCall(n); f != "" {
		return refusedRoute(refused("Compute the value in the application (or in a statement of its own) and give it as a literal or a $n parameter.",
			"%s of reference table %s uses %s, whose value would differ between the nodes that hold its copies", name, qn(ref.Relname), f))
	}
	return route{kind: RefWrite, refs: refs, cp: cp}
}

// locks reports whether a SELECT takes row locks (FOR UPDATE/SHARE).
func locks(s *pg.SelectStmt) bool {
	return len(s.LockingClause) > 0 || s.Larg != nil && locks(s.Larg) || s.Rarg != nil && locks(s.Rarg)
}

// droppedReference is the first reference table DROP TABLE (or DROP of a
// trigger, rule or policy on it) names, "" if none; ok reports that the
// table itself is dropped.
func (p *planner) droppedReference(d *pg.DropStmt) (name string, table bool) {
	rels, on := droppedRelations(d)
	if !on && d.RemoveType != pg.ObjectType_OBJECT_TABLE {
		return "", false
	}
	for _, rv := range rels {
		if p.isReference(rv) {
			return rv.Relname, !on
		}
	}
	return "", false
}

// dropReference routes a DROP that names a reference table.
func (p *planner) dropReference(d *pg.DropStmt) (route, bool) {
	name, table := p.droppedReference(d)
	switch {
	case name == "":
		return route{}, false
	case table:
		return refusedRoute(refused("Turn it back into an ordinary table first (SELECT lattice_undistribute_table('"+strings.ReplaceAll(name, "'", "''")+"')), then drop it.",
			"DROP TABLE of reference table %s is not supported", qn(name))), true
	case len(d.Objects) > 1:
		return refusedRoute(refused("Drop one object per statement.", "DROP of several objects with one on reference table %s is not supported", qn(name))), true
	}
	return route{kind: RefWrite, refs: []string{name}}, true
}

// referenceNodes is where a RefWrite runs: every node that holds a copy of
// every reference table it names, which must be all the nodes holding the
// one it writes.
func referenceNodes(holders [][]string, names []string) ([]string, *sqlstate.Error) {
	if len(holders) == 0 || len(holders[0]) == 0 {
		return nil, &sqlstate.Error{Code: sqlstate.ObjectNotInPrerequisiteState,
			Message: "reference table " + qn(names[0]) + " has no copy registered on any node",
			Hint:    "Make it a reference table again with lattice_create_reference_table."}
	}
	nodes := slices.Clone(holders[0])
	for i, h := range holders[1:] {
		for _, n := range nodes {
			if !slices.Contains(h, n) {
				return nil, &sqlstate.Error{Code: sqlstate.ObjectNotInPrerequisiteState,
					Message: "reference table " + qn(names[i+1]) + " has no copy on node " + qn(n) + " yet",
					Hint:    "Retry once the node has been given its copy (lattice_add_node copies the reference tables)."}
			}
		}
	}
	return nodes, nil
}

// resolveRefWrite targets every node that holds the copies.
func resolveRefWrite(v *shardmap.View, p *Plan) (*Routing, error) {
	holders := make([][]string, len(p.References))
	for i, name := range p.References {
		r := v.References[name]
		if r == nil {
			return nil, &sqlstate.Error{Code: sqlstate.SlotMoved,
				Message: "table " + qn(name) + " is no longer a reference table",
				Hint:    "Retry the statement: the proxy reads the tables again."}
		}
		holders[i] = r.Nodes
	}
	nodes, err := referenceNodes(holders, p.References)
	if err != nil {
		return nil, err
	}
	r := &Routing{Limit: -1, PerNode: -1}
	for _, n := range nodes {
		r.Targets = append(r.Targets, Target{Node: n, Shard: -1, SQL: p.SQL})
	}
	return r, nil
}

// copiesOn refuses a statement on a tree that reads reference tables when
// a node it runs on has no copy of one of them yet (a node being given its
// copies), rather than let that node answer from a table it lacks.
func copiesOn(v *shardmap.View, p *Plan, r *Routing) *sqlstate.Error {
	for _, name := range p.References {
		ref := v.References[name]
		for _, t := range r.Targets {
			if ref == nil || !ref.Holds(t.Node) {
				return &sqlstate.Error{Code: sqlstate.ObjectNotInPrerequisiteState,
					Message: "reference table " + qn(name) + " has no copy on node " + qn(t.Node) + " yet",
					Hint:    "Retry once the node has been given its copy (it gets one before its first shard)."}
			}
		}
	}
	return nil
}
