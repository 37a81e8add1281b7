package proxy

import (
	"context"
	"encoding/binary"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// COPY FROM STDIN into a tree: the proxy reads the client's rows, finds each
// row's shard from its key field, and buffers the row, unchanged, for that
// shard. A full buffer is sent as one COPY into the shard's table on the
// node's backend; every node loads inside one transaction, committed by
// commitCopy once all rows are in, or rolled back everywhere on any error.
const (
	// copyShardBuffer is the size at which a shard's rows are sent.
	copyShardBuffer = 256 << 10
	// copyBufferTotal bounds the rows buffered for all shards together;
	// past it the largest buffer is sent.
	copyBufferTotal = 16 << 20
	// copyPipeline bounds the COPY commands sent to one backend whose
	// results were not read yet.
	copyPipeline = 8
)

// copyNode is one node's backend during COPY FROM.
type copyNode struct {
	be      *pgshard.Conn
	pending int // commands sent whose ReadyForQuery was not read yet
	// hidden counts the first of those, which bring the backend to the
	// session's settings and open its transaction: their tags are not
	// rows (a startup setting's set_config answers "SELECT 1").
	hidden int
	count  int64 // rows the node confirmed
	// sent are the client's line numbers of the rows of each COPY sent and
	// not answered yet, oldest first (copyShard.lines): a node numbers the
	// lines of each COPY from 1, in the context of an error
	// (clientLineContext).
	sent [][]byte
}

// copyShard buffers the rows of one shard.
type copyShard struct {
	schema string
	node   *copyNode
	data   []byte
	// lines are the client's line numbers of the rows in data, each as
	// the uvarint of its distance from the one before (the first from
	// 0): about a byte a row, as rows of one shard come close together.
	lines    []byte
	lastLine int64
}

// copyIn is the state of one COPY FROM STDIN into a tree.
type copyIn struct {
	ctx    context.Context
	plan   *router.Plan
	m      *shardmap.Map
	inTx   bool // the client's transaction holds the backends: no BEGIN or COMMIT of our own
	nodes  map[string]*copyNode
	order  []*copyNode // in order of first use
	shards map[int]*copyShard
	total  int // bytes buffered over all shards
	err    *pgproto3.ErrorResponse
	pull   *pullSource      // an INSERT ... SELECT's rows come from its SELECT, not the client
	held   []byte           // the SELECT's rows the proxy holds (insertpull.go)
	spec   *router.CopySpec // the plan's, or its first columns (router.CopySpec.FirstColumns)
	line   int64            // the client's line number of the last row routed: PostgreSQL's count, the header included
}

// copyOut is one COPY ... TO STDOUT over the nodes.
type copyOut struct {
	plan  *router.Plan
	parts []*pgshard.Conn
}

// startCopy queues a COPY of a tree. With the extended protocol the nodes
// still get simple Queries: a COPY takes no parameters.
func (s *session) startCopy(ctx context.Context, v *shardmap.View, p *router.Plan, pull *pullSource) {
	fail := func(err error) {
		s.fail(err)
	}
	m := v.Maps[p.Tree.Name]
	if m == nil {
		fail(sqlstate.New(sqlstate.SystemError, "tree %q has no shard map", p.Tree.Name))
		return
	}
	if s.txStatus() == 'E' {
		s.x.synthetic(errAbortedTx.Response())
		return
	}
	if p.Copy.From {
		if pull != nil {
			pull.view = v
			if src := p.Copy.Source; src != nil && src.Kind == router.FanOut {
				// Each node's part would aggregate its own shards.
				if err := s.uncombinedAggregate(ctx, src); err != nil {
					fail(err)
					return
				}
			}
		}
		ci := &copyIn{ctx: ctx, plan: p, m: m, inTx: s.tx.active,
			nodes: map[string]*copyNode{}, shards: map[int]*copyShard{}, pull: pull, spec: p.Copy}
		if p.Copy.Header && p.Copy.Format != router.CopyBinary {
			ci.line = 1 // PostgreSQL counts the header line
		}
		s.x.add(step{kind: stepCopy, copyIn: ci})
		return
	}
	if !p.Copy.Query || p.Copy.QueryKind != router.Single {
		if agg, err := s.srv.aggregateIn(ctx, s.tenant, p.Calls); err != nil || agg != "" {
			if err == nil {
				e := sqlstate.New(sqlstate.FeatureNotSupported, "COPY (SELECT ...) on tree %q calls aggregate %s, and aggregates over several shards are not supported yet", p.Tree.Name, agg)
				e.Hint = "fix the shard key in WHERE to read one shard, or aggregate in the application"
				err = e
			}
			fail(err)
			return
		}
	}
	r, err := router.Resolve(v, p, nil)
	if err != nil {
		fail(err)
		return
	}
	co := &copyOut{plan: p}
	for _, t := range r.Targets {
		be, err := s.backend(ctx, t.Node)
		if err != nil {
			fail(err)
			return
		}
		be.Send(&pgproto3.Query{String: t.SQL})
		co.parts = append(co.parts, be)
	}
	s.x.add(step{kind: stepCopy, copyOut: co})
}

// playCopy runs a COPY step. Only the client's loss is returned; other
// errors reach the client as an ErrorResponse.
func (s *session) playCopy(x *exchange, st *step) error {
	if st.copyOut != nil {
		return s.playCopyOut(x, st.copyOut)
	}
	if x.errored {
		return nil // what prepared the backends failed: no CopyInResponse
	}
	if st.refCopy != nil {
		return s.playRefCopy(x, st.refCopy)
	}
	if st.copyIn.pull != nil {
		return s.playInsertPull(x, st.copyIn)
	}
	return s.playCopyIn(x, st.copyIn)
}

func (s *session) playCopyIn(x *exchange, ci *copyIn) error {
	c := ci.spec
	format := int16(0)
	if c.Format == router.CopyBinary {
		format = 1
	}
	codes := make([]uint16, len(c.Columns))
	for i := range codes {
		codes[i] = uint16(format)
	}
	s.send(&pgproto3.CopyInResponse{OverallFormat: byte(format), ColumnFormatCodes: codes})
	if err := s.flush(); err != nil {
		ci.abandon(s)
		return err
	}
	rp := newRowParser(c, ci.plan.Tree.KeyColumn)
	for {
		msg, err := s.client.Receive()
		if err != nil {
			ci.abandon(s)
			s.receiveFailed(err)
			return errClientGone
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if ci.err != nil {
				continue // PostgreSQL too reads and drops the rest after an error
			}
			if err := rp.feed(m.Data); err != nil {
				ci.setErr(err)
				continue
			}
			ci.route(s, rp, false)
			continue
		case *pgproto3.CopyDone:
			if ci.err == nil {
				ci.route(s, rp, true)
			}
		case *pgproto3.CopyFail:
			ci.setErr(sqlstate.New(sqlstate.QueryCanceled, "COPY from stdin failed: %s", m.Message))
		case *pgproto3.Flush, *pgproto3.Sync:
			continue // ignored during COPY, as PostgreSQL does
		default:
			ci.setErr(sqlstate.New(sqlstate.ProtocolViolation, "unexpected message type 0x%02X during COPY from stdin", messageType(m)))
		}
		break
	}
	return s.endCopyIn(x, ci, "COPY ")
}

// endCopyIn sends the rows still buffered, reads every node's results and
// commits (outside the client's transaction), or rolls back after an
// error, and answers the client: the error, or tag and the rows loaded.
func (s *session) endCopyIn(x *exchange, ci *copyIn, tag string) error {
	if ci.err == nil {
		for _, sh := range ci.shards {
			if len(sh.data) > 0 {
				ci.flushShard(s, sh)
			}
		}
	}
	ci.drain(s)
	if ci.err == nil && !ci.inTx {
		ci.err = commitCopy(ci.ctx, s, ci.order)
	}
	if ci.err != nil {
		ci.rollback(s)
		if !x.errored {
			x.errored = true
			if ci.pull != nil {
				// The client sent an INSERT: the COPY that loads its rows
				// and that COPY's line numbers are the proxy's own.
				ci.err.Where = withoutCopyContext(ci.err.Where)
			}
			s.send(ci.err)
		}
		return nil
	}
	var n int64
	for _, cn := range ci.order {
		n += cn.count
	}
	s.send(commandComplete(tag + strconv.FormatInt(n, 10)))
	return nil
}

// messageType is the protocol type byte of a frontend message, for errors.
func messageType(m pgproto3.FrontendMessage) byte {
	b, err := m.Encode(nil)
	if err != nil || len(b) == 0 {
		return 0
	}
	return b[0]
}

func (ci *copyIn) setErr(err error) {
	if ci.err == nil {
		ci.err = sqlstate.As(err).Response()
	}
}

// route reads the complete rows the parser holds and buffers each for its shard.
func (ci *copyIn) route(s *session, rp *rowParser, final bool) {
	for ci.err == nil {
		row, slot, ok, err := rp.nextSlot(final, ci.plan.Tree, len(ci.m.Slots))
		if err != nil {
			ci.setErr(err)
			return
		}
		if !ok {
			return
		}
		ci.plan.Tree.Counters().Row(slot)
		sh := ci.shard(s, ci.m.Owner(slot))
		if sh == nil {
			return
		}
		if len(sh.data) == 0 && ci.spec.Format == router.CopyBinary {
			sh.data = append(sh.data, binaryHeader...)
			ci.total += len(binaryHeader)
		}
		sh.data = append(sh.data, row...)
		ci.total += len(row)
		ci.line++
		sh.lines = binary.AppendUvarint(sh.lines, uint64(ci.line-sh.lastLine))
		sh.lastLine = ci.line
		if ci.spec.Conflict != "" {
			// One statement per shard: a key given twice then fails as
			// PostgreSQL fails it (21000), rather than updating twice.
			continue
		}
		if len(sh.data) >= copyShardBuffer {
			ci.flushShard(s, sh)
		} else if ci.total >= copyBufferTotal {
			ci.flushShard(s, ci.largest())
		}
	}
}

// keyMessage drops the shardmap package's prefix from a key error, leaving
// PostgreSQL's own wording ("invalid input syntax for type bigint: ...").
func keyMessage(err error) string {
	msg := err.Error()
	prefix := shardmap.ErrBadKey.Error() + ": "
	if len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
		return msg[len(prefix):]
	}
	return msg
}

