package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// fanOut is one SELECT sent to every node that holds shards of its tree,
// merged back into one result: concatenated, or k-way merged on the ORDER BY
// keys, with OFFSET and LIMIT applied after the merge.
type fanOut struct {
	plan   *router.Plan
	client string // the client's statement text, for an error's position
	parts  []*fanPart
	limit  int64 // -1: none
	offset int64
	simple bool // the parts answer a simple Query: RowDescription first, ReadyForQuery last
	// fields are the per-node result columns (hidden sort columns included),
	// needed to decode sort keys.
	fields []pgproto3.FieldDescription
	agg    *aggState // an aggregating fan-out: partial rows feed a final query
	stop   stopper   // statement_timeout and the memory bound
	held   int64     // bytes of the rows the k-way merge holds, one per part

	ctx     context.Context     // the statement's, for reading the parts
	cols    []btreeindex.Column // fields as the merge reads them, made at its first row
	checked bool                // checkFields passed
	lost    error               // a part's connection failed: the fan-out ends at once
	load    loadMark            // the shards it reads, counted once it ends without an error
}

type fanPart struct {
	be   *pgshard.Conn
	row  [][]byte // the part's current row, copied out of the read buffer
	done bool
}

// checkFields verifies that the sort keys point where the router meant: a
// position past the visible columns must be one of the hidden sort columns.
// The router expands * from the tree's recorded columns, which DDL run
// directly on a node could make stale.
func (f *fanOut) checkFields() error {
	visible := len(f.fields) - f.plan.Hidden
	if visible < 0 {
		return sqlstate.New(sqlstate.InternalError, "the nodes returned %d columns, fewer than the %d sort columns added", len(f.fields), f.plan.Hidden)
	}
	for _, k := range f.plan.Sort {
		switch {
		case k.Column >= len(f.fields):
			return sqlstate.New(sqlstate.InvalidColumnReference, "ORDER BY position %d is not in select list", k.Column+1)
		case k.Column >= visible && !bytes.HasPrefix(f.fields[k.Column].Name, []byte("lattice_sort_")):
			e := sqlstate.New(sqlstate.InternalError, "the columns of tree %q differ from the ones Lattice recorded", f.plan.Tree.Name)
			e.Hint = "change a tree's columns through the proxy"
			return e
		}
	}
	return nil
}

// startFanOut binds a FanOut plan on every node holding shards of its tree
// (bindOn); the returned fanOut merges their results when the portal runs.
func (s *session) startFanOut(ctx context.Context, v *shardmap.View, p *router.Plan, bind *pgproto3.Bind, portal *clientPortal) *fanOut {
	extended := !s.simple
	m := v.Maps[p.Tree.Name]
	if m == nil {
		s.fail(sqlstate.New(sqlstate.SystemError, "tree %q has no shard map", p.Tree.Name))
		return nil
	}
	if err := s.uncombinedAggregate(ctx, p); err != nil {
		s.fail(err)
		return nil
	}
	oids := portal.stmt.oids
	r, err := router.Resolve(v, p, routerBind(bind, oids))
	if err != nil {
		s.fail(err)
		return nil
	}
	nodes := make([]string, len(r.Targets))
	sqls := make([]string, len(r.Targets))
	for i, t := range r.Targets {
		nodes[i], sqls[i] = t.Node, t.SQL
	}
	if p.Agg != nil {
		f := s.startAggFanOut(ctx, p, nodes, sqls, bind, portal)
		if f != nil {
			f.load = markFanOut(v, p, r.Targets)
		}
		return f
	}
	f := &fanOut{plan: p, limit: r.Limit, offset: r.Offset, simple: !extended, ctx: ctx, load: markFanOut(v, p, r.Targets)}
	if extended && len(bind.ResultFormatCodes) > 1 {
		// The client names a format per visible column; the hidden sort
		// columns come back as text.
		b := *bind
		b.ResultFormatCodes = append(append([]int16(nil), bind.ResultFormatCodes...), make([]int16, p.Hidden)...)
		bind = &b
	}
	var partOIDs []uint32
	if extended {
		// LIMIT and OFFSET are applied by the proxy: their parameters
		// vanish from the node's statement, which must still take them.
		partOIDs = limitParamOIDs(p, oids, len(bind.Parameters))
	}
	if !s.sendParts(ctx, f, nodes, sqls, bind, portal, partOIDs) {
		return nil
	}
	return f
}

