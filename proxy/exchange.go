package proxy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/sqlstate"
)

// stepKind says which responses a step expects from its backend.
type stepKind int

const (
	stepSynthetic      stepKind = iota // responses made by the proxy itself
	stepQuery                          // a client's simple Query: everything up to ReadyForQuery
	stepHiddenQuery                    // a simple Query of the proxy's own: swallowed up to ReadyForQuery
	stepParse                          // Parse of a server-side statement: ParseComplete, swallowed
	stepAbort                          // a deliberately failing Parse that aborts the backend's transaction; swallowed
	stepBind                           // BindComplete
	stepDescribeStmt                   // ParameterDescription, then RowDescription or NoData
	stepDescribePortal                 // RowDescription or NoData
	stepExecute                        // DataRows, then CommandComplete, EmptyQueryResponse or PortalSuspended
	stepClose                          // CloseComplete
	stepSync                           // ReadyForQuery, swallowed: the proxy sends its own
	stepFanOut                         // the results of one SELECT on several nodes, merged
	stepCopy                           // COPY of a tree, run by the proxy against several backends
)

// step is one unit of expected responses, kept in client order so that
// responses of several backends and the proxy's own interleave correctly.
type step struct {
	kind stepKind
	be   *pgshard.Conn
	msgs []pgproto3.BackendMessage // stepSynthetic
	// staleRetry marks a step whose LT001 (slot moved) error is kept from the
	// client so that the statement can be routed again.
	staleRetry bool
	// rowsOnly suppresses RowDescription and CommandComplete: the statement is
	// one part of a split INSERT whose tag the proxy sums itself.
	rowsOnly bool
	split    *splitState
	// then runs when a synthetic step is played, for work that depends on
	// the responses before it.
	then func(x *exchange)
	// query marks a stepAbort sent as a simple Query, which ends with
	// ReadyForQuery rather than waiting for a Sync.
	query bool
	// hide swallows the step's responses other than errors.
	hide bool
	fan  *fanOut // stepFanOut
	// trim drops this many trailing columns from a RowDescription: the
	// hidden sort columns of a fan-out. capture keeps the full description.
	trim    int
	capture *fanOut
	// trimParams drops this many trailing types from a ParameterDescription:
	// the proxy's own parameters of a composed lattice function statement.
	trimParams int
	// tag receives the step's command tag.
	tag *string
	// asPortal answers a client's portal Describe with a statement
	// Describe: no ParameterDescription, and these result formats.
	asPortal bool
	formats  []int16
	copyIn   *copyIn  // stepCopy FROM STDIN
	copyOut  *copyOut // stepCopy TO STDOUT
	refCopy  *refCopy // stepCopy FROM STDIN into a reference table
	load     loadMark // counted at CommandComplete (load.go)
	// lead are rows of the proxy's sent before the step's first row or
	// its end: Lattice's plan ahead of a node's EXPLAIN (explain.go).
	lead []pgproto3.BackendMessage
	// client is the client's statement text the step serves (exchange.client).
	client string
	// more are the marks of the step's later statements, one per
	// CommandComplete after the first (load.go countLoad).
	more []loadMark
	// ahead is the client's Parse a stepParse answers: its ParseComplete
	// or error goes to the client (parseahead.go).
	ahead *parseAhead
	// leadTo is, for a hidden portal Describe, the index of the step whose
	// lead its RowDescription becomes (simpleprepared.go); 0 for none.
	leadTo int
}

// exchange collects the steps of one client round (a Query, or the extended
// messages up to Sync or Flush) and then plays the responses back.
type exchange struct {
	steps []step
	// failed marks backends that reported an error: they ignore everything up
	// to their Sync, so their remaining steps produce nothing.
	failed map[*pgshard.Conn]bool
	// errored is set once an error reached the client: PostgreSQL sends
	// nothing else before ReadyForQuery.
	errored bool
	// stale is the LT001 error held back from a staleRetry step.
	stale *pgproto3.ErrorResponse
	// sentSinceSync marks backends that were sent work in a part of the batch
	// already played at a Flush: they still need their Sync.
	sentSinceSync map[*pgshard.Conn]bool
	// client is the client's text of the statement being added: each step
	// takes it, so that a backend error's position can point into it.
	client string
	// pathSet: a statement bound in this round sets the search_path, which
	// the session records only once the round has played (shadowCheckAfter).
	pathSet bool
}