func (ci *copyIn) largest() *copyShard {
	var big *copyShard
	for _, sh := range ci.shards {
		if big == nil || len(sh.data) > len(big.data) {
			big = sh
		}
	}
	return big
}

// shard returns the buffer of a shard, taking its node's backend on first use.
func (ci *copyIn) shard(s *session, owner shardmap.Shard) *copyShard {
	if sh, ok := ci.shards[owner.Index]; ok {
		return sh
	}
	cn := ci.node(s, owner.Node)
	if cn == nil {
		return nil
	}
	sh := &copyShard{schema: shardmap.SchemaName(owner.Index), node: cn}
	ci.shards[owner.Index] = sh
	return sh
}

// node returns the load's backend on node, taking it on first use.
func (ci *copyIn) node(s *session, node string) *copyNode {
	cn, ok := ci.nodes[node]
	if !ok {
		// s.backend queues what brings the backend to the session's
		// settings (and, in a client transaction, its BEGIN) as steps of
		// the exchange being played; they are read here instead, as
		// commands whose results are pending.
		mark := len(s.x.steps)
		be, err := s.backend(ci.ctx, node)
		queued := len(s.x.steps) - mark
		s.x.steps = s.x.steps[:mark]
		if err != nil {
			ci.setErr(err)
			return nil
		}
		cn = &copyNode{be: be, pending: queued, hidden: queued}
		if !ci.inTx {
			be.Send(&pgproto3.Query{String: "BEGIN"})
			cn.pending++
			cn.hidden++
		}
		ci.nodes[node] = cn
		ci.order = append(ci.order, cn)
	}
	return cn
}

