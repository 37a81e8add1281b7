package sqlstate

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Severities, unlocalized as PostgreSQL sends them in field V.
const (
	SeverityError   = "ERROR"
	SeverityFatal   = "FATAL" // ends the connection, as every startup error does
	SeverityWarning = "WARNING"
)

// Error is an error that reaches a client as an ErrorResponse (or, at
// severity WARNING, a NoticeResponse). Code is a SQLSTATE of this package so
// that every driver surfaces it naturally; Hint names the fix. A zero
// Severity is ERROR, so that &Error{Code: ..., Message: ...} needs no more.
type Error struct {
	Severity string
	Code     string
	Message  string
	Detail   string
	Hint     string
	Where    string // context, PostgreSQL's CONTEXT line: "COPY t, line 3"
	// Position is the 1-based character position of a syntax error in the
	// client's query string (the router parses it whole); 0 when unknown.
	// psql and drivers point at the error with it.
	Position int

	// pg is the backend error this one came from, whose remaining fields
	// (constraint, table, column...) drivers and ORMs rely on.
	pg *pgconn.PgError
}

// New returns an ERROR with the given code and a formatted message. An
// error among args is formatted as a client may read it (clientText): the
// message goes to a client.
func New(code, format string, args ...any) *Error {
	return &Error{Severity: SeverityError, Code: code, Message: fmt.Sprintf(format, clientArgs(args)...)}
}

// clientArgs is args with each error but an *Error (already a client's)
// replaced by its clientText; args itself is the caller's and stays as is.
func clientArgs(args []any) []any {
	out := args
	for i, a := range args {
		if err, ok := a.(error); ok && err != nil {
			if _, own := err.(*Error); !own {
				if &out[0] == &args[0] {
					out = append([]any(nil), args...)
				}
				out[i] = clientText(err)
			}
		}
	}
	return out
}

// Fatal returns a FATAL error: the connection ends after it.
func Fatal(code, format string, args ...any) *Error {
	e := New(code, format, args...)
	e.Severity = SeverityFatal
	return e
}

// Warning returns a WARNING, sent with Notice while the statement goes on.
func Warning(code, format string, args ...any) *Error {
	e := New(code, format, args...)
	e.Severity = SeverityWarning
	return e
}

// WithHint returns a copy of e with a formatted hint. It copies so that
// errors kept in package variables stay as they are.
func (e *Error) WithHint(format string, args ...any) *Error {
	c := *e
	c.Hint = fmt.Sprintf(format, clientArgs(args)...)
	return &c
}

// WithDetail returns a copy of e with a formatted detail.
func (e *Error) WithDetail(format string, args ...any) *Error {
	c := *e
	c.Detail = fmt.Sprintf(format, clientArgs(args)...)
	return &c
}

// Error formats e the way pgconn.PgError does.
func (e *Error) Error() string {
	return e.severity() + ": " + e.Message + " (SQLSTATE " + e.Code + ")"
}

func (e *Error) severity() string {
	if e.Severity == "" {
		return SeverityError
	}
	return e.Severity
}

// SQLState returns e's code, as pgconn.PgError's method does, for code that
// asks an error for its SQLSTATE through an interface.
func (e *Error) SQLState() string { return e.Code }

// Unwrap returns the backend error e was relayed from, if any, so that
// errors.As still finds a *pgconn.PgError behind it.
func (e *Error) Unwrap() error {
	if e.pg == nil {
		return nil
	}
	return e.pg
}

// Response returns the ErrorResponse that reports e to a client.
func (e *Error) Response() *pgproto3.ErrorResponse {
	r := &pgproto3.ErrorResponse{}
	if pg := e.pg; pg != nil {
		// Position is left out: it points into the statement the proxy sent
		// to the node, which after rewriting is not the client's text.
		r.InternalPosition = pg.InternalPosition
		r.InternalQuery = pg.InternalQuery
		r.SchemaName = pg.SchemaName
		r.TableName = pg.TableName
		r.ColumnName = pg.ColumnName
		r.DataTypeName = pg.DataTypeName
		r.ConstraintName = pg.ConstraintName
		r.File = pg.File
		r.Line = pg.Line
		r.Routine = pg.Routine
	}
	r.Severity = e.severity()
	r.SeverityUnlocalized = r.Severity
	r.Code = e.Code
	r.Message = e.Message
	r.Detail = e.Detail
	r.Hint = e.Hint
	r.Where = e.Where
	if e.pg == nil {
		r.Position = int32(e.Position)
	}
	return r
}

// Notice returns the NoticeResponse that reports e, a warning, to a client.
func (e *Error) Notice() *pgproto3.NoticeResponse {
	return (*pgproto3.NoticeResponse)(e.Response())
}
