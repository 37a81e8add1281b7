package pgshard

import (
	"bytes"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// requestKind is a request whose answer the backend's state depends on.
type requestKind byte

const (
	reqParse requestKind = iota + 1
	reqBind
	reqClose
	// reqSync is a Sync or a simple Query: the backend answers it with
	// ReadyForQuery, and after an error it skips every request up to it.
	reqSync
)

type request struct {
	kind requestKind
	name string // reqParse: statement; reqBind: portal; reqClose: statement or portal
	stmt string // reqBind: the statement bound
	obj  byte   // reqClose: 'S' or 'P'
	text string // reqParse, reqSync of a Query: the statement text
}

// resultEpoch counts the times a statement's result columns were seen to
// change (DDL through the proxy, or a backend's "cached plan must not change
// result type"). A client statement parsed in a later epoch is prepared anew
// on the backends, as it would be on PostgreSQL.
var resultEpoch atomic.Uint64

// ResultEpoch is the current result epoch (see resultEpoch).
func ResultEpoch() uint64 { return resultEpoch.Load() }

// ResultsChanged starts a new result epoch: run after DDL that may change
// the columns of prepared statements.
func ResultsChanged() { resultEpoch.Add(1) }

// ResultTypeChanged reports PostgreSQL's refusal to run a prepared
// statement whose result columns changed since it was parsed.
func ResultTypeChanged(e *pgproto3.ErrorResponse) bool {
	return e.Code == sqlstate.FeatureNotSupported && strings.HasPrefix(e.Message, "cached plan must not change result type")
}

// Send queues msg for the backend and notes the requests whose answers
// Receive must match.
func (c *Conn) Send(msg pgproto3.FrontendMessage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch m := msg.(type) {
	case *pgproto3.Parse:
		c.push(request{kind: reqParse, name: m.Name, text: m.Query})
	case *pgproto3.Bind:
		c.push(request{kind: reqBind, name: m.DestinationPortal, stmt: m.PreparedStatement})
	case *pgproto3.Close:
		c.push(request{kind: reqClose, name: m.Name, obj: m.ObjectType})
	case *pgproto3.Query:
		c.push(request{kind: reqSync, text: m.String})
	case *pgproto3.Sync:
		c.push(request{kind: reqSync})
	}
	c.fe.Send(msg)
}

// Flush writes what Send queued, in one system call.
func (c *Conn) Flush() error { return c.fe.Flush() }

// Receive reads the backend's next message and applies it to the state the
// proxy keeps of the backend, in the manner of pgconn's receiveMessage. Every
// reader of backend messages goes through it. An I/O error or an answer that
// matches no request marks the connection broken.
func (c *Conn) Receive() (pgproto3.BackendMessage, error) {
	msg, err := c.fe.Receive()
	if err != nil {
		c.broken = true
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch m := msg.(type) {
	case *pgproto3.ParseComplete:
		c.answered(reqParse)
	case *pgproto3.BindComplete:
		if r, ok := c.answered(reqBind); ok && r.name != "" {
			c.portals[r.name] = true
		}
	case *pgproto3.CloseComplete:
		if r, ok := c.answered(reqClose); ok && r.obj == 'P' {
			delete(c.portals, r.name)
		}
	case *pgproto3.ErrorResponse:
		c.failed(m)
	case *pgproto3.ReadyForQuery:
		c.ready(m.TxStatus)
	case *pgproto3.ParameterStatus:
		c.Params[m.Name] = m.Value
		if err := c.checkParams(map[string]string{m.Name: m.Value}); err != nil {
			// What the backend runs next would be read otherwise than the
			// proxy planned it: it serves nothing more.
			c.broken, c.refusal = true, err
			return nil, err
		}
	case *pgproto3.CommandComplete:
		switch tag := m.CommandTag; {
		case string(tag) == "DISCARD ALL":
			c.ForgetAllPrepared()
			clear(c.portals)
		case string(tag) == "DEALLOCATE ALL":
			c.ForgetAllPrepared()
		case changesResults(tag):
			ResultsChanged()
		}
	}
	return msg, nil
}

// checkParams applies Pools' CheckParam to reported settings.
func (c *Conn) checkParams(params map[string]string) error {
	if c.checkParam == nil {
		return nil
	}
	for name, value := range params {
		if err := c.checkParam(name, value); err != nil {
			return err
		}
	}
	return nil
}

// changesResults reports whether a command with this tag may change what a
// statement prepared before it means: its result columns (ALTER TABLE, DROP
// VIEW, CREATE OR REPLACE VIEW) or the types it resolved (a CREATE TYPE in a
// transaction that is rolled back leaves statements naming a type gone).
func changesResults(tag []byte) bool {
	return bytes.HasPrefix(tag, []byte("ALTER ")) || bytes.HasPrefix(tag, []byte("DROP ")) || bytes.HasPrefix(tag, []byte("CREATE "))
}

// push queues a request whose answer Receive must match.
func (c *Conn) push(r request) {
	if len(c.pending) == cap(c.pending) && c.head > 0 {
		// A queue that never empties (a long pipeline) moves down
		// rather than growing without end.
		n := copy(c.pending, c.pending[c.head:])
		clear(c.pending[n:])
		c.pending, c.head = c.pending[:n], 0
	}
	c.pending = append(c.pending, r)
}

// queued are the requests not answered yet, oldest first.
func (c *Conn) queued() []request { return c.pending[c.head:] }

// pop drops the oldest queued request. The queue's array is reused once
// it empties, so that a statement's requests cost no allocation.
func (c *Conn) pop() {
	c.pending[c.head] = request{}
	c.head++
	if c.head == len(c.pending) {
		c.pending, c.head = c.pending[:0], 0
	}
}

// answered pops the oldest pending request, which must be of kind k.
func (c *Conn) answered(k requestKind) (request, bool) {
	q := c.queued()
	if len(q) == 0 || q[0].kind != k {
		c.broken = true
		return request{}, false
	}
	r := q[0]
	c.pop()
	return r, true
}

// failed applies an error: the request that failed, and every one after it
// up to the next Sync, which the backend skips, did nothing.
func (c *Conn) failed(e *pgproto3.ErrorResponse) {
	if e.Severity == "FATAL" || e.Severity == "PANIC" {
		c.broken = true
	}
	c.failedText = ""
	if q := c.queued(); len(q) > 0 {
		c.failedText = q[0].text
	}
	if ResultTypeChanged(e) {
		// The statement's columns changed under it: PostgreSQL will fail
		// every Bind of it from now on, so it is prepared anew next time.
		if q := c.queued(); len(q) > 0 && q[0].kind == reqBind {
			if name := q[0].stmt; c.names[name] != "" {
				c.forgetName(name)
				c.toClose = append(c.toClose, name)
			}
		}
		ResultsChanged()
	}
	for q := c.queued(); len(q) > 0 && q[0].kind != reqSync; q = c.queued() {
		c.skipped(q[0])
		c.pop()
	}
}

// skipped undoes what the proxy recorded when it sent r, which the backend
// did not run.
func (c *Conn) skipped(r request) {
	switch r.kind {
	case reqParse:
		c.forgetName(r.name)
	case reqClose:
		if r.obj == 'S' && r.name != "" {
			c.toClose = append(c.toClose, r.name) // still there: close it later
		}
	}
}

// ready applies a ReadyForQuery: the requests up to its Sync are done, and
// out of a transaction block no portal is left.
func (c *Conn) ready(status byte) {
	c.TxStatus = status
	c.failedText = "" // read at the error; not kept to pin a large text
	for q := c.queued(); len(q) > 0; q = c.queued() {
		r := q[0]
		c.pop()
		if r.kind == reqSync {
			break
		}
		// Unanswered before its Sync: only after an error, which failed
		// has applied already; an answer went missing otherwise.
		c.broken = true
		c.skipped(r)
	}
	if status == 'I' {
		clear(c.portals)
	}
}

// FailedText is the statement text of the Parse or Query the backend's
// last error answered, "" when that error answered another request.
func (c *Conn) FailedText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failedText
}

// Idle reports whether every request sent was answered.
func (c *Conn) Idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queued()) == 0
}
