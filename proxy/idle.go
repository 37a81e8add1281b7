package proxy

import (
	"context"
	"errors"
	"net"
	"os"
	"time"

	"github.com/lattice-db/lattice/sqlstate"
)

// DefaultIdleInTransactionTimeout ends a session that sits in an open
// transaction, between statements, for this long: its backends would be
// held from every other session, and its locks from everyone.
const DefaultIdleInTransactionTimeout = 5 * time.Minute

// idleRollbackTimeout bounds the ROLLBACK of a timed-out session's backends.
const idleRollbackTimeout = 5 * time.Second

// idleDeadline arms the read deadline of a session that waits for its next
// message inside a transaction. It is the proxy's own bound: no setting of
// the client's lifts it. It reports whether it armed one.
func (s *session) idleDeadline(ready bool) bool {
	d := s.srv.cfg.IdleInTransactionTimeout
	if !ready || d <= 0 || s.txStatus() == 'I' {
		return false
	}
	_ = s.conn.SetReadDeadline(time.Now().Add(d))
	return true
}

// idleTimedOut reports whether err is the deadline idleDeadline armed.
func idleTimedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// endIdleTransaction ends a session idle in its transaction past the
// timeout, as PostgreSQL does (FATAL 25P03), and rolls its backends back
// so that they go back to the pool rather than being closed.
func (s *session) endIdleTransaction() {
	s.log.Info("session idle in transaction past the timeout; ending it", "timeout", s.srv.cfg.IdleInTransactionTimeout)
	e := sqlstate.Fatal(sqlstate.IdleInTransactionTimeout, "terminating connection due to idle-in-transaction timeout")
	e.Hint = "Commit or roll back promptly; the proxy ends sessions idle in a transaction for longer than --idle-in-transaction-timeout."
	_ = s.conn.SetWriteDeadline(time.Now().Add(time.Second))
	s.send(e.Response())
	_ = s.client.Flush()

	ctx, cancel := context.WithTimeout(context.Background(), idleRollbackTimeout)
	defer cancel()
	errs := execAll(ctx, s.tx.conns, "ROLLBACK")
	keep := s.tx.conns[:0]
	for i, be := range s.tx.conns {
		switch {
		case errs[i] != nil || be.TxStatus != 'I':
			keep = append(keep, be) // release closes it
		case be == s.pin.be:
			// releasePin resets and returns it.
		default:
			s.used = append(s.used, be)
		}
	}
	s.tx.conns = keep
	s.tx.active = false
}
