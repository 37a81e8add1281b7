package proxy

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/router"
)

// The proxy answers a client's Parse itself and prepares the statement on
// a backend lazily, where its Bind runs. PostgreSQL parses at once: what
// fails a Parse (a relation that does not exist, a statement_timeout that
// runs out before the Describe comes) fails it there, before ParseComplete,
// and leaves no statement. So a Parse that the client follows with a
// Describe of it, or with Sync or Flush, or after which it pauses (pgx's
// Prepare sends Parse, Describe and Sync; a pause means the client waits
// or is slow to send the rest), goes to the catalog node's backend at once,
// and that backend's answer takes the place of the proxy's ParseComplete.
// Parse, Bind, Execute in one packet, the hot path of the extended
// protocol, stays one backend Parse.

// parseAhead is a client Parse the proxy answered with ParseComplete and
// has sent to no backend yet.
type parseAhead struct {
	name string
	st   *clientStmt
	step int // the index of the proxy's ParseComplete in s.x.steps
}

// describedOnBackend reports whether a Describe of a statement planned as
// p asks a backend (describe), so that its Parse can go ahead.
func describedOnBackend(p *router.Plan) bool {
	if p == nil || p.Reparse {
		return false
	}
	switch p.Kind {
	case router.Transaction, router.SessionSet, router.Discard, router.DDL, router.Function:
		return false
	}
	return !isListenPlan(p)
}

// aheadOf notes the Parse of st just answered, unless its Describe would
// not ask a backend.
func (s *session) aheadOf(name string, st *clientStmt) {
	s.ahead = nil
	if describedOnBackend(st.plan) {
		st.ahead = parseAhead{name: name, st: st, step: len(s.x.steps) - 1}
		s.ahead = &st.ahead
	}
}

// parseNow sends the pending Parse to the catalog node's backend and shows
// the client that backend's answer in place of the proxy's. A statement
// the backend already holds, or a backend not to be had now, leaves the
// proxy's answer; its Bind or Describe reports what fails.
func (s *session) parseNow(ctx context.Context) {
	a := s.ahead
	s.ahead = nil
	if a == nil || s.skipping || a.step != len(s.x.steps)-1 || s.stmts[a.name] != a.st {
		return
	}
	// The backend's answer replaces the proxy's, after what taking the
	// backend queued (its settings).
	answer := s.x.steps[a.step]
	s.x.steps = s.x.steps[:a.step]
	be, err := s.parseBackend(ctx, a.st.plan)
	if err != nil {
		s.x.steps = append(s.x.steps, answer)
		return
	}
	if r, _, err := s.parseLock(ctx, a.st.plan, time.Now()); r != nil || err != nil {
		// It would lock a reference table whose copies are changing: its
		// Describe or Bind waits for the change, and the proxy's answer
		// stays.
		s.x.steps = append(s.x.steps, answer)
		return
	}
	n := len(s.x.steps)
	s.keyBuf = appendPreparedKey(s.keyBuf[:0], a.st.sql, a.st.oids, a.st.epoch)
	if _, ok := be.Prepared(s.keyBuf); ok {
		// Parsed there before; parsed again as the unnamed statement,
		// which the proxy keeps nothing in, so that it fails as the
		// client's Parse would now.
		be.Send(&pgproto3.Parse{Query: a.st.sql, ParameterOIDs: a.st.oids})
		s.x.add(step{kind: stepParse, be: be, client: a.st.sql}) // sent ahead of the message at hand
	} else {
		s.prepareOn(be, a.st.sql, a.st.oids, a.st.epoch)
	}
	s.x.steps[n].ahead = a
}

// parseAheadMsg serves a pending Parse before the client's next message m:
// at once if m needs its result, never if m is anything else.
func (s *session) parseAheadMsg(ctx context.Context, m pgproto3.FrontendMessage) {
	if s.ahead == nil {
		return
	}
	switch m := m.(type) {
	case *pgproto3.Describe:
		if m.ObjectType == 'S' && m.Name == s.ahead.name {
			s.parseNow(ctx)
		}
	case *pgproto3.Sync, *pgproto3.Flush:
		s.parseNow(ctx)
	}
	s.ahead = nil
}

// sendOnPause sends what the batch so far queued for backends, a pending
// Parse included, when the client has sent nothing more yet: the backends
// then run it when PostgreSQL would, as the client sent it, rather than
// at Sync (a statement_timeout counts from there). A batch that arrives
// whole, as drivers send it, never pauses.
func (s *session) sendOnPause(ctx context.Context) {
	if len(s.x.steps) == 0 || s.in == nil || s.in.buffered() {
		return
	}
	s.parseNow(ctx)
	s.sendBackends() // an I/O error shows when the answers are read
}

// parseFailed drops the client's statement whose Parse the backend
// refused: PostgreSQL keeps no statement of a failed Parse.
func (s *session) parseFailed(a *parseAhead) {
	if s.stmts[a.name] == a.st {
		delete(s.stmts, a.name)
	}
}
