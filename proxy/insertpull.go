package proxy

import (
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// An INSERT ... SELECT into a tree whose SELECT reads no tree
// (router/insertpull.go) runs in two steps inside the load's transaction on
// the catalog node: the SELECT there, its rows held in the proxy in COPY's
// text format, then those rows loaded as a COPY FROM STDIN is (copy.go).
// A SELECT that reads other trees (router.CopySpec.Source) is read the same
// way from the nodes its own routing names, each in the load's
// transaction, under the view the statement holds: a shard being split is
// read through its filter, and no migration removes rows the statement
// may still read until it ends.
// The rows are held until the SELECT ends because the catalog node's
// backend may also take rows for its shards. They are charged to
// --max-message-memory, the bound of what the proxy holds for clients.
//
// With ON CONFLICT, each shard's rows go at the end as one INSERT ... VALUES
// under the clause (copyTextValues, router.CopySpec.RenderUpsert).
//
// Values pass through their text form, as with COPY: PostgreSQL's INSERT
// would apply an assignment cast instead, so a value whose text the column
// type does not accept (2.5 into an integer) fails the statement where
// INSERT would round it.

// pullSource is what the SELECT of one INSERT ... SELECT needs from the
// client's statement: its text and parameter types (to learn the types
// PostgreSQL gives the parameters in the INSERT) and the Bind's values.
type pullSource struct {
	sql     string
	oids    []uint32
	params  [][]byte
	formats []int16
	view    *shardmap.View // the statement's, to route a SELECT that reads trees
}

// newPullSource copies what the pull needs from the statement and its Bind,
// or returns nil when st is not loaded from a SELECT.
func newPullSource(st *clientStmt, m *pgproto3.Bind) *pullSource {
	if st.plan == nil || st.plan.Copy == nil || st.plan.Copy.Select == "" {
		return nil
	}
	ps := &pullSource{sql: st.sql, oids: slices.Clone(st.oids)}
	if m != nil {
		ps.formats = slices.Clone(m.ParameterFormatCodes)
		for _, v := range m.Parameters {
			ps.params = append(ps.params, slices.Clone(v))
		}
	}
	return ps
}

// playInsertPull runs an INSERT ... SELECT loaded through the proxy.
func (s *session) playInsertPull(x *exchange, ci *copyIn) error {
	budget := s.srv.cfg.Startup.Budget
	var held int64
	defer func() { budget.give(held) }()
	var rows []byte
	var src *copyNode
	if ci.plan.Copy.Source == nil || len(ci.pull.params) > 0 {
		// The SELECT runs there, or the parameters are typed there; a
		// SELECT that reads trees leaves the catalog node out otherwise.
		if src = ci.node(s, s.srv.catalogNode); src != nil {
			ci.settle(s, src)
		}
	}
	if ci.err == nil && len(ci.pull.params) > 0 {
		ci.paramTypes(s, src)
	}
	if ci.err == nil {
		rows, held = ci.pullRows(s, src, budget)
	}
	if ci.err == nil && ci.spec.Conflict != "" {
		// Each shard's rows wait in a buffer of their own until its one
		// statement: the rows are held twice.
		if n := int64(len(rows)); budget.take(n) {
			held += n
		} else {
			ci.setErr(pullOverBudget(ci, budget, len(rows), "With ON CONFLICT the proxy also holds each shard's rows until it writes them: the rows are held twice."))
		}
	}
	if ci.err == nil {
		rp := newRowParser(ci.spec, ci.plan.Tree.KeyColumn)
		rp.adopt(rows)
		ci.route(s, rp, true)
	}
	return s.endCopyIn(x, ci, "INSERT 0 ")
}

// pullOverBudget is the error of rows that pass --max-message-memory.
func pullOverBudget(ci *copyIn, budget *Budget, read int, detail string) *sqlstate.Error {
	e := sqlstate.New(sqlstate.OutOfMemory, "out of memory: the rows of INSERT ... SELECT into tree %q pass what the proxy holds for clients (%d bytes, the --max-message-memory limit)", ci.plan.Tree.Name, budget.limit)
	e.Detail = fmt.Sprintf("%s %d bytes of rows were read.", detail, read)
	e.Hint = "Insert the rows in smaller ranges, load them with COPY FROM STDIN, or raise --max-message-memory."
	return e
}

// settle reads the results of what was queued on cn before the SELECT (the
// session's settings, BEGIN).
func (ci *copyIn) settle(s *session, cn *copyNode) {
	for cn.pending > 0 && ci.err == nil && !cn.be.Broken() {
		ci.readResult(s, cn)
	}
}

// paramTypes learns the types PostgreSQL gives the parameters of the whole
// INSERT, which the client bound its values for: alone, the SELECT could
// type them otherwise, or not at all.
func (ci *copyIn) paramTypes(s *session, cn *copyNode) {
	be := cn.be
	be.Send(&pgproto3.Parse{Query: ci.pull.sql, ParameterOIDs: ci.pull.oids})
	be.Send(&pgproto3.Describe{ObjectType: 'S'})
	be.Send(&pgproto3.Sync{})
	cn.pending++
	ci.readReply(s, cn, func(m pgproto3.BackendMessage) {
		if d, ok := m.(*pgproto3.ParameterDescription); ok {
			ci.pull.oids = slices.Clone(d.ParameterOIDs)
		}
	})
}

// pullRows runs the SELECT, on the catalog node's cn or, when it reads
// trees, on each node its routing names, and returns its rows in COPY's
// text format with the bytes charged to budget for them.
func (ci *copyIn) pullRows(s *session, catalog *copyNode, budget *Budget) (rows []byte, held int64) {
	src := ci.plan.Copy.Source
	if src == nil {
		return ci.selectRows(s, catalog, ci.plan.Copy.Select, nil, 0, budget)
	}
	bind := &pgproto3.Bind{Parameters: ci.pull.params, ParameterFormatCodes: ci.pull.formats}
	r, err := router.Resolve(ci.pull.view, src, routerBind(bind, ci.pull.oids))
	if err != nil {
		ci.setErr(err)
		return nil, 0
	}
	for _, t := range r.Targets {
		cn := ci.node(s, t.Node)
		if cn == nil {
			break
		}
		ci.settle(s, cn)
		if ci.err != nil {
			break
		}
		rows, held = ci.selectRows(s, cn, t.SQL, rows, held, budget)
		if ci.err != nil {
			break
		}
	}
	return rows, held
}

// selectRows runs sql, the SELECT or a node's part of it, on cn and appends
// its rows to rows in COPY's text format, with the bytes charged to budget
// for them (held so far).
func (ci *copyIn) selectRows(s *session, cn *copyNode, sql string, rows []byte, held int64, budget *Budget) ([]byte, int64) {
	be, cols := cn.be, len(ci.spec.Columns)
	be.Send(&pgproto3.Parse{Query: sql, ParameterOIDs: ci.pull.oids})
	be.Send(&pgproto3.Bind{Parameters: ci.pull.params, ParameterFormatCodes: ci.pull.formats})
	be.Send(&pgproto3.Describe{ObjectType: 'P'})
	be.Send(&pgproto3.Execute{})
	be.Send(&pgproto3.Sync{})
	cn.pending++
	ci.readReply(s, cn, func(m pgproto3.BackendMessage) {
		switch m := m.(type) {
		case *pgproto3.RowDescription:
			n := len(m.Fields)
			if n < cols && ci.spec.AllColumns {
				spec, err := ci.spec.FirstColumns(n)
				if err != nil {
					ci.setErr(err)
					return
				}
				ci.spec, cols = spec, n
			}
			if n != cols {
				// PostgreSQL's own check, before any row.
				more := "expressions than target columns"
				if n < cols {
					more = "target columns than expressions"
				}
				ci.setErr(sqlstate.New(sqlstate.SyntaxError, "INSERT has more %s", more))
			}
		case *pgproto3.DataRow:
			if ci.err != nil {
				return
			}
			n := len(rows)
			rows = appendCopyText(rows, m.Values)
			if grow := int64(cap(rows)) - held; grow > 0 {
				if !budget.take(grow) {
					ci.setErr(pullOverBudget(ci, budget, n, "The proxy holds the SELECT's rows until it ends;"))
					rows = nil
					return
				}
				held += grow
			}
		}
	})
	return rows, held
}
