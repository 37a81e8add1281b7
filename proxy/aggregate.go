package proxy

import (
	"context"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
)

// An aggregating fan-out (router.Plan.Agg) runs a partial query on every
// node holding shards of the tree, then hands the partial rows to
// PostgreSQL: one final query on a pooled backend of the catalog node,
// with the partial rows as typed parameters of a VALUES list. HAVING,
// DISTINCT, ORDER BY, LIMIT and OFFSET run there, so types, grouping
// equality and order are PostgreSQL's. When one node holds every shard,
// the statement runs there whole and there is no final step.

// Bounds on the partial rows the proxy holds for the final query: a
// protocol message carries at most 65535 parameters.
const (
	maxFinalParams = 65535
	maxFinalBytes  = 64 << 20
)

// aggState is what the final step needs besides the plan.
type aggState struct {
	ctx     context.Context
	params  [][]byte // the client's Bind parameters (extended protocol)
	formats []int16  // their format codes, as the client sent them
	oids    []uint32 // the parameter types the client declared
	results []int16  // the client's result format codes
}

// wholeOnOneNode returns the statement to run when one node holds every
// shard of an aggregating fan-out's tree.
func wholeOnOneNode(v *shardmap.View, p *router.Plan, bind *pgproto3.Bind, oids []uint32) (sql, node string, ok bool) {
	if p.Agg == nil {
		return "", "", false
	}
	m := v.Maps[p.Tree.Name]
	if m == nil {
		return "", "", false
	}
	nodes, schemas := nodeGroups(m, keyShards(m, p, bind, oids))
	if len(nodes) != 1 {
		return "", "", false
	}
	return p.RenderWhole(schemas[0]), nodes[0], true
}

// queryOIDs declares the client's parameters for a query that references
// only the parameters in used: an unreferenced parameter the client did not
// type is declared text (bytea when sent in binary), which accepts any
// value, since PostgreSQL cannot infer a type for it.
func queryOIDs(used []int, oids []uint32, bind *pgproto3.Bind) []uint32 {
	n := len(bind.Parameters)
	out := make([]uint32, max(n, len(oids)))
	copy(out, oids)
	refs := map[int]bool{}
	for _, u := range used {
		refs[u] = true
	}
	for i := range out {
		if out[i] != 0 || refs[i+1] {
			continue
		}
		out[i] = pgtype.TextOID
		if formatFor(bind.ParameterFormatCodes, i) == 1 {
			out[i] = pgtype.ByteaOID
		}
	}
	return out
}

// startAggFanOut sends the partial query to every node.
func (s *session) startAggFanOut(ctx context.Context, p *router.Plan, nodes []string, schemas [][]string, bind *pgproto3.Bind, portal *clientPortal) *fanOut {
	extended := bind != nil
	f := &fanOut{plan: p, limit: -1, simple: !extended, agg: &aggState{ctx: ctx}}
	var partialBind pgproto3.Bind
	var queries []string // simple protocol: each node's partial query
	if extended {
		f.agg.params, f.agg.formats, f.agg.oids, f.agg.results = bind.Parameters, bind.ParameterFormatCodes, portal.stmt.oids, bind.ResultFormatCodes
		// Partial rows come back as text: they become text parameters of
		// the final query.
		partialBind = *bind
		partialBind.ResultFormatCodes = nil
	}
	for i, node := range nodes {
		sql := p.RenderPartial(schemas[i])
		if extended {
			name := bind.DestinationPortal
			if i > 0 {
				name = "lattice_part_" + strconv.Itoa(i) + "_" + bind.DestinationPortal
			}
			part := &clientPortal{stmt: &clientStmt{sql: sql, oids: queryOIDs(p.Agg.PartialParams, portal.stmt.oids, bind)}}
			if !s.bindOn(ctx, part, node, sql, &partialBind, name, i > 0) {
				return nil
			}
			portal.parts = append(portal.parts, part.parts...)
			f.parts = append(f.parts, &fanPart{be: part.parts[0].be})
			continue
		}
		be, err := s.backend(ctx, node)
		if err != nil {
			s.fail(err, false)
			return nil
		}
		queries = append(queries, sql)
		f.parts = append(f.parts, &fanPart{be: be})
	}
	if !extended {
		// Sent only once every node's backend is at hand: a Query sent
		// before a later node is refused would have no step to read it.
		for i, part := range f.parts {
			part.be.Frontend.Send(&pgproto3.Query{String: queries[i]})
		}
		s.x.add(step{kind: stepFanOut, fan: f})
	}
	return f
}

