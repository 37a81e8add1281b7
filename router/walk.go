package router

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// relRef is one RangeVar of a statement.
type relRef struct {
	rv     *pg.RangeVar
	nested bool // inside a subquery, a CTE, a set-operation arm or a nested DML statement
	cte    bool // an unqualified name of a CTE in scope: not a table
	target bool // the target of INSERT/UPDATE/DELETE/MERGE
}

// walker collects, from a whole statement, every RangeVar that names a
// relation, every column reference with three or more parts (which may
// schema-qualify a table: public.catalogue.sku), and every call of a
// lattice_* function. It follows CTE scoping so that a CTE named like a
// tree is not taken for the tree.
type walker struct {
	root    proto.Message // the statement whose top level is being analysed
	rootSrc proto.Message // the VALUES SelectStmt of a root INSERT: part of the top level
	rels    []relRef
	cols    []*pg.ColumnRef
	lattice []*pg.FuncCall
	scope   []string // CTE names visible here
}

func walkStmt(root proto.Message) *walker {
	w := &walker{root: root}
	if ins, ok := root.(*pg.InsertStmt); ok && ins.SelectStmt != nil {
		if sel := ins.SelectStmt.GetSelectStmt(); sel != nil && len(sel.ValuesLists) > 0 {
			w.rootSrc = sel
		}
	}
	w.msg(root.ProtoReflect(), false)
	return w
}

func (w *walker) node(n *pg.Node, nested bool) {
	if n != nil {
		w.msg(n.ProtoReflect(), nested)
	}
}

func (w *walker) msg(m protoreflect.Message, nested bool) {
	switch v := m.Interface().(type) {
	case *pg.RangeVar:
		w.addRel(relRef{rv: v, nested: nested, cte: v.Schemaname == "" && v.Catalogname == "" && w.inScope(v.Relname)})
		return
	case *pg.ColumnRef:
		if len(v.Fields) >= 3 {
			for _, c := range w.cols {
				if c.Location == v.Location {
					return
				}
			}
			w.cols = append(w.cols, v)
		}
		return
	case *pg.FuncCall:
		if isLatticeName(v.Funcname) {
			dup := false
			for _, f := range w.lattice {
				dup = dup || f.Location == v.Location
			}
			if !dup {
				w.lattice = append(w.lattice, v)
			}
		}
	case *pg.LockingClause:
		// FOR UPDATE OF x names FROM items (aliases), not relations.
		return
	case *pg.SelectStmt:
		if proto.Message(v) != w.root && proto.Message(v) != w.rootSrc {
			nested = true
		}
		w.withStmt(m, v.WithClause, nil, nested)
		return
	case *pg.InsertStmt:
		w.dml(m, v, v.WithClause, v.Relation, nested)
		return
	case *pg.UpdateStmt:
		w.dml(m, v, v.WithClause, v.Relation, nested)
		return
	case *pg.DeleteStmt:
		w.dml(m, v, v.WithClause, v.Relation, nested)
		return
	case *pg.MergeStmt:
		w.dml(m, v, v.WithClause, v.Relation, nested)
		return
	}
	w.children(m, nested, "", "")
}

func (w *walker) dml(m protoreflect.Message, v proto.Message, with *pg.WithClause, rel *pg.RangeVar, nested bool) {
	if v != w.root {
		nested = true
	}
	w.withStmt(m, with, rel, nested)
}

// withStmt walks a query statement: its WITH list first (each CTE body is
// nested; a non-recursive CTE is visible to later CTEs and to the body, a
// recursive WITH makes all of them visible everywhere), then the target
// relation, then everything else.
func (w *walker) withStmt(m protoreflect.Message, with *pg.WithClause, target *pg.RangeVar, nested bool) {
	base := len(w.scope)
	if with != nil {
		if with.Recursive {
			for _, c := range with.Ctes {
				w.scope = append(w.scope, c.GetCommonTableExpr().GetCtename())
			}
		}
		for _, c := range with.Ctes {
			cte := c.GetCommonTableExpr()
			if cte == nil {
				continue
			}
			w.node(cte.Ctequery, true)
			if !with.Recursive {
				w.scope = append(w.scope, cte.Ctename)
			}
		}
	}
	if target != nil {
		w.addRel(relRef{rv: target, nested: nested, target: true})
	}
	var skip2 protoreflect.Name
	if target != nil {
		skip2 = "relation"
	}
	w.children(m, nested, "with_clause", skip2)
	w.scope = w.scope[:base]
}

func (w *walker) children(m protoreflect.Message, nested bool, skip1, skip2 protoreflect.Name) {
	rangeFields(m, func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() {
			return true
		}
		if n := fd.Name(); n == skip1 || n == skip2 {
			return true
		}
		if fd.IsList() {
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				w.msg(l.Get(i).Message(), nested)
			}
			return true
		}
		w.msg(v.Message(), nested)
		return true
	})
}

func (w *walker) addRel(r relRef) {
	for _, o := range w.rels {
		if o.rv.Location == r.rv.Location && o.rv.Relname == r.rv.Relname {
			return // the same token reached twice (a multi-assignment's shared source)
		}
	}
	w.rels = append(w.rels, r)
}

func (w *walker) inScope(name string) bool {
	for _, s := range w.scope {
		if s == name {
			return true
		}
	}
	return false
}

// isLatticeName reports whether a function name's last part starts with
// lattice_, the prefix reserved for the proxy's own functions.
func isLatticeName(names []*pg.Node) bool {
	if len(names) == 0 {
		return false
	}
	return strings.HasPrefix(strings.ToLower(names[len(names)-1].GetString_().GetSval()), "lattice_")
}
