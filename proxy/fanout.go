package proxy

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/big"
	"strconv"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
)

// fanOut is one SELECT sent to every node that holds shards of its tree,
// merged back into one result: concatenated, or k-way merged on the ORDER BY
// keys, with OFFSET and LIMIT applied after the merge.
type fanOut struct {
	plan   *router.Plan
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
}

type fanPart struct {
	be   *pgshard.Conn
	row  [][]byte // the part's current row, copied out of the read buffer
	keys []sortValue
	done bool
}

// checkFields verifies that the sort keys point where the router meant: a
// position past the visible columns must be one of the hidden sort columns.
// The router expands * from the tree's recorded columns, which DDL run
// directly on a node could make stale.
func (f *fanOut) checkFields() error {
	visible := len(f.fields) - f.plan.Hidden
	if visible < 0 {
		return Errorf("XX000", "the nodes returned %d columns, fewer than the %d sort columns added", len(f.fields), f.plan.Hidden)
	}
	for _, k := range f.plan.Sort {
		switch {
		case k.Column >= len(f.fields):
			return Errorf("42P10", "ORDER BY position %d is not in select list", k.Column+1)
		case k.Column >= visible && !bytes.HasPrefix(f.fields[k.Column].Name, []byte("lattice_sort_")):
			e := Errorf("XX000", "the columns of tree %q differ from the ones Lattice recorded", f.plan.Tree.Name)
			e.Hint = "change a tree's columns through the proxy"
			return e
		}
	}
	return nil
}

