package proxy

import (
	"context"
	"time"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// Session pinning.
//
// Some session state lives only in the backend that made it, and the proxy
// cannot replay it on another: temp tables, session advisory locks,
// SQL-level prepared statements, WITH HOLD cursors, set_config(..., false)
// (router.Pin lists them; the router marks the statements that create and
// end each). A session whose statement creates such state keeps its
// catalog-node backend from then on: every statement of the session that
// runs on the catalog node runs there, inside and outside transactions,
// while statements on trees still go to pooled shard backends. The pin
// ends when every kind of state it was taken for has ended (DISCARD ALL
// ends all; DISCARD TEMP, pg_advisory_unlock_all(), DEALLOCATE ALL and
// CLOSE ALL end theirs when they commit outside a transaction block), or
// when the client disconnects. Either way the backend runs DISCARD ALL
// before it goes back to the pool, so the next session finds nothing of
// it; the session's own settings are replayed on its next backend as for
// any other.
//
// An unlock of one item (pg_advisory_unlock, DEALLOCATE name, CLOSE name,
// DROP TABLE of a temp table) ends nothing: the proxy cannot tell whether
// it was the last. The session stays pinned, which is safe. LISTEN keeps a
// backend of its own (listen.go), bounded by --max-listeners.

// DefaultMaxPinned is how many sessions may be pinned at once when the
// configuration says nothing (the command line defaults to half of the
// pool instead).
const DefaultMaxPinned = 16

// pinResetTimeout bounds the DISCARD ALL that cleans a backend (resetBackend).
const pinResetTimeout = 10 * time.Second

// pinState is the session's pinned backend and the state it holds there.
type pinState struct {
	be      *pgshard.Conn // nil when the session is not pinned
	reasons router.Pin
	// ending is the state that statements of the current extended batch
	// ended; it is gone once the batch commits at Sync.
	ending router.Pin
}

// pinFor pins the session to its catalog-node backend before a statement
// that creates state pin runs there. Past --max-pinned the statement is
// refused.
func (s *session) pinFor(ctx context.Context, pin router.Pin) error {
	if pin == 0 {
		return nil
	}
	s.checkPin()
	if s.pin.be == nil {
		if err := s.takePin(pin); err != nil {
			return err
		}
		be, err := s.backend(ctx, s.srv.catalogNode)
		if err != nil {
			s.srv.pinned.Add(-1)
			return err
		}
		if be.Node != s.srv.catalogNode {
			// A failed transaction elsewhere answers 25P02: nothing is created.
			s.srv.pinned.Add(-1)
			return nil
		}
		s.holdPin(be, pin)
	}
	s.addPinReasons(pin)
	return nil
}

// takePin counts one more pinned session, or refuses past --max-pinned.
func (s *session) takePin(pin router.Pin) error {
	if n := s.srv.pinned.Add(1); n > int64(s.srv.cfg.MaxPinned) {
		s.srv.pinned.Add(-1)
		e := sqlstate.New(sqlstate.TooManyConnections, "too many sessions pinned to a backend (%d, the --max-pinned limit): this statement creates session state (%s) that would pin this one too", s.srv.cfg.MaxPinned, pin)
		e.Hint = "raise --max-pinned, or avoid state that lives on one backend: temp tables with ON COMMIT DROP inside a transaction, pg_advisory_xact_lock, set_config(..., true), your driver's prepared statements instead of PREPARE; DISCARD ALL ends a pin"
		return e
	}
	return nil
}

// holdPin keeps be, a catalog-node backend counted by takePin, for the
// session from now on.
func (s *session) holdPin(be *pgshard.Conn, pin router.Pin) {
	s.srv.pools.Pin(be)
	s.pin.be = be
	s.log.Debug("session pinned", "node", be.Node, "pid", be.PID(), "reason", pin.String())
}

// addPinReasons records that the pinned backend holds state pin.
func (s *session) addPinReasons(pin router.Pin) {
	for _, r := range (pin &^ s.pin.reasons).Names() {
		s.srv.metrics.pinnedFor(r)
	}
	s.pin.reasons |= pin
}

// pinEnds queues, after a statement, the bookkeeping of the state it ends. Only a
// statement that commits outside a transaction block ends state (DISCARD
// TEMP rolls back with its transaction): in the simple protocol that is
// known once it ran, in the extended protocol at the batch's Sync.
func (s *session) pinEnds(unpin router.Pin) {
	if unpin&router.PinPrepare != 0 {
		// DEALLOCATE ALL drops the proxy's own statements on that backend
		// too, whether or not it commits: what follows prepares again.
		for _, be := range s.backends() {
			if be.Node == s.srv.catalogNode {
				be.ForgetAllPrepared()
			}
		}
	}
	if unpin == 0 || s.pin.be == nil || s.tx.active || len(s.tx.conns) > 0 {
		return
	}
	be, extended := s.pin.be, !s.simple
	s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
		switch {
		case x.errored || x.failed[be]:
		case extended:
			s.pin.ending |= unpin
		case be.TxStatus == 'I':
			s.pin.reasons &^= unpin
		}
	}})
}

