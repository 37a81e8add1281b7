package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// maxListenQueue bounds what the listen backend sent and the session has not
// handled yet. Beyond it the reader stops reading, and the backend's socket
// pushes back on PostgreSQL as a slow client would.
const maxListenQueue = 1024

// listener is the backend on the catalog node that a session holds once it
// runs LISTEN: notifications are delivered to the backend that listens, so
// it cannot go back to the transaction pool. One goroutine reads it, so that
// notifications can reach the client while the session waits for the client.
type listener struct {
	be   *pgshard.Conn
	conn net.Conn // the client socket, written by the reader only while idle
	done chan struct{}

	mu    sync.Mutex
	cond  *sync.Cond
	queue []pgproto3.BackendMessage
	// idle: the client is between queries outside a transaction, and the
	// session writes nothing, so the reader forwards notifications itself.
	idle bool
	// stopAfterReady ends the reader after the next ReadyForQuery, leaving
	// the backend at a message boundary so that it can be pooled again.
	stopAfterReady bool
	closed         bool  // the reader has stopped
	err            error // why the reader stopped, if not on request
	clientErr      error // a write to the client failed while idle
}

func isListenPlan(p *router.Plan) bool {
	if p == nil || p.Kind != router.Catalog {
		return false
	}
	w := leadingWord(p.SQL)
	return strings.EqualFold(w, "LISTEN") || strings.EqualFold(w, "UNLISTEN")
}

// unlistenAll reports whether sql is UNLISTEN *.
func unlistenAll(sql string) bool {
	words := sqlWords(sql, 1)
	if len(words) != 1 || !strings.EqualFold(words[0], "UNLISTEN") {
		return false
	}
	rest := strings.TrimSpace(sql[strings.Index(strings.ToUpper(sql), "UNLISTEN")+len("UNLISTEN"):])
	return strings.TrimRight(rest, "; \t\r\n") == "*"
}

func (s *session) startListener(ctx context.Context) error {
	be, err := s.srv.pools.AcquireHeld(ctx, s.user, s.srv.catalogNode, s.tenant)
	if err != nil {
		if errors.Is(err, pgshard.ErrTooManyHeld) || errors.Is(err, pgshard.ErrPoolExhausted) {
			e := sqlstate.New(sqlstate.TooManyConnections, "cannot LISTEN: %v", err)
			e.Hint = "each listening session holds a backend of the catalog node; UNLISTEN * or disconnect idle listeners"
			return e
		}
		return acquireError(s.srv.catalogNode, err)
	}
	l := &listener{be: be, conn: s.conn, done: make(chan struct{})}
	l.cond = sync.NewCond(&l.mu)
	s.listener = l
	go l.read()
	return nil
}

// read is the only reader of the listen backend.
func (l *listener) read() {
	defer close(l.done)
	for {
		msg, err := l.be.Receive()
		l.mu.Lock()
		if err != nil {
			if !l.closed && l.idle && l.clientErr == nil {
				// The client waits for its next query, as a listening
				// client of PostgreSQL's would see its connection end.
				l.endIdleClient(err)
			}
			l.closed, l.err = true, err
			l.cond.Broadcast()
			l.mu.Unlock()
			return
		}
		msg, err = copyListenMessage(msg)
		if err != nil {
			l.closed, l.err = true, err
			l.cond.Broadcast()
			l.mu.Unlock()
			return
		}
		if n, ok := msg.(*pgproto3.NotificationResponse); ok && l.idle {
			l.writeClient(n)
			l.mu.Unlock()
			continue
		}
		for len(l.queue) >= maxListenQueue && !l.closed {
			l.cond.Wait()
		}
		l.queue = append(l.queue, msg)
		l.cond.Broadcast()
		_, ready := msg.(*pgproto3.ReadyForQuery)
		stop := ready && l.stopAfterReady
		if stop {
			l.closed = true
		}
		l.mu.Unlock()
		if stop {
			return
		}
	}
}

// writeClient sends a notification to the idle client. Called with mu held;
// the session takes mu before it writes anything itself.
func (l *listener) writeClient(n *pgproto3.NotificationResponse) {
	if l.clientErr != nil {
		return
	}
	buf, err := n.Encode(nil)
	if err == nil {
		_, err = l.conn.Write(buf)
	}
	if err != nil {
		l.clientErr = err
	}
}

// endIdleClient ends the idle client's connection when the listen backend
// is lost, with the FATAL error the session would send. Called with mu
// held, as writeClient; the session's read of the client then fails.
func (l *listener) endIdleClient(err error) {
	buf, encErr := listenLostError(err).Response().Encode(nil)
	if encErr == nil {
		_ = l.conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = l.conn.Write(buf)
	}
	l.clientErr = errClientGone
	_ = l.conn.Close()
}

