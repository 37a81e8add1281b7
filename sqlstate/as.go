package sqlstate

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Coded is an error type that stays its own, for its package's callers to
// match, but reaches a client with a SQLSTATE (shardmap's UnavailableError).
// sqlstate cannot name such types, since it imports nothing of Lattice's.
type Coded interface {
	error
	SQLState() string
}

// Hinted is a Coded error that also names the fix.
type Hinted interface {
	Coded
	Hint() string
}

// As returns the *Error to send a client for err, looking along err's chain:
// the *Error in it; else a backend's *pgconn.PgError, relayed with its
// fields kept; else a Coded error, with the whole chain's message; else an
// XX000 internal_error carrying err's message. It returns nil for nil.
func As(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		e := FromPgError(pg)
		if ce := (*pgconn.ConnectError)(nil); errors.As(err, &ce) && strings.HasPrefix(pg.Code, "28") {
			// Refused at login: the server's words name the node's user.
			e.Message, e.Detail, e.Hint = clientText(err), "", "check the node's credentials in the proxy's configuration"
		}
		return e
	}
	var coded Coded
	if errors.As(err, &coded) {
		e := New(coded.SQLState(), "%s", clientText(err))
		if h, ok := coded.(Hinted); ok {
			e.Hint = h.Hint()
		}
		return e
	}
	return New(InternalError, "%s", clientText(err))
}

// FromPgError returns the *Error that relays a backend's error to a client
// as the backend sent it.
func FromPgError(pg *pgconn.PgError) *Error {
	severity := pg.SeverityUnlocalized
	if severity == "" { // servers before 9.6 send only the localized one
		severity = pg.Severity
	}
	return &Error{
		Severity: severity,
		Code:     pg.Code,
		Message:  pg.Message,
		Detail:   pg.Detail,
		Hint:     pg.Hint,
		Where:    pg.Where,
		pg:       pg,
	}
}

// Is reports whether err's chain holds an error with the given code where
// As would find it: an *Error, a backend's *pgconn.PgError or a Coded
// error. An error with no code is XX000 only for As, not for Is.
func Is(err error, code string) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Code == code
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == code
	}
	var coded Coded
	return errors.As(err, &coded) && coded.SQLState() == code
}
