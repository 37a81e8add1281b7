package proxy

import (
	"context"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// A composed Function plan (router.Plan.Compose) is a SELECT around
// lattice_* calls. The proxy evaluates each call once, then PostgreSQL runs
// the rest of the statement over their rows on the catalog node (or where
// the session's transaction is, when the statement names no relation):
// each FROM call becomes unnest() of one typed array per column, under the
// call's alias and column names, and each call used as a value becomes one
// typed value. In the extended protocol the arrays are parameters after the
// client's, so the final statement's text is fixed and is prepared once per
// backend; the calls run at Bind, where PostgreSQL takes a portal's
// snapshot, so Describe runs none. The simple protocol inlines them as
// literals. Column names and types are then PostgreSQL's own.

// maxComposedBytes bounds the rows of one statement's calls that the proxy
// holds and sends.
const maxComposedBytes = 16 << 20

// composedCall is one evaluated call: its columns, and per column the
// text of each row's value (nil for NULL).
type composedCall struct {
	fields []pgproto3.FieldDescription
	cols   [][][]byte
}

// composedFields describes the columns of every call of c.
func (s *session) composedFields(c *router.ComposePlan) ([][]pgproto3.FieldDescription, error) {
	out := make([][]pgproto3.FieldDescription, len(c.Calls))
	for i, cc := range c.Calls {
		fields, err := s.describeFunction(cc.Call.Name)
		if err != nil {
			return nil, err
		}
		if !cc.From && len(fields) != 1 {
			return nil, sqlstate.New(sqlstate.FeatureNotSupported, "%s returns %d columns: it composes as a FROM item, not as a value", cc.Call.Name, len(fields))
		}
		out[i] = fields
	}
	return out, nil
}

// evalComposed runs every call of c with the arguments args gives.
func (s *session) evalComposed(ctx context.Context, c *router.ComposePlan, args func(*router.FuncCall) ([]*string, map[string]*string, error)) ([]composedCall, error) {
	fields, err := s.composedFields(c)
	if err != nil {
		return nil, err
	}
	out := make([]composedCall, len(c.Calls))
	size := 0
	for i, cc := range c.Calls {
		pos, named, err := args(cc.Call)
		if err != nil {
			return nil, err
		}
		rows, err := s.srv.functions.Call(ctx, s.tenant, cc.Call.Name, pos, named)
		if err != nil {
			return nil, err
		}
		if !cc.From && len(rows) != 1 {
			return nil, sqlstate.New(sqlstate.CardinalityViolation, "%s returned %d rows where one value is needed", cc.Call.Name, len(rows))
		}
		enc, err := encodeRows(resultFields(fields[i], nil), rows)
		if err != nil {
			return nil, sqlstate.New(sqlstate.InternalError, "%v", err)
		}
		cols := make([][][]byte, len(fields[i]))
		for j := range cols {
			cols[j] = make([][]byte, len(enc))
			for r, row := range enc {
				cols[j][r] = row[j]
				size += len(row[j])
			}
		}
		if size > maxComposedBytes {
			return nil, sqlstate.New(sqlstate.ProgramLimitExceeded, "the lattice functions of this statement returned more than %d bytes", maxComposedBytes)
		}
		out[i] = composedCall{fields: fields[i], cols: cols}
	}
	return out, nil
}

// renderComposed is the final statement; arg(call, col) is the SQL of the
// array (FROM) or value of column col of call.
func renderComposed(c *router.ComposePlan, fields [][]pgproto3.FieldDescription, arg func(call, col int) string) (string, error) {
	places := make([]string, len(c.Calls))
	for i, cc := range c.Calls {
		var b strings.Builder
		if !cc.From {
			t, err := typeName(fields[i][0].DataTypeOID)
			if err != nil {
				return "", err
			}
			places[i] = "(" + arg(i, 0) + "::" + t + ")"
			continue
		}
		b.WriteString("unnest(")
		for j, fd := range fields[i] {
			t, err := typeName(fd.DataTypeOID)
			if err != nil {
				return "", err
			}
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString(arg(i, j) + "::" + t + "[]")
		}
		b.WriteString(")")
		if cc.Ordinality {
			b.WriteString(" WITH ORDINALITY")
		}
		alias := cc.Alias
		if alias == "" {
			alias = cc.Call.Name
		}
		// PostgreSQL's names: the alias list first, then the function's
		// columns; a function of one column takes the alias as its name.
		names := make([]string, 0, len(fields[i])+1)
		for _, fd := range fields[i] {
			names = append(names, string(fd.Name))
		}
		if len(names) == 1 && cc.Alias != "" {
			names[0] = cc.Alias
		}
		if cc.Ordinality {
			names = append(names, "ordinality")
		}
		// More aliases than columns: PostgreSQL's own error says so.
		names = append(append([]string(nil), cc.Columns...), names[min(len(cc.Columns), len(names)):]...)
		b.WriteString(" AS " + quoteIdent(alias) + "(")
		for j, n := range names {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString(quoteIdent(n))
		}
		b.WriteString(")")
		places[i] = b.String()
	}
	return c.Render(func(i int) string { return places[i] }), nil
}

// typeName is the name PostgreSQL knows a function column's type by.
func typeName(oid uint32) (string, error) {
	t, ok := typeMap.TypeForOID(oid)
	if !ok {
		return "", sqlstate.New(sqlstate.InternalError, "a lattice function column has type oid %d, which the proxy cannot name", oid)
	}
	return t.Name, nil
}

// arrayOID is the array type of a function column's type.
func arrayOID(oid uint32) (uint32, error) {
	name, err := typeName(oid)
	if err != nil {
		return 0, err
	}
	t, ok := typeMap.TypeForName("_" + name)
	if !ok {
		return 0, sqlstate.New(sqlstate.InternalError, "no array type of %s", name)
	}
	return t.OID, nil
}

// arrayText is the text form of a one-dimensional array of these values.
func arrayText(vals [][]byte) []byte {
	b := []byte{'{'}
	for i, v := range vals {
		if i > 0 {
			b = append(b, ',')
		}
		if v == nil {
			b = append(b, "NULL"...)
			continue
		}
		b = append(b, '"')
		for _, c := range v {
			if c == '"' || c == '\\' {
				b = append(b, '\\')
			}
			b = append(b, c)
		}
		b = append(b, '"')
	}
	return append(b, '}')
}

// escapeLiteral quotes text as an E” literal, which reads the same
// whatever standard_conforming_strings says.
func escapeLiteral(v []byte) string {
	var b strings.Builder
	b.WriteString("E'")
	for _, c := range v {
		switch c {
		case '\\':
			b.WriteString(`\\`)
		case '\'':
			b.WriteString("''")
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// composedLiteral is the SQL of column col of an evaluated call: an array
// literal in FROM, the value itself (or NULL) as a value.
func composedLiteral(cc router.ComposedCall, r composedCall, col int) string {
	if cc.From {
		return escapeLiteral(arrayText(r.cols[col]))
	}
	if v := r.cols[col][0]; v != nil {
		return escapeLiteral(v)
	}
	return "NULL"
}

// simpleComposed binds a composed statement of a simple Query: the rows of
// its calls go into the final statement as literals.
func (s *session) simpleComposed(ctx context.Context, portal *clientPortal) bool {
	p := portal.stmt.plan
	c := p.Compose
	res, err := s.evalComposed(ctx, c, func(f *router.FuncCall) ([]*string, map[string]*string, error) {
		return s.funcArgs(f, &noParams, nil)
	})
	if err != nil {
		s.fail(err)
		return false
	}
	fields := make([][]pgproto3.FieldDescription, len(res))
	for i := range res {
		fields[i] = res[i].fields
	}
	sql, err := renderComposed(c, fields, func(call, col int) string { return composedLiteral(c.Calls[call], res[call], col) })
	if err != nil {
		s.fail(err)
		return false
	}
	return s.bindOn(ctx, portal, s.catalogTarget(p), sql, &noParams, "", false)
}

// composedStmt is the final statement of a composed plan in the extended
// protocol: its text with $n in the place of the rows, its parameter types
// (the client's, then the proxy's), and the number of the client's.
type composedStmt struct {
	sql    string
	oids   []uint32
	client int
}

// composedStatement prepares the final statement of st's composed plan.
// Parameters that only a lattice call uses take the call's argument types,
// which are also recorded in st.oids, as Describe reports them, so that
// Bind decodes binary arguments by them.
func (s *session) composedStatement(st *clientStmt) (*composedStmt, error) {
	c := st.plan.Compose
	fields, err := s.composedFields(c)
	if err != nil {
		return nil, err
	}
	client := max(c.Params, len(st.oids))
	oids := make([]uint32, client)
	copy(oids, st.oids)
	for _, cc := range c.Calls {
		for n := 1; n <= client; n++ {
			if oids[n-1] == 0 && callUses(cc.Call, n) {
				oids[n-1] = s.funcParamType(cc.Call, n)
			}
		}
	}
	st.oids = append(st.oids[:0:0], oids...)
	first := make([]int, len(c.Calls)) // the proxy's first parameter of each call
	for i, cc := range c.Calls {
		first[i] = len(oids) + 1
		for _, fd := range fields[i] {
			oid := fd.DataTypeOID
			if cc.From {
				if oid, err = arrayOID(oid); err != nil {
					return nil, err
				}
			}
			oids = append(oids, oid)
		}
	}
	sql, err := renderComposed(c, fields, func(call, col int) string { return "$" + strconv.Itoa(first[call]+col) })
	if err != nil {
		return nil, err
	}
	return &composedStmt{sql: sql, oids: oids, client: client}, nil
}

func callUses(f *router.FuncCall, n int) bool {
	for _, a := range f.Args {
		if a.Param == n {
			return true
		}
	}
	for _, a := range f.Named {
		if a.Param == n {
			return true
		}
	}
	return false
}

// describeComposed describes a composed statement by its final statement,
// on the backend statements are described on; the proxy's own parameters
// are kept from the client. No lattice call runs.
func (s *session) describeComposed(ctx context.Context, st *clientStmt) {
	cs, err := s.composedStatement(st)
	if err != nil {
		s.fail(err)
		return
	}
	be, err := s.describeBackend(ctx)
	if err != nil {
		s.fail(err)
		return
	}
	name := s.prepareOn(be, cs.sql, cs.oids, st.epoch)
	be.Send(&pgproto3.Describe{ObjectType: 'S', Name: name})
	s.x.add(step{kind: stepDescribeStmt, be: be, trimParams: len(cs.oids) - cs.client})
}

// bindComposed evaluates the calls of a composed statement with the Bind's
// arguments and binds the final statement on the catalog node (or the
// transaction's node), the client's parameters first, then the rows.
func (s *session) bindComposed(ctx context.Context, portal *clientPortal, m *pgproto3.Bind) bool {
	if s.simple {
		return s.simpleComposed(ctx, portal)
	}
	st := portal.stmt
	c := st.plan.Compose
	cs, err := s.composedStatement(st)
	if err != nil {
		s.fail(err)
		return false
	}
	if len(m.Parameters) != cs.client {
		s.fail(sqlstate.New(sqlstate.ProtocolViolation, "bind message supplies %d parameters, but prepared statement \"%s\" requires %d", len(m.Parameters), m.PreparedStatement, cs.client))
		return false
	}
	res, err := s.evalComposed(ctx, c, func(f *router.FuncCall) ([]*string, map[string]*string, error) {
		return s.funcArgs(f, m, st.oids)
	})
	if err != nil {
		s.fail(err)
		return false
	}
	b := *m
	b.Parameters = append([][]byte(nil), m.Parameters...)
	b.ParameterFormatCodes = make([]int16, cs.client, len(cs.oids))
	for i := range b.ParameterFormatCodes {
		b.ParameterFormatCodes[i] = formatFor(m.ParameterFormatCodes, i)
	}
	for i, cc := range c.Calls {
		for _, col := range res[i].cols {
			var v []byte
			if cc.From {
				v = arrayText(col) // of no rows too
			} else {
				v = col[0] // a value: one row, nil is NULL
			}
			b.Parameters = append(b.Parameters, v)
			b.ParameterFormatCodes = append(b.ParameterFormatCodes, 0)
		}
	}
	part := &clientPortal{stmt: &clientStmt{sql: cs.sql, oids: cs.oids, epoch: st.epoch}}
	if !s.bindOn(ctx, part, s.catalogTarget(st.plan), cs.sql, &b, m.DestinationPortal, false) {
		return false
	}
	portal.parts = append(portal.parts, part.parts...)
	return true
}
