package proxy

import (
	"fmt"
	"slices"
	"strconv"

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
// The SELECT is read through a portal of the load's transaction on each
// node it runs on, about pullFetchBytes at a time, and each batch is loaded
// before the next is fetched: the node that runs the SELECT may also take
// rows for its shards, on the same backend, and the portals' snapshots,
// all taken before the first row is loaded, keep the load out of what the
// SELECT reads (a tree into itself). So the proxy holds one batch at a
// time, charged to --max-message-memory, the bound of what the proxy holds
// for clients, and the shards' buffers of COPY FROM (copyBufferTotal).
//
// With ON CONFLICT, each shard's rows go at the end as one INSERT ... VALUES
// under the clause (copyTextValues, router.CopySpec.RenderUpsert), as
// PostgreSQL checks a key given twice within one statement (21000): those
// rows are held until the SELECT ends.
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
	var parts []pullPart
	if ci.err == nil {
		parts = ci.pullParts(s, src)
	}
	if ci.err == nil && ci.spec.Conflict == "" {
		held = ci.streamRows(s, parts, budget)
	} else if ci.err == nil {
		held = ci.selectRows(s, parts, budget)
		// Each shard's rows wait in a buffer of their own until its one
		// statement: the rows are held twice.
		if n := int64(len(ci.held)); ci.err == nil && !budget.take(n) {
			ci.setErr(pullOverBudget(ci, budget, len(ci.held), "With ON CONFLICT the proxy holds the SELECT's rows until it ends, and each shard's rows until it writes them: the rows are held twice."))
		} else if ci.err == nil {
			held += n
			ci.load(s, ci.held)
		}
	}
	return s.endCopyIn(x, ci, "INSERT 0 ")
}

// load routes rows, complete rows in COPY's text format, to their shards.
func (ci *copyIn) load(s *session, rows []byte) {
	rp := newRowParser(ci.spec, ci.plan.Tree.KeyColumn)
	rp.adopt(rows)
	ci.route(s, rp, true)
}