// flushShard sends a shard's buffered rows as one COPY (as one INSERT under
// the ON CONFLICT clause of an INSERT ... SELECT), without waiting for its
// result unless too many are pending on the backend.
func (ci *copyIn) flushShard(s *session, sh *copyShard) {
	cn := sh.node
	if ci.spec.Format == router.CopyBinary {
		sh.data = append(sh.data, 0xff, 0xff)
	}
	fe := cn.be
	if ci.spec.Conflict != "" {
		fe.Send(&pgproto3.Query{String: ci.spec.RenderUpsert(sh.schema, copyTextValues(sh.data))})
		sh.lines = sh.lines[:0]
	} else {
		fe.Send(&pgproto3.Query{String: ci.spec.RenderFrom(sh.schema)})
		fe.Send(&pgproto3.CopyData{Data: sh.data})
		fe.Send(&pgproto3.CopyDone{})
		cn.sent = append(cn.sent, sh.lines)
		sh.lines = nil
	}
	sh.lastLine = 0
	cn.pending++
	ci.total -= len(sh.data)
	if ci.spec.Format == router.CopyBinary {
		ci.total += 2
	}
	sh.data = sh.data[:0]
	if err := fe.Flush(); err != nil {
		ci.lost(s, cn, err)
		return
	}
	for cn.pending > copyPipeline && ci.err == nil {
		ci.readResult(s, cn)
	}
}