// listenLostError is what ends a session whose listen backend was lost.
func listenLostError(err error) *sqlstate.Error {
	e := sqlstate.Fatal(sqlstate.ConnectionFailure, "terminating connection: lost the LISTEN connection: %v", err)
	e.Hint = "Reconnect and LISTEN again: notifications sent meanwhile were not delivered."
	return e
}

// copyListenMessage detaches msg from the Frontend's reused buffers. Only
// the responses of LISTEN, UNLISTEN and Sync can arrive here.
func copyListenMessage(msg pgproto3.BackendMessage) (pgproto3.BackendMessage, error) {
	switch m := msg.(type) {
	case *pgproto3.NotificationResponse:
		cp := *m
		return &cp, nil
	case *pgproto3.CommandComplete:
		return &pgproto3.CommandComplete{CommandTag: append([]byte(nil), m.CommandTag...)}, nil
	case *pgproto3.ReadyForQuery:
		cp := *m
		return &cp, nil
	case *pgproto3.ErrorResponse:
		cp := *m
		return &cp, nil
	case *pgproto3.NoticeResponse:
		cp := *m
		return &cp, nil
	case *pgproto3.ParameterStatus:
		cp := *m
		return &cp, nil
	case *pgproto3.EmptyQueryResponse:
		return &pgproto3.EmptyQueryResponse{}, nil
	}
	return nil, fmt.Errorf("unexpected %T on the LISTEN backend", msg)
}

// next waits for the next message the listen backend sent.
func (l *listener) next() (pgproto3.BackendMessage, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.queue) == 0 && !l.closed {
		l.cond.Wait()
	}
	if len(l.queue) == 0 {
		if l.err == nil {
			return nil, errors.New("LISTEN backend reader stopped")
		}
		return nil, l.err
	}
	msg := l.queue[0]
	l.queue[0] = nil
	l.queue = l.queue[1:]
	l.cond.Broadcast()
	return msg, nil
}

// enterIdle lets notifications flow to the client while the session waits
// for its next message. PostgreSQL delivers them only outside transactions.
func (s *session) enterIdle() {
	l := s.listener
	if l == nil || s.txStatus() != 'I' {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.idle = true
	keep := l.queue[:0]
	for _, m := range l.queue {
		if n, ok := m.(*pgproto3.NotificationResponse); ok {
			l.writeClient(n)
		} else {
			keep = append(keep, m)
		}
	}
	clear(l.queue[len(keep):])
	l.queue = keep
	l.cond.Broadcast()
}

// leaveIdle stops the reader from writing to the client; once it returns the
// session owns the client socket again.
func (s *session) leaveIdle() error {
	l := s.listener
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.idle = false
	if l.clientErr != nil {
		return errClientGone
	}
	return nil
}

// listenRun runs sql on the listen backend and forwards its responses but
// ReadyForQuery; notifications among them go to the client as they come.
// It reports whether the statement succeeded.
func (s *session) listenRun(x *exchange, sql string, hide bool) bool {
	l := s.listener
	l.be.Send(&pgproto3.Query{String: sql})
	if err := l.be.Flush(); err != nil {
		s.listenLost(x, err)
		return false
	}
	ok := true
	for {
		msg, err := l.next()
		if err != nil {
			s.listenLost(x, err)
			return false
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			return ok
		case *pgproto3.NotificationResponse:
			s.send(m)
		case *pgproto3.ErrorResponse:
			ok = false
			if !x.errored {
				x.errored = true
				s.send(m)
			}
		default:
			if !hide && !x.errored {
				s.send(m)
			}
		}
	}
}

func (s *session) listenLost(x *exchange, err error) {
	s.listenGone(err)
	if !x.errored {
		x.errored = true
		s.send(sqlstate.New(sqlstate.ConnectionFailure, "lost the LISTEN connection to node %s: %v", s.srv.catalogNode, err).Response())
	}
}

// listenCommand serves LISTEN and UNLISTEN on the session's listen backend,
// taking one on the first LISTEN and giving it back on UNLISTEN *.
func (s *session) listenCommand(ctx context.Context, p *router.Plan) {
	if s.tx.active || len(s.tx.conns) > 0 {
		e := sqlstate.New(sqlstate.FeatureNotSupported, "%s inside a transaction block is not supported through the Lattice proxy", firstWord(p.SQL))
		e.Hint = "run LISTEN and UNLISTEN outside a transaction block"
		s.fail(e)
		return
	}
	all := unlistenAll(p.SQL)
	extended := !s.simple
	// Runs when the exchange plays, in order with the statements before it.
	s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
		if x.errored {
			return
		}
		defer func() {
			if extended && x.errored {
				s.skipping = true
			}
		}()
		if s.listener == nil {
			if firstWord(p.SQL) == "UNLISTEN" {
				// Nothing is listened to; PostgreSQL answers all the same.
				s.send(commandComplete("UNLISTEN"))
				return
			}
			if err := s.startListener(ctx); err != nil {
				x.errored = true
				s.send(sqlstate.As(err).Response())
				return
			}
		}
		if all {
			s.listener.mu.Lock()
			s.listener.stopAfterReady = true
			s.listener.mu.Unlock()
		}
		ok := s.listenRun(x, p.SQL, false)
		if all && s.listener != nil {
			if !ok {
				s.listener.be.MarkBroken()
			}
			s.returnListener()
		}
	}})
}