// uncombinedAggregate refuses a fan-out that calls an aggregate the proxy
// cannot combine over several shards (a user-defined one).
func (s *session) uncombinedAggregate(ctx context.Context, p *router.Plan) error {
	agg, err := s.srv.aggregateIn(ctx, s.tenant, p.Calls)
	if err != nil || agg == "" {
		return err
	}
	e := sqlstate.New(sqlstate.FeatureNotSupported, "SELECT on tree %q calls aggregate %s, which the proxy cannot combine over several shards", p.Tree.Name, agg)
	e.Hint = "fix the shard key in WHERE to read one shard, or aggregate in the application; count, sum, min, max and avg are combined"
	return e
}

// limitParamOIDs declares the statement's parameter types for a node,
// typing the LIMIT and OFFSET parameters as bigint as PostgreSQL would.
func limitParamOIDs(p *router.Plan, oids []uint32, n int) []uint32 {
	out := make([]uint32, max(n, len(oids)))
	copy(out, oids)
	for _, v := range []*router.Value{p.Limit, p.Offset} {
		if v != nil && v.Param > 0 && v.Param <= len(out) && out[v.Param-1] == 0 {
			out[v.Param-1] = pgtype.Int8OID
		}
	}
	return out
}

// play merges the parts' results and forwards them to the client.
func (f *fanOut) play(s *session, x *exchange) error {
	s.armTimeout(f)
	defer f.stop.disarm()
	if f.agg != nil {
		return f.playAgg(s, x)
	}
	live, err := f.liveParts(x)
	if err != nil {
		return err
	}
	var sent, skipped int64
	emit := func(row [][]byte) {
		if x.errored || (f.limit >= 0 && sent >= f.limit) {
			return
		}
		if skipped < f.offset {
			skipped++
			return
		}
		visible := row[:len(row)-f.plan.Hidden]
		s.send(&pgproto3.DataRow{Values: visible})
		sent++
	}
	srcs := make([]btreeindex.RowSource, len(live))
	parts := make([]*partSource, len(live))
	for i, p := range live {
		parts[i] = &partSource{f: f, s: s, x: x, p: p}
		srcs[i] = parts[i]
	}
	keys, inPostgres, err := f.sortKeys(s, x, parts)
	switch {
	case err != nil:
		if f.lost != nil {
			return f.lost
		}
		if !x.errored {
			x.errored = true
			s.send(sqlstate.As(err).Response())
		}
	case inPostgres != nil:
		if err := f.sortInPostgres(s, x, parts, keys, inPostgres, emit); err != nil {
			return err
		}
	default:
		merge := btreeindex.NewMerge(keys, srcs)
		for {
			row, err := merge.Next(f.ctx)
			if err != nil {
				if f.lost != nil {
					return f.lost
				}
				if !x.errored {
					x.errored = true
					s.send(sqlstate.As(err).Response())
				}
				break
			}
			if row == nil {
				break
			}
			emit(row)
		}
	}
	// The parts the merge stopped reading, on an error, are read to their
	// end, after the error reached the client, so that their backends can
	// serve again.
	for _, p := range live {
		for !p.done {
			if _, err := f.next(s, x, p, false); err != nil {
				return err
			}
		}
	}
	if !x.errored {
		s.send(commandComplete("SELECT " + strconv.FormatInt(sent, 10)))
	}
	if f.simple {
		for _, p := range live {
			if err := waitReady(x, p.be); err != nil {
				return err
			}
		}
	}
	return nil
}

// liveParts returns the parts whose backends have not failed earlier in
// the exchange. Such a backend, in the extended protocol, skips the part
// up to its Sync; in the simple one it answers the part's Query with
// 25P02 and ReadyForQuery, which are read here, or they would wait on the
// connection and answer its next statement.
func (f *fanOut) liveParts(x *exchange) ([]*fanPart, error) {
	live := f.parts[:0:0]
	for _, p := range f.parts {
		switch {
		case !x.failed[p.be]:
			live = append(live, p)
		case f.simple:
			if err := waitReady(x, p.be); err != nil {
				return nil, err
			}
		}
	}
	return live, nil
}

// partSource is a fan-out part as the merge reads it. A part's
// ErrorResponse ends its rows (next reports it, and skips every later row
// of every part); an error the proxy finds in a row is reported here and
// stops the merge.
type partSource struct {
	f *fanOut
	s *session
	x *exchange
	p *fanPart
	// first is a row read before the merge began (sortKeys needed the
	// columns, which the simple protocol sends with the first row).
	first  [][]byte
	primed bool
}

// errReported stops a merge whose error already reached the client.
var errReported = errors.New("fan-out error already reported")