// readResult reads one command's responses from a node, up to ReadyForQuery.
func (ci *copyIn) readResult(s *session, cn *copyNode) { ci.readReply(s, cn, nil) }

// readReply reads one command's responses from a node, up to ReadyForQuery;
// the first error becomes the COPY's. see, when given, gets every other
// message but notices (rows, descriptions, the CommandComplete); without
// it the CommandComplete counts the rows loaded.
func (ci *copyIn) readReply(s *session, cn *copyNode, see func(pgproto3.BackendMessage)) {
	// Commands may still sit in the buffer: the BEGIN of a node whose rows
	// were never sent.
	if err := cn.be.Flush(); err != nil {
		ci.lost(s, cn, err)
		return
	}
	var lines []byte // the client's line numbers of a COPY's rows, once it started
	for {
		msg, err := cn.be.Receive()
		if err != nil {
			ci.lost(s, cn, err)
			return
		}
		switch m := msg.(type) {
		case *pgproto3.CopyInResponse:
			// The command is one of flushShard's COPYs, answered in the
			// order they were sent. One that failed before it started
			// takes none, and misnumbers only errors after the first,
			// which no client sees.
			if len(cn.sent) > 0 {
				lines, cn.sent = cn.sent[0], cn.sent[1:]
			}
			if see != nil {
				see(m)
			}
		case *pgproto3.ErrorResponse:
			if ci.err == nil {
				cp := *m // the message is reused by the next Receive
				cp.Where = clientLineContext(cp.Where, lines)
				ci.err = &cp
			}
		case *pgproto3.NoticeResponse:
			s.send(m)
		case *pgproto3.ReadyForQuery:
			cn.pending--
			if cn.hidden > 0 {
				cn.hidden--
			}
			return
		case *pgproto3.CommandComplete:
			cn.be.NoteCommand(m.CommandTag)
			if see == nil {
				if cn.hidden == 0 {
					cn.count += rowsAffected(m.CommandTag)
				}
				continue
			}
			see(m)
		case *pgproto3.ParameterStatus:
		default:
			if see != nil {
				see(m)
			}
		}
	}
}

