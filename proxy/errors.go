package proxy

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
)

// Error is an error that reaches a client as an ErrorResponse. Code is a
// PostgreSQL SQLSTATE so that every driver surfaces it naturally.
type Error struct {
	Severity string // unlocalized: ERROR, FATAL or PANIC
	Code     string
	Message  string
	Detail   string
	Hint     string

	// pg is the backend error this one came from, whose remaining fields
	// (constraint, table, column...) drivers and ORMs rely on.
	pg *pgconn.PgError
}

// Error formats e the way pgconn.PgError does.
func (e *Error) Error() string {
	return e.Severity + ": " + e.Message + " (SQLSTATE " + e.Code + ")"
}

// Errorf returns an ERROR with the given SQLSTATE and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Severity: "ERROR", Code: code, Message: fmt.Sprintf(format, args...)}
}

// Response returns the ErrorResponse that reports e to a client.
func (e *Error) Response() *pgproto3.ErrorResponse {
	r := &pgproto3.ErrorResponse{}
	if pg := e.pg; pg != nil {
		// Position is left out: it points into the statement the proxy sent
		// to the node, which after rewriting is not the client's text.
		r.InternalPosition = pg.InternalPosition
		r.InternalQuery = pg.InternalQuery
		r.Where = pg.Where
		r.SchemaName = pg.SchemaName
		r.TableName = pg.TableName
		r.ColumnName = pg.ColumnName
		r.DataTypeName = pg.DataTypeName
		r.ConstraintName = pg.ConstraintName
		r.File = pg.File
		r.Line = pg.Line
		r.Routine = pg.Routine
	}
	r.Severity = e.Severity
	r.SeverityUnlocalized = e.Severity
	r.Code = e.Code
	r.Message = e.Message
	r.Detail = e.Detail
	r.Hint = e.Hint
	return r
}

// AsError returns the *Error to send a client for err: the *Error in err's
// chain, else a backend's *pgconn.PgError with its fields kept, else an
// XX000 internal_error carrying err's message. It returns nil for nil.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
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
			pg:       pg,
		}
	}
	var re *router.Error
	if errors.As(err, &re) {
		return &Error{Severity: "ERROR", Code: re.Code, Message: re.Message, Detail: re.Detail, Hint: re.Hint}
	}
	var se *pgshard.Error
	if errors.As(err, &se) {
		return &Error{Severity: "ERROR", Code: se.Code, Message: se.Message, Detail: se.Detail, Hint: se.Hint}
	}
	if shardmap.Unavailable(err) {
		return &Error{Severity: "ERROR", Code: "58000", Message: err.Error(),
			Hint: "retry once Redis is back; statements on trees keep being served from the cached maps meanwhile"}
	}
	// Errors of packages the proxy does not import (the migrator's) carry
	// their code behind SQLState.
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return &Error{Severity: "ERROR", Code: coded.SQLState(), Message: err.Error()}
	}
	return &Error{Severity: "ERROR", Code: "XX000", Message: err.Error()}
}
