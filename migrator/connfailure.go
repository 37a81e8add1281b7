package migrator

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/sqlstate"
)

// connFailure reports whether err says a node could not be reached or the
// connection to it broke (a connect that failed or timed out, a socket
// error, SQLSTATE class 08, or the server shutting down or starting up),
// rather than anything about the statement itself. Such work can run again
// once the network or the node is back.
func connFailure(err error) bool {
	if err == nil {
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	if errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code {
		case sqlstate.AdminShutdown, sqlstate.CrashShutdown, sqlstate.CannotConnectNow:
			return true
		}
		return strings.HasPrefix(pg.Code, "08") // connection exception
	}
	return false
}