// pinSynced ends the state the extended batch ended, if the batch
// committed (ok, and the pinned backend left no transaction open).
func (s *session) pinSynced(ok bool) {
	if ok && s.pin.be != nil && s.pin.be.TxStatus == 'I' {
		s.pin.reasons &^= s.pin.ending
	}
	s.pin.ending = 0
}

// discardPin is DISCARD ALL: every kind of state ends; settlePin resets
// the backend.
func (s *session) discardPin() { s.pin.reasons, s.pin.ending = 0, 0 }

// pinnedBackend is the session's pinned backend when it asks for one of
// node, brought to the session's settings, or nil.
func (s *session) pinnedBackend(node string) *pgshard.Conn {
	if s.pin.be == nil || node != s.srv.catalogNode {
		return nil
	}
	s.checkPin()
	be := s.pin.be
	if be == nil {
		return nil
	}
	// describeBackend may hold it as an auxiliary backend of this exchange:
	// it now serves the statement itself, so it is listed once.
	for i, c := range s.aux {
		if c == be {
			s.aux = append(s.aux[:i], s.aux[i+1:]...)
			s.setActive(be, false)
			break
		}
	}
	return be
}

// checkPin forgets a pinned backend that broke: its state is gone with it,
// and the pool closes it.
func (s *session) checkPin() {
	be := s.pin.be
	if be == nil || !be.Broken() {
		return
	}
	s.log.Warn("pinned backend lost; its temp tables, locks, prepared statements and cursors are gone; ending the session", "node", be.Node, "reason", s.pin.reasons.String())
	s.stateLost = sqlstate.Fatal(sqlstate.ConnectionFailure, "terminating connection: the backend on node %s that held this session's state (%s) was lost", be.Node, s.pin.reasons.String())
	s.stateLost.Hint = "Reconnect: that state went with the backend, as it would with a PostgreSQL connection."
	s.dropPin(be)
}

// dropPin ends the pin of broken backend be, which the pool closes.
func (s *session) dropPin(be *pgshard.Conn) {
	if be.Pinned() {
		s.srv.pools.Unpin(be)
	}
	s.pin = pinState{}
	s.srv.pinned.Add(-1)
}

// settlePin runs when an exchange is finished: a pin whose state is all
// gone ends, once its backend is idle and out of any transaction.
func (s *session) settlePin() {
	s.checkPin()
	be := s.pin.be
	if be == nil || s.pin.reasons != 0 || be.TxStatus != 'I' || s.inTx(be) {
		return
	}
	s.unpin()
}

// unpin resets the pinned backend and gives it back to the pool.
func (s *session) unpin() {
	be := s.pin.be
	s.pin = pinState{}
	s.srv.pinned.Add(-1)
	s.resetBackend(be)
	s.log.Debug("session unpinned", "node", be.Node, "pid", be.PID())
	s.srv.pools.Unpin(be)
}

// resetBackend brings be back to its startup state with DISCARD ALL; the
// next session that takes it replays its own settings (prologue). A
// backend that cannot be reset is marked broken, and the pool closes it.
func (s *session) resetBackend(be *pgshard.Conn) {
	if !be.Broken() && be.TxStatus == 'I' {
		ctx, cancel := context.WithTimeout(context.Background(), pinResetTimeout)
		err := execAll(ctx, []*pgshard.Conn{be}, "DISCARD ALL")[0]
		cancel()
		if err != nil {
			s.log.Warn("resetting a backend failed; closing it", "node", be.Node, "err", err)
			be.MarkBroken()
		}
		// DISCARD ALL dropped the proxy's own prepared statements too, and
		// brought the backend back to its startup settings.
		be.ForgetAllPrepared()
		be.Settings = ""
		be.Untracked = false
	} else {
		be.MarkBroken()
	}
}

// releasePin ends the pin of a session that is going away. Its backend is
// broken when the session left a transaction open (release closes it to
// roll that back), which is no loss to report.
func (s *session) releasePin() {
	switch be := s.pin.be; {
	case be == nil:
	case be.Broken():
		s.dropPin(be)
	default:
		s.unpin()
	}
}

// Pinned is the number of sessions pinned to a backend now.
func (s *Server) Pinned() int64 { return s.pinned.Load() }