// pullOverBudget is the error of rows that pass --max-message-memory.
func pullOverBudget(ci *copyIn, budget *Budget, read int, detail string) *sqlstate.Error {
	e := sqlstate.New(sqlstate.OutOfMemory, "out of memory: the rows of INSERT ... SELECT into tree %q pass what the proxy holds for clients (%d bytes, the --max-message-memory limit)", ci.plan.Tree.Name, budget.limit)
	e.Detail = fmt.Sprintf("%s %d bytes of rows were read.", detail, read)
	e.Hint = "Insert the rows in smaller ranges, load them with COPY FROM STDIN, or raise --max-message-memory."
	if ci.spec.Conflict != "" {
		e.Hint = "Insert the rows in smaller ranges, or without ON CONFLICT (the rows are then loaded as they are read), or raise --max-message-memory."
	}
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

// pullPart is one node's part of the SELECT: the whole SELECT on the
// catalog node, or a node's part of a SELECT that reads trees.
type pullPart struct {
	cn  *copyNode
	sql string
}

// pullParts returns the SELECT's parts: on the catalog node's cn or, when
// it reads trees, on each node its routing names. Each node's backend has
// settled what was queued on it before.
func (ci *copyIn) pullParts(s *session, catalog *copyNode) []pullPart {
	src := ci.plan.Copy.Source
	if src == nil {
		return []pullPart{{cn: catalog, sql: ci.plan.Copy.Select}}
	}
	bind := &pgproto3.Bind{Parameters: ci.pull.params, ParameterFormatCodes: ci.pull.formats}
	r, err := router.Resolve(ci.pull.view, src, routerBind(bind, ci.pull.oids))
	if err != nil {
		ci.setErr(err)
		return nil
	}
	var parts []pullPart
	for _, t := range r.Targets {
		cn := ci.node(s, t.Node)
		if cn == nil {
			return nil
		}
		if ci.settle(s, cn); ci.err != nil {
			return nil
		}
		parts = append(parts, pullPart{cn: cn, sql: t.SQL})
	}
	return parts
}

// pullPortal names the backend portal part i of a streamed SELECT is read
// through, in the load's transaction (so it outlives each fetch's Sync)
// until it is closed after its last fetch.
func pullPortal(i int) string { return "lattice_pull_" + strconv.Itoa(i) }

// A fetch reads about pullFetchBytes of the SELECT's rows, at most
// pullFetchRows of them: little memory per session, and few enough round
// trips. The first fetch, before the rows' width is known, reads
// pullFirstRows.
const (
	pullFetchBytes = 256 << 10
	pullFetchRows  = 1000
	pullFirstRows  = 100
)

// nextFetch is how many rows the next fetch reads, after one that read
// rows rows in size bytes.
func nextFetch(rows, size int) uint32 {
	if rows == 0 || size == 0 {
		return pullFetchRows
	}
	return uint32(min(pullFetchRows, max(1, pullFetchBytes*rows/size)))
}

// streamRows reads the parts through portals and loads each fetch's rows
// before the next fetch. Every part's portal is bound, which takes its
// snapshot, before any row is loaded: a part read after rows were loaded
// into its node would otherwise see them (a tree into itself). ci.held is
// the one batch's buffer, whose bytes are charged to budget; the bytes
// charged are returned.
func (ci *copyIn) streamRows(s *session, parts []pullPart, budget *Budget) (held int64) {
	for i, pt := range parts {
		ci.bindPart(pt, pullPortal(i))
		pt.cn.be.Send(&pgproto3.Sync{})
		pt.cn.pending++
	}
	for _, pt := range parts {
		if held = ci.readRows(s, pt.cn, held, budget, "", nil); ci.err != nil {
			return held
		}
	}
	over := fmt.Sprintf("The proxy holds about %d bytes of the SELECT's rows at a time, and at least one row;", pullFetchBytes)
	fetch := uint32(pullFirstRows)
	for i, pt := range parts {
		be := pt.cn.be
		for more := true; more; {
			// The COPYs the last batch sent to this backend end before
			// the fetch's reply is read.
			if ci.settle(s, pt.cn); ci.err != nil {
				return held
			}
			be.Send(&pgproto3.Execute{Portal: pullPortal(i), MaxRows: fetch})
			be.Send(&pgproto3.Sync{})
			pt.cn.pending++
			more = false
			ci.held = ci.held[:0]
			held = ci.readRows(s, pt.cn, held, budget, over, func(m pgproto3.BackendMessage) {
				if _, ok := m.(*pgproto3.PortalSuspended); ok {
					more = true
				}
			})
			if ci.err != nil {
				return held
			}
			if more {
				fetch = nextFetch(int(fetch), len(ci.held))
			}
			ci.load(s, ci.held)
		}
		be.Send(&pgproto3.Close{ObjectType: 'P', Name: pullPortal(i)})
		be.Send(&pgproto3.Sync{})
		pt.cn.pending++
	}
	return held
}

// bindPart queues the Parse, Bind (into portal) and Describe of part pt
// with the client's parameters.
func (ci *copyIn) bindPart(pt pullPart, portal string) {
	be := pt.cn.be
	be.Send(&pgproto3.Parse{Query: pt.sql, ParameterOIDs: ci.pull.oids})
	be.Send(&pgproto3.Bind{DestinationPortal: portal, Parameters: ci.pull.params, ParameterFormatCodes: ci.pull.formats})
	be.Send(&pgproto3.Describe{ObjectType: 'P', Name: portal})
}

// selectRows runs the parts one after the other and appends their rows to
// ci.held, charged to budget; the bytes charged are returned.
func (ci *copyIn) selectRows(s *session, parts []pullPart, budget *Budget) (held int64) {
	for _, pt := range parts {
		ci.bindPart(pt, "")
		pt.cn.be.Send(&pgproto3.Execute{})
		pt.cn.be.Send(&pgproto3.Sync{})
		pt.cn.pending++
		if held = ci.readRows(s, pt.cn, held, budget, "The proxy holds the SELECT's rows until it ends;", nil); ci.err != nil {
			break
		}
	}
	return held
}

// readRows reads the reply to a SELECT's Execute on cn, appending its rows
// to ci.held in COPY's text format, charged to budget (held so far; the
// new total is returned); past the budget the error's detail starts with
// over. other, if set, sees the reply's other messages.
func (ci *copyIn) readRows(s *session, cn *copyNode, held int64, budget *Budget, over string, other func(pgproto3.BackendMessage)) int64 {
	cols := len(ci.spec.Columns)
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
			n := len(ci.held)
			ci.held = appendCopyText(ci.held, m.Values)
			if grow := int64(cap(ci.held)) - held; grow > 0 {
				if !budget.take(grow) {
					ci.setErr(pullOverBudget(ci, budget, n, over))
					ci.held = nil
					return
				}
				held += grow
			}
		default:
			if other != nil {
				other(m)
			}
		}
	})
	return held
}