// uses reports whether the step reads responses of be: its own backend,
// or one of a fan-out's parts. A fan-out bound in an earlier batch of the
// transaction and executed in this one has only its parts here, and each
// needs this batch's Sync, or its node would keep the rows in its output
// buffer and the merge would wait for them forever.
func (st *step) uses(be *pgshard.Conn) bool {
	if st.be == be {
		return true
	}
	if st.fan != nil {
		for _, p := range st.fan.parts {
			if p.be == be {
				return true
			}
		}
	}
	return false
}

func (x *exchange) add(st step) {
	if st.client == "" {
		st.client = x.client
	}
	x.steps = append(x.steps, st)
}

func (x *exchange) synthetic(msgs ...pgproto3.BackendMessage) {
	x.add(step{kind: stepSynthetic, msgs: msgs})
}

// The answers the proxy gives to most extended-protocol messages, as
// shared lists: a synthetic step of its own list costs an allocation per
// message, several per statement. Steps only read their msgs.
var (
	parseCompleteMsgs = []pgproto3.BackendMessage{&pgproto3.ParseComplete{}}
	bindCompleteMsgs  = []pgproto3.BackendMessage{&pgproto3.BindComplete{}}
	closeCompleteMsgs = []pgproto3.BackendMessage{&pgproto3.CloseComplete{}}
	noDataMsgs        = []pgproto3.BackendMessage{&pgproto3.NoData{}}
	emptyQueryMsgs    = []pgproto3.BackendMessage{&pgproto3.EmptyQueryResponse{}}
)

// answer queues one of the shared answers above.
func (x *exchange) answer(msgs []pgproto3.BackendMessage) {
	x.add(step{kind: stepSynthetic, msgs: msgs})
}

func (x *exchange) reset() {
	x.steps = x.steps[:0]
	x.errored = false
	x.stale = nil
	x.pathSet = false
	clear(x.failed)
	clear(x.sentSinceSync)
}

// errClientGone means the client socket failed; the session ends.
var errClientGone = errors.New("client connection lost")

// play reads each step's responses in order and forwards them to the client.
// A backend I/O error marks that backend broken and ends the exchange with an
// error for the client.
func (s *session) play(x *exchange) error {
	for i := range x.steps {
		st := &x.steps[i]
		if st.kind == stepSynthetic {
			for _, m := range st.msgs {
				if x.errored {
					break
				}
				if _, ok := m.(*pgproto3.ErrorResponse); ok {
					x.errored = true
				}
				s.send(m)
			}
			if st.then != nil {
				st.then(x)
			}
			continue
		}
		if st.kind == stepFanOut {
			st.fan.client = st.client
			err := st.fan.play(s, x)
			if err == nil && !x.errored {
				st.fan.load.done(nil) // a read of each shard it merged
			}
			if err != nil {
				e := sqlstate.New(sqlstate.ConnectionFailure, "lost connection to a node: %v", err)
				for _, p := range st.fan.parts {
					if p.be.Broken() {
						if p.be.Refusal() != nil {
							e = backendLost(p.be, err)
						}
						x.failed[p.be] = true
						s.dropBackend(p.be)
					}
				}
				if !x.errored {
					x.errored = true
					s.send(e.Response())
				}
			}
			continue
		}
		if st.kind == stepCopy {
			if err := s.playCopy(x, st); err != nil {
				return err
			}
			continue
		}
		if x.failed[st.be] && st.kind != stepSync && st.kind != stepQuery && st.kind != stepHiddenQuery && !st.query {
			continue
		}
		if err := s.playStep(x, st); err != nil {
			st.be.MarkBroken()
			s.dropBackend(st.be)
			if errors.Is(err, errClientGone) {
				return err
			}
			if !x.errored {
				x.errored = true
				s.send(backendLost(st.be, err).Response())
			}
			// The other steps of this backend cannot complete.
			x.failed[st.be] = true
		}
	}
	return nil
}