// startFanOut sends a FanOut plan to every node holding shards of its tree.
// With bind nil it runs as simple Queries; otherwise each node's statement is
// prepared and bound with the client's parameters, and the returned fanOut
// is executed when the client sends Execute.
func (s *session) startFanOut(ctx context.Context, v *shardmap.View, p *router.Plan, bind *pgproto3.Bind, portal *clientPortal) *fanOut {
	extended := bind != nil
	m := v.Maps[p.Tree.Name]
	if m == nil {
		s.fail(Errorf("58000", "tree %q has no shard map", p.Tree.Name), extended)
		return nil
	}
	if agg, err := s.srv.aggregateIn(ctx, s.tenant, p.Calls); err != nil || agg != "" {
		if err == nil {
			e := Errorf("0A000", "SELECT on tree %q calls aggregate %s, which the proxy cannot combine over several shards", p.Tree.Name, agg)
			e.Hint = "fix the shard key in WHERE to read one shard, or aggregate in the application; count, sum, min, max and avg are combined"
			err = e
		}
		s.fail(err, extended)
		return nil
	}
	var oids []uint32
	if portal != nil {
		oids = portal.stmt.oids
	}
	r, err := router.Resolve(v, p, routerBind(bind, oids))
	if err != nil {
		s.fail(err, extended)
		return nil
	}
	nodes := make([]string, len(r.Targets))
	sqls := make([]string, len(r.Targets))
	for i, t := range r.Targets {
		nodes[i], sqls[i] = t.Node, t.SQL
	}
	if p.Agg != nil {
		return s.startAggFanOut(ctx, p, nodes, sqls, bind, portal)
	}
	f := &fanOut{plan: p, limit: r.Limit, offset: r.Offset, simple: !extended}
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
	live := f.parts[:0:0]
	for _, p := range f.parts {
		if !x.failed[p.be] {
			live = append(live, p)
		}
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
	if len(f.plan.Sort) == 0 {
		for _, p := range live {
			for {
				row, err := f.next(s, x, p, false)
				if err != nil {
					return err
				}
				if row == nil {
					break
				}
				emit(row)
			}
		}
	} else {
		for _, p := range live {
			if err := f.advance(s, x, p); err != nil {
				return err
			}
		}
		for {
			if x.errored {
				// Nothing more reaches the client, and a part's sort keys
				// may be missing: read every part to its end.
				for _, p := range live {
					for !p.done {
						if _, err := f.next(s, x, p, false); err != nil {
							return err
						}
					}
				}
				break
			}
			var best *fanPart
			for _, p := range live {
				if !p.done && (best == nil || f.less(p, best)) {
					best = p
				}
			}
			if best == nil {
				break
			}
			emit(best.row)
			if err := f.advance(s, x, best); err != nil {
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

// advance reads p's next row and decodes its sort keys.
func (f *fanOut) advance(s *session, x *exchange, p *fanPart) error {
	row, err := f.next(s, x, p, true)
	if err != nil || row == nil {
		return err
	}
	f.held += rowSize(row) - rowSize(p.row)
	p.row = row
	if x.errored {
		return nil
	}
	if err := s.overMemory(f.held); err != nil {
		x.errored = true
		s.send(err.Response())
		s.stopParts()
		return nil
	}
	if err := f.checkFields(); err != nil {
		x.errored = true
		s.send(AsError(err).Response())
		return nil
	}
	p.keys = p.keys[:0]
	for _, k := range f.plan.Sort {
		v, err := decodeSortValue(f.fields, k, row)
		if err != nil {
			x.errored = true
			s.send(AsError(err).Response())
			return nil
		}
		p.keys = append(p.keys, v)
	}
	return nil
}

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
				s.send(f.stop.explain(m))
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

// sortValue is a decoded sort key: nil for NULL, else one of int64, float64,
// *big.Rat (numeric, with nan/inf flags), bool, []byte (bytewise), or an
// ordered time instant.
type sortValue struct {
	null bool
	kind byte // 'i' int, 'f' float, 'n' numeric, 'b' bool, 'B' bytes, 't' time
	i    int64
	f    float64
	n    *big.Rat
	inf  int // numeric and time infinity: -1, +1; numeric NaN is 2 (greater than all)
	b    []byte
}

// decodeSortValue decodes the sort column of row with the result type the
// node reported. Only types whose order the proxy reproduces exactly are
// accepted; text only with a byte-order collation.
func decodeSortValue(fields []pgproto3.FieldDescription, k router.SortKey, row [][]byte) (sortValue, error) {
	if k.Column >= len(fields) || k.Column >= len(row) {
		return sortValue{}, Errorf("XX000", "sort column %d out of range", k.Column)
	}
	fd := fields[k.Column]
	raw := row[k.Column]
	if raw == nil {
		return sortValue{null: true}, nil
	}
	unsupported := func() error {
		e := Errorf("0A000", "ORDER BY on a column of type oid %d across several shards is not supported", fd.DataTypeOID)
		e.Hint = "order by integers, numerics, floats, booleans, dates, timestamps or uuids; for text add COLLATE \"C\" to the ORDER BY item"
		return e
	}
	switch fd.DataTypeOID {
	case pgtype.Int2OID, pgtype.Int4OID, pgtype.Int8OID, pgtype.OIDOID:
		var v int64
		if err := typeMap.Scan(fd.DataTypeOID, fd.Format, raw, &v); err != nil {
			return sortValue{}, Errorf("XX000", "decode sort key: %v", err)
		}
		return sortValue{kind: 'i', i: v}, nil
	case pgtype.Float4OID, pgtype.Float8OID:
		var v float64
		if err := typeMap.Scan(fd.DataTypeOID, fd.Format, raw, &v); err != nil {
			return sortValue{}, Errorf("XX000", "decode sort key: %v", err)
		}
		return sortValue{kind: 'f', f: v}, nil
	case pgtype.NumericOID:
		var v pgtype.Numeric
		if err := typeMap.Scan(fd.DataTypeOID, fd.Format, raw, &v); err != nil {
			return sortValue{}, Errorf("XX000", "decode sort key: %v", err)
		}
		return numericSortValue(v), nil
	case pgtype.BoolOID:
		var v bool
		if err := typeMap.Scan(fd.DataTypeOID, fd.Format, raw, &v); err != nil {
			return sortValue{}, Errorf("XX000", "decode sort key: %v", err)
		}
		return sortValue{kind: 'b', b: []byte{boolByte(v)}}, nil
	case pgtype.UUIDOID:
		var v pgtype.UUID
		if err := typeMap.Scan(fd.DataTypeOID, fd.Format, raw, &v); err != nil {
			return sortValue{}, Errorf("XX000", "decode sort key: %v", err)
		}
		return sortValue{kind: 'B', b: v.Bytes[:]}, nil
	case pgtype.DateOID:
		var v pgtype.Date
		if err := typeMap.Scan(fd.DataTypeOID, fd.Format, raw, &v); err != nil {
			return sortValue{}, unsupported()
		}
		return sortValue{kind: 't', i: v.Time.Unix(), inf: int(v.InfinityModifier)}, nil
	case pgtype.TimestampOID:
		var v pgtype.Timestamp
		if err := typeMap.Scan(fd.DataTypeOID, fd.Format, raw, &v); err != nil {
			return sortValue{}, unsupported()
		}
		return sortValue{kind: 't', i: v.Time.UnixMicro(), inf: int(v.InfinityModifier)}, nil
	case pgtype.TimestamptzOID:
		var v pgtype.Timestamptz
		if err := typeMap.Scan(fd.DataTypeOID, fd.Format, raw, &v); err != nil {
			return sortValue{}, unsupported()
		}
		return sortValue{kind: 't', i: v.Time.UnixMicro(), inf: int(v.InfinityModifier)}, nil
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.NameOID:
		if k.ByteOrder && fd.Format == 0 {
			return sortValue{kind: 'B', b: raw}, nil
		}
	}
	return sortValue{}, unsupported()
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func numericSortValue(v pgtype.Numeric) sortValue {
	switch {
	case v.NaN:
		return sortValue{kind: 'n', inf: 2}
	case v.InfinityModifier != pgtype.Finite:
		return sortValue{kind: 'n', inf: int(v.InfinityModifier)}
	}
	r := new(big.Rat).SetInt(v.Int)
	if v.Exp > 0 {
		r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(v.Exp)), nil)))
	} else if v.Exp < 0 {
		r.Quo(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(-v.Exp)), nil)))
	}
	return sortValue{kind: 'n', n: r}
}

