package proxy

import (
	"runtime/debug"

	"github.com/lattice-db/lattice/sqlstate"
)

// recoverSession ends, alone, a session whose code panicked: a bug in the
// proxy must not take every other session down with it. The stack goes to
// the log, the client gets FATAL XX000, and the session's backends are
// closed rather than pooled, since where they stand in the protocol is
// unknown. It must be deferred after sess.release, so that it runs first.
func (s *Server) recoverSession(sess *session) {
	r := recover()
	if r == nil {
		return
	}
	s.log.Error("proxy: a session panicked; it ends, the other sessions go on",
		"user", sess.user, "tenant", sess.tenant, "panic", r, "stack", string(debug.Stack()))
	s.metrics.conn(connPanicked)
	for _, be := range sess.backends() {
		be.MarkBroken()
	}
	if sess.pin.be != nil {
		sess.pin.be.MarkBroken()
	}
	e := sqlstate.Fatal(sqlstate.InternalError, "internal error in the proxy: %v", r)
	e.Hint = "The proxy's log has the stack; please report it. Reconnect to go on."
	sess.send(e.Response())
	_ = sess.client.Flush()
}