func (ci *copyIn) lost(s *session, cn *copyNode, err error) {
	cn.be.MarkBroken()
	cn.pending = 0
	ci.setErr(backendLost(cn.be, err))
}

// drain reads every pending result.
func (ci *copyIn) drain(s *session) {
	for _, cn := range ci.order {
		for cn.pending > 0 && !cn.be.Broken() {
			ci.readResult(s, cn)
		}
	}
}

// commitCopy commits the per-node transactions of a COPY FROM: a plain
// COMMIT on one node, two-phase commit on several, so that the rows of every
// node become visible together or not at all.
func commitCopy(ctx context.Context, s *session, nodes []*copyNode) *pgproto3.ErrorResponse {
	if err := ctx.Err(); err != nil {
		return sqlstate.New(sqlstate.QueryCanceled, "canceling COPY: %v", err).Response()
	}
	conns := make([]*pgshard.Conn, len(nodes))
	for i, cn := range nodes {
		conns[i] = cn.be
	}
	var err error
	switch {
	case len(conns) == 0:
	case len(conns) == 1:
		err = execAll(ctx, conns, "COMMIT")[0]
	case s.srv.twoPhase == nil:
		execAll(ctx, conns, "ROLLBACK")
		err = sqlstate.New(sqlstate.FeatureNotSupported, "this COPY writes on %s, and this proxy has no two-phase commit coordinator", nodeList(conns))
	default:
		err = s.srv.twoPhase.commit(ctx, s.tenant, conns)
	}
	if err != nil {
		return sqlstate.As(err).Response()
	}
	return nil
}

// rollback undoes what a failed COPY loaded. In the client's transaction
// the error aborts that transaction, as an error does in PostgreSQL.
func (ci *copyIn) rollback(s *session) {
	if ci.inTx {
		for _, be := range s.tx.conns {
			if ci.nodes[be.Node] == nil {
				// This backend of the transaction took no rows, but the
				// error aborts the transaction there too.
				cn := &copyNode{be: be}
				ci.nodes[be.Node] = cn
				ci.order = append(ci.order, cn)
			}
		}
	}
	for _, cn := range ci.order {
		if cn.be.Broken() {
			continue
		}
		sql := "ROLLBACK"
		if ci.inTx {
			if cn.be.TxStatus == 'E' {
				continue
			}
			sql = "lattice aborts this transaction"
		}
		cn.be.Send(&pgproto3.Query{String: sql})
		if err := cn.be.Flush(); err != nil {
			cn.be.MarkBroken()
			continue
		}
		cn.pending++
		sub := &copyIn{}
		for cn.pending > 0 && !cn.be.Broken() {
			sub.readResult(s, cn)
		}
	}
	if ci.inTx && len(ci.order) == 0 {
		s.tx.failed = true
	}
	for _, cn := range ci.order {
		if cn.be.Broken() {
			s.dropBackend(cn.be)
		}
	}
}

// abandon gives up the backends when the client is gone: their
// transactions are rolled back by closing them.
func (ci *copyIn) abandon(s *session) {
	for _, cn := range ci.order {
		cn.be.MarkBroken()
		s.dropBackend(cn.be)
	}
}