// less orders two parts' current rows as PostgreSQL's ORDER BY would.
func (f *fanOut) less(a, b *fanPart) bool {
	for i, k := range f.plan.Sort {
		c := compareSort(a.keys[i], b.keys[i], k.NullsFirst)
		if k.Desc {
			c = -c
			// NULLS FIRST/LAST is about position, not value: undo the flip.
			if a.keys[i].null != b.keys[i].null {
				c = -c
			}
		}
		if c != 0 {
			return c < 0
		}
	}
	return false
}

func compareSort(a, b sortValue, nullsFirst bool) int {
	switch {
	case a.null && b.null:
		return 0
	case a.null:
		if nullsFirst {
			return -1
		}
		return 1
	case b.null:
		if nullsFirst {
			return 1
		}
		return -1
	}
	switch a.kind {
	case 'i':
		return cmpInt(a.i, b.i)
	case 'f':
		// PostgreSQL orders NaN above every other value, equal to itself.
		an, bn := math.IsNaN(a.f), math.IsNaN(b.f)
		switch {
		case an && bn:
			return 0
		case an:
			return 1
		case bn:
			return -1
		case a.f < b.f:
			return -1
		case a.f > b.f:
			return 1
		}
		return 0
	case 'n':
		if a.inf != 0 || b.inf != 0 {
			return cmpInt(int64(a.inf), int64(b.inf))
		}
		return a.n.Cmp(b.n)
	case 't':
		if a.inf != 0 || b.inf != 0 {
			if c := cmpInt(int64(a.inf), int64(b.inf)); c != 0 {
				return c
			}
			if a.inf != 0 {
				return 0
			}
		}
		return cmpInt(a.i, b.i)
	}
	return bytes.Compare(a.b, b.b)
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sendParts sends each node its part of a fan-out: with bind nil as a simple
// Query, sent only once every node's backend is at hand (a Query sent before
// a later node is refused would have no step to read it); otherwise bound
// with the client's parameters as a portal part, executed at Execute.
// partOIDs are the parameter types of every part's statement.
func (s *session) sendParts(ctx context.Context, f *fanOut, nodes, sqls []string, bind *pgproto3.Bind, portal *clientPortal, partOIDs []uint32) bool {
	for i, node := range nodes {
		if bind != nil {
			name := bind.DestinationPortal
			if i > 0 {
				name = "lattice_part_" + strconv.Itoa(i) + "_" + bind.DestinationPortal
			}
			part := &clientPortal{stmt: &clientStmt{sql: sqls[i], oids: partOIDs, epoch: portal.stmt.epoch}}
			if !s.bindOn(ctx, part, node, sqls[i], bind, name, i > 0) {
				return false
			}
			portal.parts = append(portal.parts, part.parts...)
			f.parts = append(f.parts, &fanPart{be: part.parts[0].be})
			continue
		}
		be, err := s.backend(ctx, node)
		if err != nil {
			s.fail(err, false)
			return false
		}
		f.parts = append(f.parts, &fanPart{be: be})
	}
	if bind == nil {
		for i, part := range f.parts {
			part.be.Send(&pgproto3.Query{String: sqls[i]})
		}
		s.x.add(step{kind: stepFanOut, fan: f})
	}
	return true
}
