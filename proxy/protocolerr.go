package proxy

import (
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// receiveFailed ends a session whose client message could not be read. A
// message that breaks the protocol (oversized, of an unknown type,
// malformed) is answered with FATAL 08P01, as PostgreSQL answers it, so the
// client learns why it is cut off; a lost connection is sent nothing.
func (s *session) receiveFailed(err error) {
	var e *sqlstate.Error
	var tooBig *pgproto3.ExceededMaxBodyLenErr
	switch {
	case errors.As(err, &tooBig):
		// Read the rest of the message (within a deadline) so the client
		// is not cut off mid-write and can read why.
		// The read buffer may hold the start of it already.
		discardInput(s.conn, int64(tooBig.ActualBodyLen-s.in.dropBuffered()))
		e = sqlstate.Fatal(sqlstate.ProtocolViolation, "message of %d bytes exceeds the limit of %d", tooBig.ActualBodyLen, tooBig.MaxExpectedBodyLen)
	case errors.As(err, &e):
		// The message reader's own refusal (inflight.go).
	case connLost(err):
		return
	default:
		e = sqlstate.Fatal(sqlstate.ProtocolViolation, "invalid frontend message: %v", err)
	}
	s.send(e.Response())
	_ = s.client.Flush()
}

// connLost reports whether an error of pgproto3.Backend.Receive is the
// connection's. Receive turns the connection's EOF into io.ErrUnexpectedEOF;
// a bare io.EOF comes from decoding a malformed message body.
func connLost(err error) bool {
	var ne net.Error
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.As(err, &ne)
}

// backendLost is what a client is told when be failed under its statement:
// the check of a setting be reported (pgshard.PoolConfig.CheckParam), with
// its code and hint, or else 08006 naming be's node.
func backendLost(be *pgshard.Conn, err error) *sqlstate.Error {
	var e *sqlstate.Error
	if errors.As(be.Refusal(), &e) {
		return e
	}
	return sqlstate.New(sqlstate.ConnectionFailure, "lost connection to node %s: %v", be.Node, err)
}

// clientPosition is a backend's error with its position moved from the
// statement the proxy sent to the same place in the client's text (the
// proxy rewrites statements on trees), or left out where it cannot be
// placed there: psql draws its caret from it. m is not changed.
func clientPosition(m *pgproto3.ErrorResponse, client string, be *pgshard.Conn) *pgproto3.ErrorResponse {
	if m.Position == 0 || client == "" {
		return m
	}
	sent := be.FailedText()
	if sent == "" || sent == client {
		return m
	}
	cp := *m
	cp.Position = int32(router.ClientPosition(client, sent, int(m.Position)))
	return &cp
}