// playCopyOut streams each node's COPY output to the client in turn: one
// CopyOutResponse, the rows, one CopyDone and the summed count. Binary
// output keeps the first node's header and a single trailer at the end.
func (s *session) playCopyOut(x *exchange, co *copyOut) error {
	binaryFmt := co.plan.Copy.Format == router.CopyBinary
	started := false
	var total int64
	for i, be := range co.parts {
		// Even a backend whose prologue failed runs its COPY: drain it.
		if be.Broken() {
			continue
		}
		skip := 0 // header bytes still to drop from this node's binary stream
		if binaryFmt && i > 0 {
			skip = len(binaryHeader)
		}
		var held []byte // binary: the last message, which ends with the trailer
		for done := false; !done; {
			msg, err := be.Receive()
			if err != nil {
				be.MarkBroken()
				x.failed[be] = true
				s.dropBackend(be)
				if !x.errored {
					x.errored = true
					s.send(backendLost(be, err).Response())
				}
				break
			}
			switch m := msg.(type) {
			case *pgproto3.CopyOutResponse:
				if !started && !x.errored {
					started = true
					s.send(m)
				}
			case *pgproto3.CopyData:
				if x.errored {
					continue
				}
				data := m.Data
				if binaryFmt {
					if skip > 0 {
						n := min(skip, len(data))
						skip -= n
						data = data[n:]
					}
					prev := held
					held = append(held[:0:0], data...)
					if len(prev) == 0 {
						continue
					}
					data = prev
				}
				if err := s.sendCopyData(data); err != nil {
					s.abandonParts(co.parts[i:])
					return err
				}
			case *pgproto3.CopyDone:
				if binaryFmt && len(held) >= 2 && !x.errored {
					if err := s.sendCopyData(held[:len(held)-2]); err != nil {
						s.abandonParts(co.parts[i:])
						return err
					}
				}
				held = nil
			case *pgproto3.CommandComplete:
				total += rowsAffected(m.CommandTag)
			case *pgproto3.ErrorResponse:
				x.failed[be] = true
				if !x.errored {
					x.errored = true
					s.send(m)
				}
			case *pgproto3.NoticeResponse:
				s.send(m)
			case *pgproto3.ParameterStatus:
			case *pgproto3.ReadyForQuery:
				done = true
			}
		}
	}
	if x.errored {
		return nil
	}
	if binaryFmt {
		if err := s.sendCopyData([]byte{0xff, 0xff}); err != nil {
			return err
		}
	}
	s.send(&pgproto3.CopyDone{})
	s.send(commandComplete("COPY " + strconv.FormatInt(total, 10)))
	return nil
}

// sendCopyData queues a CopyData for the client, flushing as results do.
func (s *session) sendCopyData(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	s.client.Send(&pgproto3.CopyData{Data: data})
	s.pendingBytes += len(data) + 5
	if s.pendingBytes > flushThreshold {
		return s.flush()
	}
	return nil
}

// abandonParts closes the backends still streaming COPY output to a client
// that is gone.
func (s *session) abandonParts(parts []*pgshard.Conn) {
	for _, be := range parts {
		be.MarkBroken()
		s.dropBackend(be)
	}
}

// withoutCopyContext drops the lines of an error's context that PostgreSQL
// adds for a COPY FROM ("COPY t, line 3[, column c: ...]").
func withoutCopyContext(where string) string {
	lines := strings.Split(where, "\n")
	kept := lines[:0]
	for _, l := range lines {
		if !strings.HasPrefix(l, "COPY ") {
			kept = append(kept, l)
		}
	}
	return strings.Join(kept, "\n")
}

// copyLineContext finds the line number in the context PostgreSQL gives an
// error of COPY FROM ("COPY t, line 3", then ", column c: ..." or the
// line's text).
var copyLineContext = regexp.MustCompile(`(?m)^(COPY [^\n]*?, line )([0-9]+)`)

// clientLineContext puts, in the context of an error of one of the proxy's
// COPYs into a shard, the client's line number of the failing row where
// the node gave its own: the node numbers the rows of each COPY it was
// sent from 1. lines are that COPY's (copyShard.lines); without them the
// context is left as it is.
func clientLineContext(where string, lines []byte) string {
	loc := copyLineContext.FindStringSubmatchIndex(where)
	if loc == nil || lines == nil {
		return where
	}
	n, err := strconv.Atoi(where[loc[4]:loc[5]])
	if err != nil || n < 1 {
		return where
	}
	var line int64
	for i := 0; i < n; i++ {
		d, k := binary.Uvarint(lines)
		if k <= 0 {
			return where
		}
		line += int64(d)
		lines = lines[k:]
	}
	return where[:loc[4]] + strconv.FormatInt(line, 10) + where[loc[5]:]
}