// playAgg reads the partial rows of every node and runs the final query.
func (f *fanOut) playAgg(s *session, x *exchange) error {
	live := f.parts[:0:0]
	for _, p := range f.parts {
		if !x.failed[p.be] {
			live = append(live, p)
		}
	}
	base := len(f.agg.params)
	var values [][]byte
	size := 0
	for _, p := range live {
		for {
			row, err := f.next(s, x, p, true)
			if err != nil {
				return err
			}
			if row == nil {
				break
			}
			if x.errored {
				continue
			}
			for _, v := range row {
				size += len(v)
			}
			values = append(values, row...)
			if base+len(values) > maxFinalParams || size > maxFinalBytes {
				values = nil
				x.errored = true
				e := Errorf("54000", "the partial results of this SELECT over several shards exceed the %d values the proxy combines", maxFinalParams-base)
				e.Hint = "Narrow the WHERE clause or group by fewer distinct values, or fix the shard key in WHERE to read one shard."
				s.send(e.Response())
			}
		}
	}
	if f.simple {
		for _, p := range live {
			if err := waitReady(x, p.be); err != nil {
				return err
			}
		}
	}
	if x.errored {
		return nil
	}
	fail := func(err error) error {
		x.errored = true
		s.send(AsError(err).Response())
		return nil
	}
	a := f.plan.Agg
	if len(f.fields) != a.Columns {
		return fail(Errorf("XX000", "the nodes returned %d partial columns, %d expected", len(f.fields), a.Columns))
	}
	colOIDs := make([]uint32, len(f.fields))
	for i, fd := range f.fields {
		colOIDs[i] = fd.DataTypeOID
	}
	var src strings.Builder
	rows := len(values) / a.Columns
	param := func(i int) string { return "$" + strconv.Itoa(base+i+1) }
	if rows == 0 {
		// No partial rows: one row of NULLs that WHERE false removes keeps
		// the columns typed.
		src.WriteString("(SELECT ")
		for c := range a.Columns {
			if c > 0 {
				src.WriteString(", ")
			}
			src.WriteString(param(c))
		}
		src.WriteString(" WHERE false)")
		values = make([][]byte, a.Columns)
		rows = 1
	} else {
		src.WriteString("(VALUES ")
		for r := range rows {
			if r > 0 {
				src.WriteString(", ")
			}
			src.WriteByte('(')
			for c := range a.Columns {
				if c > 0 {
					src.WriteString(", ")
				}
				src.WriteString(param(r*a.Columns + c))
			}
			src.WriteByte(')')
		}
		src.WriteByte(')')
	}
	src.WriteString(" AS " + a.SourceColumns())
	sql, rerr := a.RenderFinal(colOIDs, src.String())
	if rerr != nil {
		return fail(rerr)
	}
	clientBind := &pgproto3.Bind{Parameters: f.agg.params, ParameterFormatCodes: f.agg.formats}
	oids := queryOIDs(a.FinalParams, f.agg.oids, clientBind)[:base]
	formats := make([]int16, base, base+len(values))
	for i := range formats {
		formats[i] = formatFor(f.agg.formats, i)
	}
	for range rows {
		oids = append(oids, colOIDs...)
	}
	formats = append(formats, make([]int16, len(values))...)
	params := append(append(make([][]byte, 0, base+len(values)), f.agg.params...), values...)
	return s.runFinal(f, x, &pgproto3.Parse{Query: sql, ParameterOIDs: oids},
		&pgproto3.Bind{Parameters: params, ParameterFormatCodes: formats, ResultFormatCodes: f.agg.results})
}

// runFinal runs the final query on a backend of its own, so that it never
// interleaves with the batch the client's other statements are in, and
// forwards its rows.
func (s *session) runFinal(f *fanOut, x *exchange, parse *pgproto3.Parse, bind *pgproto3.Bind) error {
	be, err := s.srv.pools.Acquire(f.agg.ctx, s.srv.catalogNode, s.tenant)
	if err != nil {
		x.errored = true
		s.send(Errorf("08006", "cannot reach node %s: %v", s.srv.catalogNode, err).Response())
		return nil
	}
	s.setActive(be, true)
	defer func() {
		s.setActive(be, false)
		if be.TxStatus != 'I' {
			be.MarkBroken()
		}
		s.srv.pools.Release(be)
	}()
	pending := 1 // ReadyForQuery messages to read: the Sync's, and the prologue's
	if q := s.prologue(be); q != "" {
		be.Frontend.Send(&pgproto3.Query{String: q})
		pending++
	}
	be.Frontend.SendParse(parse)
	be.Frontend.SendBind(bind)
	if f.simple {
		be.Frontend.SendDescribe(&pgproto3.Describe{ObjectType: 'P'})
	}
	be.Frontend.SendExecute(&pgproto3.Execute{})
	be.Frontend.SendSync(&pgproto3.Sync{})
	if err := be.Frontend.Flush(); err != nil {
		be.MarkBroken()
		return err
	}
	for {
		msg, err := be.Frontend.Receive()
		if err != nil {
			be.MarkBroken()
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			be.TxStatus = m.TxStatus
			if pending--; pending == 0 {
				return nil
			}
		case *pgproto3.ErrorResponse:
			if !x.errored {
				x.errored = true
				s.send(m)
			}
		case *pgproto3.RowDescription, *pgproto3.DataRow, *pgproto3.CommandComplete:
			if !x.errored {
				s.send(m)
			}
		case *pgproto3.NoticeResponse:
			s.send(m)
		case *pgproto3.ParameterStatus:
			be.Params[m.Name] = m.Value
		}
	}
}

// describeAggPortal describes the portal of an aggregating fan-out: its
// result is the statement's own, which the tree's template on the catalog
// node describes exactly.
func (s *session) describeAggPortal(ctx context.Context, portal *clientPortal) {
	be, err := s.describeBackend(ctx)
	if err != nil {
		s.failExtended(err)
		return
	}
	st := portal.stmt
	key := preparedKey(st.sql, st.oids)
	name, ok := be.Prepared(key)
	if !ok {
		name = be.AddPrepared(key)
		be.Frontend.SendParse(&pgproto3.Parse{Name: name, Query: st.sql, ParameterOIDs: st.oids})
		s.x.add(step{kind: stepParse, be: be, prepKey: key})
	}
	be.Frontend.SendDescribe(&pgproto3.Describe{ObjectType: 'S', Name: name})
	s.x.add(step{kind: stepDescribeStmt, be: be, asPortal: true, formats: portal.resultFmt})
}
