package proxy

import (
	"context"
	"errors"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/sqlstate"
)

// errCanceled is the statement a CancelRequest ended before it went
// to a backend, in PostgreSQL's words for a cancelled statement.
var errCanceled = sqlstate.New(sqlstate.QueryCanceled, "canceling statement due to user request")

// poolAcquire takes a backend of node from the pools. A CancelRequest that
// comes before the statement reached a backend, or while it waits for one
// (a full pool, the user's cap), ends it with 57014, as PostgreSQL's ends
// a lock wait. Forwarded to the backend once the statement was sent, the
// cancel could reach it before it read the statement, and PostgreSQL drops
// a cancel that finds its backend waiting for a command: the statement
// then ran to its end. The waits share one context, made again only after
// a cancel ended it, so that a checkout allocates nothing.
func (s *session) poolAcquire(ctx context.Context, node string) (*pgshard.Conn, error) {
	s.activeMu.Lock()
	if s.cancelPending() {
		s.activeMu.Unlock()
		return nil, errCanceled
	}
	if s.waitCtx == nil || s.waitParent != ctx || s.waitCtx.Err() != nil {
		if s.stopWait != nil {
			s.stopWait(nil)
		}
		s.waitParent = ctx
		s.waitCtx, s.stopWait = context.WithCancelCause(ctx)
	}
	wctx := s.waitCtx
	s.waiting = true
	s.activeMu.Unlock()
	be, err := s.srv.pools.Acquire(wctx, s.user, node, s.tenant)
	s.activeMu.Lock()
	s.waiting = false
	s.activeMu.Unlock()
	if err != nil && context.Cause(wctx) == errCanceled {
		return nil, errCanceled
	}
	return be, err
}

// stopWaiting ends the wait of poolAcquire, if the session is in one, for a
// CancelRequest; activeMu held.
func (s *session) stopWaiting() {
	if s.waiting {
		s.stopWait(errCanceled)
	}
}

// endWaits releases the waits' context when the session ends.
func (s *session) endWaits() {
	s.activeMu.Lock()
	defer s.activeMu.Unlock()
	if s.stopWait != nil {
		s.stopWait(nil)
	}
}

// acquireError is what a client sees when no backend of node could be had:
// the pools' own refusal as it is (a cap of the node or the user reached,
// 53300; no database of the tenant's name, 3D000; a tenant role the proxy
// may not use, 42501), a full pool as 53300, else a connection failure.
func acquireError(node string, err error) *sqlstate.Error {
	if e := (*sqlstate.Error)(nil); errors.As(err, &e) {
		return e
	}
	if errors.Is(err, pgshard.ErrPoolExhausted) {
		return sqlstate.New(sqlstate.TooManyConnections, "%v", err).
			WithHint("Retry later, or raise --pool-size.")
	}
	return sqlstate.New(sqlstate.ConnectionFailure, "cannot reach node %s: %v", node, err)
}