func (s *session) playStep(x *exchange, st *step) error {
	be := st.be
	hidden := st.hide || st.kind == stepHiddenQuery || (st.kind == stepParse && st.ahead == nil) || st.kind == stepAbort || st.kind == stepSync
	for {
		msg, err := be.Receive()
		if s.copying != nil {
			switch msg.(type) {
			case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus, *pgproto3.NotificationResponse:
			default:
				s.copyOver(be)
			}
		}
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.CommandComplete:
			be.NoteCommand(m.CommandTag) // and on below
			s.noteWrite(st.load, m.CommandTag)
			st.countLoad(m.CommandTag)
		case *pgproto3.ErrorResponse:
			x.failed[be] = true
			if st.ahead != nil {
				s.parseFailed(st.ahead)
			}
			switch {
			case st.kind == stepAbort:
			case st.staleRetry && (m.Code == sqlstate.SlotMoved || st.kind == stepBind && pgshard.ResultTypeChanged(m)):
				cp := *m
				x.stale = &cp
			case !x.errored:
				x.errored = true
				s.send(clientPosition(m, st.client, be))
			}
			if st.kind == stepQuery || st.kind == stepHiddenQuery || st.kind == stepSync || st.query {
				continue // wait for ReadyForQuery
			}
			return nil
		case *pgproto3.NoticeResponse:
			if !hidden {
				s.send(m)
			}
			if st.then != nil {
				st.then(x)
			}
			continue
		case *pgproto3.ParameterStatus:
			if !hidden {
				s.send(m)
			}
			if st.then != nil {
				st.then(x)
			}
			continue
		case *pgproto3.NotificationResponse:
			s.send(m)
			continue
		case *pgproto3.RowDescription:
			if st.leadTo > 0 {
				s.holdRowDescription(x, st.leadTo, m)
			}
		case *pgproto3.ReadyForQuery:
			if st.kind == stepQuery || st.kind == stepHiddenQuery || st.kind == stepSync || st.query {
				return nil
			}
			return fmt.Errorf("unexpected ReadyForQuery")
		case *pgproto3.CopyInResponse:
			if st.kind != stepQuery && st.kind != stepExecute {
				return fmt.Errorf("unexpected CopyInResponse")
			}
			st.staleRetry = false // the client's rows cannot be sent twice
			s.send(m)
			if err := s.copyIn(be); err != nil {
				return err
			}
			continue
		}
		if x.errored && !hidden {
			// After an error the client expects nothing but ReadyForQuery;
			// drain what this backend still sends for the step.
			if done := stepDone(st.kind, msg); done {
				return nil
			}
			continue
		}
		if rd, ok := msg.(*pgproto3.RowDescription); ok && (st.trim > 0 || st.capture != nil) {
			if st.capture != nil {
				st.capture.fields = copyFields(rd.Fields)
			}
			msg = &pgproto3.RowDescription{Fields: rd.Fields[:len(rd.Fields)-st.trim]}
		}
		if pd, ok := msg.(*pgproto3.ParameterDescription); ok && st.trimParams > 0 && st.trimParams <= len(pd.ParameterOIDs) {
			msg = &pgproto3.ParameterDescription{ParameterOIDs: pd.ParameterOIDs[:len(pd.ParameterOIDs)-st.trimParams]}
		}
		if cc, ok := msg.(*pgproto3.CommandComplete); ok && st.tag != nil {
			*st.tag = string(cc.CommandTag)
		}
		if st.asPortal {
			switch m := msg.(type) {
			case *pgproto3.ParameterDescription:
				continue
			case *pgproto3.RowDescription:
				msg = &pgproto3.RowDescription{Fields: resultFields(m.Fields, st.formats)}
			}
		}
		if len(st.lead) > 0 && !hidden {
			switch msg.(type) {
			case *pgproto3.DataRow, *pgproto3.CommandComplete, *pgproto3.PortalSuspended:
				for _, l := range st.lead {
					s.send(l)
				}
				st.lead = nil
			}
		}
		if !hidden && !(st.rowsOnly && st.split.suppressed(msg)) {
			// What reached the client cannot be taken back by a retry.
			st.staleRetry = false
			s.send(msg)
		}
		if st.rowsOnly && st.split.order != nil && st.split.order.err != nil && !x.errored {
			// The parts' writes must not commit: the proxy's own
			// transaction rolls back on the error, the client's fails.
			x.errored = true
			s.send(st.split.order.err.Response())
			if s.tx.active {
				s.tx.failed = true
			}
		}
		if stepDone(st.kind, msg) {
			return nil
		}
	}
}

// stepDone reports whether msg is the last response of a step of kind k.
func stepDone(k stepKind, msg pgproto3.BackendMessage) bool {
	switch msg.(type) {
	case *pgproto3.ParseComplete:
		return k == stepParse
	case *pgproto3.BindComplete:
		return k == stepBind
	case *pgproto3.CloseComplete:
		return k == stepClose
	case *pgproto3.ParameterDescription:
		return false
	case *pgproto3.RowDescription, *pgproto3.NoData:
		return k == stepDescribeStmt || k == stepDescribePortal
	case *pgproto3.CommandComplete, *pgproto3.EmptyQueryResponse, *pgproto3.PortalSuspended:
		return k == stepExecute
	}
	return false
}

