package proxy

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// An aggregating fan-out (router.Plan.Agg) runs a partial query on every
// node holding shards of the tree, then hands the partial rows to
// PostgreSQL: one final query on a pooled backend of the catalog node,
// with the partial rows as typed parameters of a VALUES list. HAVING,
// DISTINCT, ORDER BY, LIMIT and OFFSET run there, so types, grouping
// equality and order are PostgreSQL's. When one node holds every shard,
// the statement runs there whole and there is no final step.

// Bounds on the partial rows the proxy holds for a VALUES list in the final
// query (a protocol message carries at most 65535 parameters); more, or more
// than Config.MaxMergeMemory, go through a temporary table.
const (
	maxFinalParams = 65535
	maxFinalBytes  = 16 << 20
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
func wholeOnOneNode(v *shardmap.View, p *router.Plan, bind *pgproto3.Bind, oids []uint32) (router.Target, bool) {
	if p.Agg == nil {
		return router.Target{}, false
	}
	r, err := router.Resolve(v, p, routerBind(bind, oids))
	if err != nil || !r.Whole {
		return router.Target{}, false // the fan-out reports the error
	}
	return r.Targets[0], true
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
func (s *session) startAggFanOut(ctx context.Context, p *router.Plan, nodes, sqls []string, bind *pgproto3.Bind, portal *clientPortal) *fanOut {
	extended := !s.simple
	f := &fanOut{plan: p, limit: -1, simple: !extended, agg: &aggState{ctx: ctx}}
	partial := bind
	if extended {
		f.agg.params, f.agg.formats, f.agg.oids, f.agg.results = bind.Parameters, bind.ParameterFormatCodes, portal.stmt.oids, bind.ResultFormatCodes
		// Partial rows come back as text: they become text parameters of
		// the final query.
		b := *bind
		b.ResultFormatCodes = nil
		partial = &b
	}
	var partOIDs []uint32
	if extended {
		partOIDs = queryOIDs(p.Agg.PartialParams, portal.stmt.oids, bind)
	}
	if !s.sendParts(ctx, f, nodes, sqls, partial, portal, partOIDs) {
		return nil
	}
	return f
}

// playAgg reads the partial rows of every node and runs the final query.
// Up to maxFinalParams values travel as parameters of a VALUES list; past
// that the rows stream into a temporary table (ON COMMIT DROP, in a short
// transaction of the final backend) with COPY, so the proxy never holds
// more than the VALUES bound.
func (f *fanOut) playAgg(s *session, x *exchange) error {
	live, err := f.liveParts(x)
	if err != nil {
		return err
	}
	a := f.plan.Agg
	base := len(f.agg.params)
	var values [][]byte
	size := 0
	var held int64       // bytes of rows gathered so far
	var cp *pgshard.Conn // the final backend, once the rows go to a temporary table
	var cpEnd string     // what cp runs after the final query
	defer func() {
		if cp != nil {
			s.releaseFinal(cp)
		}
	}()
	var copyBuf []byte
	// COPY takes no parameters: its rows go to the table from the first
	// (typed by the parts' RowDescription, read with it). A failure is the
	// client's error, and the parts' rows are read and dropped.
	copyTo := a.CopyTo != ""
	for _, p := range live {
		for {
			row, err := f.next(s, x, p, cp == nil)
			if err != nil {
				return err
			}
			if row == nil {
				break
			}
			if copyTo && cp == nil && !x.errored {
				cp, cpEnd = s.beginCopy(f, x)
			}
			if x.errored {
				continue
			}
			held += rowSize(row)
			if e := s.overGathered(a, held); e != nil {
				x.errored = true
				s.send(e.Response())
				s.stopParts()
				continue
			}
			if cp != nil {
				if copyBuf, err = copyLine(cp, copyBuf, row); err != nil {
					return err
				}
				continue
			}
			for _, v := range row {
				size += len(v)
			}
			values = append(values, row...)
			if base+len(values) > maxFinalParams || int64(size) > min(maxFinalBytes, s.srv.cfg.MaxMergeMemory) {
				if cp, cpEnd = s.beginCopy(f, x); cp == nil {
					values = nil
					continue
				}
				for r := 0; r+a.Columns <= len(values); r += a.Columns {
					if copyBuf, err = copyLine(cp, copyBuf, values[r:r+a.Columns]); err != nil {
						return err
					}
				}
				values = nil
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
	if copyTo && cp == nil && !x.errored {
		cp, cpEnd = s.beginCopy(f, x) // no rows
	}
	if x.errored {
		if cp != nil {
			cp.MarkBroken() // inside its COPY: the pool closes it
		}
		return nil
	}
	fail := func(err error) error {
		x.errored = true
		s.send(sqlstate.As(err).Response())
		return nil
	}
	if len(f.fields) != a.Columns {
		return fail(sqlstate.New(sqlstate.InternalError, "the nodes returned %d partial columns, %d expected", len(f.fields), a.Columns))
	}
	colOIDs := make([]uint32, len(f.fields))
	for i, fd := range f.fields {
		colOIDs[i] = fd.DataTypeOID
	}
	var colls []string // the partial columns' collations, so that the final step groups and sorts text as the nodes do
	if a.CollationProbe != "" && mayCollate(colOIDs) {
		c, err := s.collationsOf(f.agg.ctx, a.CollationProbe, a.Columns)
		if err != nil {
			if cp != nil {
				cp.MarkBroken()
			}
			return fail(err)
		}
		colls = c.names
	}
	clientBind := &pgproto3.Bind{Parameters: f.agg.params, ParameterFormatCodes: f.agg.formats}
	oids := queryOIDs(a.FinalParams, f.agg.oids, clientBind)[:base]
	formats := make([]int16, base, base+len(values))
	for i := range formats {
		formats[i] = formatFor(f.agg.formats, i)
	}
	if cp != nil {
		if len(copyBuf) > 0 {
			cp.Send(&pgproto3.CopyData{Data: copyBuf})
		}
		cp.Send(&pgproto3.CopyDone{})
		sql, rerr := a.RenderFinal(colOIDs, collatedSource(partialTable+" AS lattice_q", colls, a.Columns))
		if rerr != nil {
			cp.MarkBroken()
			return fail(rerr)
		}
		results := f.agg.results
		if a.CopyTo != "" {
			results = nil // COPY's format is in its options
		}
		return s.runFinal(f, x, cp, 1, &pgproto3.Parse{Query: sql, ParameterOIDs: oids},
			&pgproto3.Bind{Parameters: f.agg.params, ParameterFormatCodes: formats, ResultFormatCodes: results}, cpEnd)
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
	source := src.String() + " AS " + a.SourceColumns()
	if colls != nil {
		source = collatedSource(src.String()+" AS lattice_q("+strings.TrimPrefix(a.SourceColumns(), "lattice_p("), colls, a.Columns)
	}
	sql, rerr := a.RenderFinal(colOIDs, source)
	if rerr != nil {
		return fail(rerr)
	}
	for range rows {
		oids = append(oids, colOIDs...)
	}
	formats = append(formats, make([]int16, len(values))...)
	params := append(append(make([][]byte, 0, base+len(values)), f.agg.params...), values...)
	be := s.finalBackend(f, x)
	if be == nil {
		return nil
	}
	defer s.releaseFinal(be)
	pending, end := s.asClient(be)
	return s.runFinal(f, x, be, pending, &pgproto3.Parse{Query: sql, ParameterOIDs: oids},
		&pgproto3.Bind{Parameters: params, ParameterFormatCodes: formats, ResultFormatCodes: f.agg.results}, end)
}

// collatedSource is the final step's source lattice_p over inner (a FROM
// item with columns lattice_c1...), each text column under the collation
// the probe found for it, as PostgreSQL would write
// "lattice_c1 COLLATE x"; without collations it is inner itself.
func collatedSource(inner string, colls []string, columns int) string {
	if colls == nil {
		return strings.Replace(inner, " AS lattice_q", " AS lattice_p", 1)
	}
	var b strings.Builder
	b.WriteString("(SELECT ")
	for i := range columns {
		if i > 0 {
			b.WriteString(", ")
		}
		c := "lattice_c" + strconv.Itoa(i+1)
		b.WriteString(c)
		if i < len(colls) && colls[i] != "" {
			b.WriteString(" COLLATE " + colls[i])
		}
		b.WriteString(" AS " + c)
	}
	b.WriteString(" FROM " + inner + ") AS lattice_p")
	return b.String()
}

// partialTable is the temporary table large partial results go to.
const partialTable = "lattice_partial"

// finalBackend takes a backend of the catalog node for the final query: one
// of its own, so that the final query never interleaves with the batch the
// client's other statements are in. Inside a transaction block the final
// query runs in a transaction of that backend begun as the client's was,
// with its SET LOCALs (asClient), and rolled back after: a SET LOCAL
// TimeZone formats its timestamps, and current_setting reads the block's
// isolation level and settings, as on the nodes.
func (s *session) finalBackend(f *fanOut, x *exchange) *pgshard.Conn {
	be, err := s.srv.pools.Acquire(f.agg.ctx, s.user, s.srv.catalogNode, s.tenant)
	if err != nil {
		x.errored = true
		s.send(acquireError(s.srv.catalogNode, err).Response())
		return nil
	}
	s.setActive(be, true)
	return be
}

// releaseFinal returns the final backend; one left inside its transaction
// (an error, a broken COPY) is closed, and its temporary table with it.
func (s *session) releaseFinal(be *pgshard.Conn) {
	if be.TxStatus != 'I' {
		be.MarkBroken()
	}
	s.putBack(be)
}

// beginCopy takes the final backend and starts COPY into a temporary table
// typed like the partial columns, and returns what the backend runs after
// the final query. Outside a transaction block the table lives in a
// transaction that ends with COMMIT (ON COMMIT DROP). Inside one it is made
// first, on its own, since the block may be READ ONLY, which refuses
// CREATE but not COPY into a temporary table; the final query's
// transaction (txContext) then fills it, and ROLLBACK and DROP end both.
// It reports a failure to the client and returns nil.
func (s *session) beginCopy(f *fanOut, x *exchange) (*pgshard.Conn, string) {
	be := s.finalBackend(f, x)
	if be == nil {
		return nil, ""
	}
	fail := func(err error) (*pgshard.Conn, string) {
		be.MarkBroken()
		s.releaseFinal(be)
		if !x.errored {
			x.errored = true
			s.send(sqlstate.As(err).Response())
		}
		return nil, ""
	}
	// The column types, typmods included, by PostgreSQL's own names.
	var q strings.Builder
	q.WriteString("SELECT ")
	for i, fd := range f.fields {
		if i > 0 {
			q.WriteString(", ")
		}
		fmt.Fprintf(&q, "format_type(%d, %d)", fd.DataTypeOID, fd.TypeModifier)
	}
	pending := 1
	if p := s.prologue(be); p != "" {
		be.Send(&pgproto3.Query{String: p})
		pending++
	}
	be.Send(&pgproto3.Query{String: q.String()})
	if err := be.Flush(); err != nil {
		return fail(err)
	}
	var types []string
	for pending > 0 {
		msg, err := be.Receive()
		if err != nil {
			return fail(err)
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			if pending == 1 { // the prologue's set_config calls return rows too
				for _, v := range m.Values {
					types = append(types, string(v))
				}
			}
		case *pgproto3.ErrorResponse:
			return fail(sqlstate.New(m.Code, "%s", m.Message))
		case *pgproto3.ReadyForQuery:
			pending--
		}
	}
	if len(types) != len(f.fields) {
		return fail(sqlstate.New(sqlstate.InternalError, "cannot name the types of the partial columns"))
	}
	var table strings.Builder
	table.WriteString("CREATE TEMPORARY TABLE " + partialTable + " (")
	for i, t := range types {
		if i > 0 {
			table.WriteString(", ")
		}
		fmt.Fprintf(&table, "lattice_c%d %s", i+1, t)
	}
	table.WriteString(")")
	copyIn := "COPY " + partialTable + " FROM STDIN"
	tx, end, before := s.txContext(), "COMMIT", 0
	if tx == "" {
		be.Send(&pgproto3.Query{String: "BEGIN; " + table.String() + " ON COMMIT DROP; " + copyIn})
	} else {
		be.Send(&pgproto3.Query{String: table.String()})
		be.Send(&pgproto3.Query{String: joinStatements(tx, copyIn)})
		end, before = "ROLLBACK; DROP TABLE pg_temp."+partialTable, 1
	}
	if err := be.Flush(); err != nil {
		return fail(err)
	}
	for {
		msg, err := be.Receive()
		if err != nil {
			return fail(err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyInResponse:
			return be, end
		case *pgproto3.ErrorResponse:
			return fail(sqlstate.New(m.Code, "%s", m.Message))
		case *pgproto3.ReadyForQuery:
			if before--; before < 0 {
				return fail(sqlstate.New(sqlstate.InternalError, "COPY of the partial rows did not start"))
			}
		}
	}
}

// copyLine appends one row in COPY text format to buf and sends buf once it
// is large.
func copyLine(be *pgshard.Conn, buf []byte, row [][]byte) ([]byte, error) {
	buf = appendCopyText(buf, row)
	if len(buf) < 1<<16 {
		return buf, nil
	}
	be.Send(&pgproto3.CopyData{Data: buf})
	if err := be.Flush(); err != nil {
		be.MarkBroken()
		return nil, err
	}
	return buf[:0], nil
}

// runFinal sends the final query, then end (what ends the transaction the
// final query ran in, if any, and drops a temporary table), and forwards
// the final query's rows. pending counts the ReadyForQuery messages of what
// was sent before.
func (s *session) runFinal(f *fanOut, x *exchange, be *pgshard.Conn, pending int, parse *pgproto3.Parse, bind *pgproto3.Bind, end string) error {
	if err := sendStatement(be, parse, []*pgproto3.Bind{bind}, f.simple, end); err != nil {
		return err
	}
	pending += statementAnswers(end)
	// Only the final query's own responses reach the client: those after
	// its BindComplete, up to its CommandComplete.
	const before, forwarding, after = 0, 1, 2
	phase := before
	for {
		msg, err := be.Receive()
		if err != nil {
			be.MarkBroken()
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			if pending--; pending == 0 {
				return nil
			}
		case *pgproto3.ErrorResponse:
			if !x.errored {
				x.errored = true
				s.send(clientPosition(f.stop.explain(m), f.client, be))
			}
		case *pgproto3.BindComplete:
			if phase == before {
				phase = forwarding
			}
		case *pgproto3.RowDescription, *pgproto3.DataRow, *pgproto3.CopyOutResponse, *pgproto3.CopyData, *pgproto3.CopyDone:
			if phase == forwarding && !x.errored {
				s.send(m)
			}
		case *pgproto3.CommandComplete:
			if phase == forwarding && !x.errored {
				s.send(m)
			}
			if phase == forwarding {
				phase = after
			}
		case *pgproto3.NoticeResponse:
			s.send(m)
		case *pgproto3.ParameterStatus:
		}
	}
}

// describeAggPortal describes the portal of an aggregating fan-out: its
// result is the statement's own, which the tree's template on the catalog
// node describes exactly.
func (s *session) describeAggPortal(ctx context.Context, portal *clientPortal) {
	be, err := s.describeBackend(ctx)
	if err != nil {
		s.fail(err)
		return
	}
	st := portal.stmt
	name := s.prepareOn(be, st.sql, st.oids, st.epoch)
	be.Send(&pgproto3.Describe{ObjectType: 'S', Name: name})
	s.x.add(step{kind: stepDescribeStmt, be: be, asPortal: true, formats: portal.resultFmt})
}