// listenMulti runs a query string that holds LISTEN or UNLISTEN besides
// other statements (LISTEN a; NOTIFY a, 'x') on the session's listen
// backend, as one Query, so that it keeps PostgreSQL's implicit
// transaction: the LISTEN takes effect at its commit, with the rest. The
// other statements must be ones any backend of the catalog node may run
// (no tree, no session state, no transaction control or SET): the listen
// backend keeps only the session's LISTENs. UNLISTEN *, which gives the
// backend back, runs as a query of its own.
func (s *session) listenMulti(ctx context.Context, plans []*router.Plan) {
	for _, p := range plans {
		if s.tx.active || len(s.tx.conns) > 0 || s.pin.be != nil || unlistenAll(p.SQL) ||
			!isListenPlan(p) && (p.Kind != router.Catalog || p.Pin != 0 || p.Unpin != 0 || p.Hides != 0) {
			e := sqlstate.New(sqlstate.FeatureNotSupported, "%s cannot be combined with this statement in one query string through the Lattice proxy: %s", listenWord(plans), firstWord(p.SQL))
			e.Hint = "send LISTEN and UNLISTEN with statements on ordinary tables only, outside a transaction block, or as a query of their own"
			s.fail(e)
			return
		}
	}
	sql := s.x.client // the client's whole string, as PostgreSQL would get it
	s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
		if x.errored {
			return
		}
		if s.listener == nil {
			if err := s.startListener(ctx); err != nil {
				x.errored = true
				s.send(sqlstate.As(err).Response())
				return
			}
		}
		s.listenRun(x, sql, false)
	}})
}

// listenWord is the first of LISTEN and UNLISTEN among plans.
func listenWord(plans []*router.Plan) string {
	for _, p := range plans {
		if isListenPlan(p) {
			return firstWord(p.SQL)
		}
	}
	return ""
}

// syncListener delivers the notifications that arrived during a query
// before the query's ReadyForQuery, as PostgreSQL does: a Sync on the listen
// backend flushes out what it received up to now.
func (s *session) syncListener() {
	l := s.listener
	if l == nil || s.txStatus() != 'I' {
		return
	}
	l.be.Send(&pgproto3.Sync{})
	if err := l.be.Flush(); err != nil {
		s.listenGone(err)
		return
	}
	for {
		msg, err := l.next()
		if err != nil {
			s.listenGone(err)
			return
		}
		switch m := msg.(type) {
		case *pgproto3.ReadyForQuery:
			return
		case *pgproto3.NotificationResponse:
			s.send(m)
		case *pgproto3.ErrorResponse:
			s.listenGone(errors.New(m.Message))
			return
		}
	}
}

// listenGone ends the session once the client has its current answer: its
// LISTENs ended with the backend, and a client that went on would wait for
// notifications that never come. A driver's listener reconnects and listens
// again, as after losing a PostgreSQL connection.
func (s *session) listenGone(err error) {
	s.log.Warn("LISTEN backend lost; ending the session", "node", s.srv.catalogNode, "err", err)
	s.dropListener()
	s.stateLost = listenLostError(err)
}

// returnListener gives the listen backend back to the pool after UNLISTEN *:
// the reader stopped at its ReadyForQuery, so nothing is left unread.
func (s *session) returnListener() {
	l := s.listener
	s.listener = nil
	<-l.done
	if l.err != nil {
		l.be.MarkBroken()
	}
	s.srv.pools.ReleaseHeld(l.be)
}

// dropListener closes the listen backend, which ends its LISTENs (DISCARD
// ALL, client gone, backend failure).
func (s *session) dropListener() {
	l := s.listener
	if l == nil {
		return
	}
	s.listener = nil
	l.mu.Lock()
	l.closed = true    // before the socket closes: the reader must not end the client
	l.cond.Broadcast() // a reader waiting for queue room
	l.mu.Unlock()
	l.be.MarkBroken()
	s.srv.pools.ReleaseHeld(l.be) // closes the socket, which ends the reader
	<-l.done
}