// Next reads the part's next row. With sort keys the merge holds the row
// while it reads the other parts: it is copied out of the read buffer and
// counted against the memory bound. The backend's receive takes no
// context: statement_timeout and cancels stop a part (stopper).
func (ps *partSource) Next(context.Context) ([][]byte, error) {
	if ps.primed {
		ps.primed = false
		return ps.first, nil
	}
	f, s, x, p := ps.f, ps.s, ps.x, ps.p
	sorted := len(f.plan.Sort) > 0
	row, err := f.next(s, x, p, sorted)
	if err != nil {
		f.lost = err
		return nil, err
	}
	if row == nil || !sorted {
		return row, nil
	}
	f.held += rowSize(row) - rowSize(p.row)
	p.row = row
	if err := s.overMemory(f.held); err != nil {
		x.errored = true
		s.send(err.Response())
		s.stopParts()
		return nil, errReported
	}
	if !f.checked {
		if err := f.checkFields(); err != nil {
			x.errored = true
			s.send(sqlstate.As(err).Response())
			return nil, errReported
		}
		f.checked = true
	}
	return row, nil
}

// Columns are the types and formats of the parts' columns.
func (ps *partSource) Columns() []btreeindex.Column {
	f := ps.f
	if f.cols == nil {
		f.cols = make([]btreeindex.Column, len(f.fields))
		for i, fd := range f.fields {
			f.cols[i] = btreeindex.Column{OID: fd.DataTypeOID, Format: fd.Format}
		}
	}
	return f.cols
}

// Close leaves the part to play, which reads what is left of it once the
// merge's error has reached the client.
func (ps *partSource) Close(context.Context) error { return nil }

// next returns p's next row, or nil when p has no more. A row that must
// outlive the next read is copied out of the read buffer.
func (f *fanOut) next(s *session, x *exchange, p *fanPart, keep bool) ([][]byte, error) {
	if p.done {
		return nil, nil
	}
	for {
		msg, err := p.be.Receive()
		if err != nil {
			p.be.MarkBroken()
			p.done = true
			return nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.RowDescription:
			if f.fields == nil {
				f.fields = copyFields(m.Fields)
				if f.simple && !x.errored && f.agg == nil {
					s.send(&pgproto3.RowDescription{Fields: m.Fields[:len(m.Fields)-f.plan.Hidden]})
				}
			}
		case *pgproto3.DataRow:
			if x.errored {
				continue
			}
			if !keep {
				return m.Values, nil
			}
			return copyRow(m.Values), nil
		case *pgproto3.CommandComplete, *pgproto3.EmptyQueryResponse:
			p.done = true
			return nil, nil
		case *pgproto3.ErrorResponse:
			x.failed[p.be] = true
			if !x.errored {
				x.errored = true
				s.send(clientPosition(f.stop.explain(m), f.client, p.be))
			}
			p.done = true
			return nil, nil
		case *pgproto3.NoticeResponse:
			s.send(m)
		case *pgproto3.ParameterStatus:
		case *pgproto3.NotificationResponse:
			s.send(m)
		default:
			p.be.MarkBroken()
			p.done = true
			return nil, fmt.Errorf("unexpected %T in a fan-out result", m)
		}
	}
}

func waitReady(x *exchange, be *pgshard.Conn) error {
	for {
		msg, err := be.Receive()
		if err != nil {
			be.MarkBroken()
			return err
		}
		switch msg.(type) {
		case *pgproto3.ReadyForQuery:
			return nil
		case *pgproto3.ErrorResponse:
			x.failed[be] = true
		}
	}
}

// copyFields copies a RowDescription's fields out of the read buffer.
func copyFields(fields []pgproto3.FieldDescription) []pgproto3.FieldDescription {
	out := make([]pgproto3.FieldDescription, len(fields))
	for i, f := range fields {
		out[i] = f
		out[i].Name = append([]byte(nil), f.Name...)
	}
	return out
}

func copyRow(values [][]byte) [][]byte {
	n := 0
	for _, v := range values {
		n += len(v)
	}
	buf := make([]byte, 0, n)
	out := make([][]byte, len(values))
	for i, v := range values {
		if v == nil {
			continue
		}
		start := len(buf)
		buf = append(buf, v...)
		out[i] = buf[start:len(buf):len(buf)]
	}
	return out
}

// sendParts binds each node its part of a fan-out as a part of portal
// (bindOn); run executes them. partOIDs are the parameter types of every
// part's statement.
func (s *session) sendParts(ctx context.Context, f *fanOut, nodes, sqls []string, bind *pgproto3.Bind, portal *clientPortal, partOIDs []uint32) bool {
	for i, node := range nodes {
		part := &clientPortal{stmt: &clientStmt{sql: sqls[i], oids: partOIDs, epoch: portal.stmt.epoch}}
		if !s.bindOn(ctx, part, node, sqls[i], bind, partPortal(bind.DestinationPortal, i), i > 0) {
			return false
		}
		portal.parts = append(portal.parts, part.parts...)
		f.parts = append(f.parts, &fanPart{be: part.parts[0].be})
	}
	return true
}