// suppressed keeps the per-shard command tags of a statement split across
// shards from the client, adding up their row counts, and lets only the
// first RowDescription through (RETURNING over a multi-statement Query).
func (sp *splitState) suppressed(msg pgproto3.BackendMessage) bool {
	switch m := msg.(type) {
	case *pgproto3.RowDescription:
		if sp.rowDescSent {
			return true
		}
		sp.rowDescSent = true
		return false
	case *pgproto3.CommandComplete:
		sp.count += rowsAffected(m.CommandTag)
		if sp.prefix == "" {
			sp.prefix = strings.TrimRight(string(m.CommandTag), "0123456789")
		}
		if sp.order != nil {
			sp.order.partDone()
		}
		return true
	case *pgproto3.DataRow:
		if sp.order != nil {
			sp.order.add(m.Values)
			return true
		}
	}
	return false
}

// tag is the command tag of the whole statement: the parts' verb with their
// counts added up ("UPDATE 7", "INSERT 0 3").
func (sp *splitState) tag() *pgproto3.CommandComplete {
	return commandComplete(sp.prefix + strconv.FormatInt(sp.count, 10))
}

// rowsAffected reads the count at the end of a command tag such as "INSERT 0 5".
func rowsAffected(tag []byte) int64 {
	var n int64
	mul := int64(1)
	for i := len(tag) - 1; i >= 0 && tag[i] >= '0' && tag[i] <= '9'; i-- {
		n += int64(tag[i]-'0') * mul
		mul *= 10
	}
	return n
}

// outMessages are a session's messages to backends on every statement's
// path, reused: a backend's Send encodes a message at once, so one of each
// per session serves every statement without an allocation. Each is
// cleared once sent, so that it holds no client data (a large parameter)
// past its statement.
type outMessages struct {
	bind pgproto3.Bind
	exec pgproto3.Execute
	desc pgproto3.Describe
	q    pgproto3.Query
	// params and paramBytes hold the parameters of sendBindText.
	params     [][]byte
	paramBytes []byte
}

// sendBind sends the client's Bind m to be, for its statement stmt and
// under portal.
func (o *outMessages) sendBind(be *pgshard.Conn, m *pgproto3.Bind, portal, stmt string) {
	o.bind = *m
	o.bind.DestinationPortal, o.bind.PreparedStatement = portal, stmt
	be.Send(&o.bind)
	o.bind = pgproto3.Bind{}
}

// maxKeptParamBytes bounds the buffer sendBindText keeps between
// statements: a larger statement's parameters get a buffer of their own.
const maxKeptParamBytes = 64 << 10

// sendBindText binds statement stmt on be to portal, with values as its
// text parameters and results in formats.
func (o *outMessages) sendBindText(be *pgshard.Conn, stmt string, values []string, portal string, formats []int16) {
	n := 0
	for _, v := range values {
		n += len(v)
	}
	buf, params := o.paramBytes[:0], o.params[:0]
	if cap(buf) < n {
		buf = make([]byte, 0, n)
		if n <= maxKeptParamBytes {
			o.paramBytes = buf
		}
	}
	for _, v := range values {
		at := len(buf)
		buf = append(buf, v...)
		params = append(params, buf[at:len(buf):len(buf)])
	}
	o.bind = pgproto3.Bind{DestinationPortal: portal, PreparedStatement: stmt, Parameters: params, ResultFormatCodes: formats}
	be.Send(&o.bind)
	o.bind = pgproto3.Bind{}
	clear(params)
	o.params = params[:0]
}

func (o *outMessages) sendExecute(be *pgshard.Conn, portal string, maxRows uint32) {
	o.exec = pgproto3.Execute{Portal: portal, MaxRows: maxRows}
	be.Send(&o.exec)
	o.exec = pgproto3.Execute{}
}

func (o *outMessages) sendDescribe(be *pgshard.Conn, obj byte, name string) {
	o.desc = pgproto3.Describe{ObjectType: obj, Name: name}
	be.Send(&o.desc)
	o.desc = pgproto3.Describe{}
}

func (o *outMessages) sendQuery(be *pgshard.Conn, sql string) {
	o.q = pgproto3.Query{String: sql}
	be.Send(&o.q)
	o.q = pgproto3.Query{}
}

// The three ReadyForQuery messages, shared: one per statement would be an
// allocation.
var readyIdle, readyInTx, readyFailed = &pgproto3.ReadyForQuery{TxStatus: 'I'}, &pgproto3.ReadyForQuery{TxStatus: 'T'}, &pgproto3.ReadyForQuery{TxStatus: 'E'}

func readyForQuery(status byte) *pgproto3.ReadyForQuery {
	switch status {
	case 'I':
		return readyIdle
	case 'T':
		return readyInTx
	case 'E':
		return readyFailed
	}
	return &pgproto3.ReadyForQuery{TxStatus: status}
}
