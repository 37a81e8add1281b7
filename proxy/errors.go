package proxy

import (
	"errors"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// Error is the one error type of package sqlstate. The alias, Errorf and
// AsError let the proxy's many call sites move onto sqlstate's constructors
// in one step, after the router has.
type Error = sqlstate.Error

// Errorf returns an ERROR with the given SQLSTATE and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return sqlstate.New(code, format, args...)
}

// AsError returns the *Error to send a client for err (see sqlstate.As),
// reading the router's own errors too.
func AsError(err error) *Error {
	var re *router.Error
	if errors.As(err, &re) {
		return &Error{Severity: sqlstate.SeverityError, Code: re.Code, Message: re.Message, Detail: re.Detail, Hint: re.Hint}
	}
	return sqlstate.As(err)
}
