package router

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pganalyze/pg_query_go/v6/parser"

	"github.com/lattice-db/lattice/sqlstate"
)

// refused builds the 0A000 error of a statement that cannot be routed.
// The message names the statement and says what to do instead.
func refused(hint, format string, args ...any) *sqlstate.Error {
	return &sqlstate.Error{Code: sqlstate.FeatureNotSupported, Message: fmt.Sprintf(format, args...), Hint: hint}
}

func syntaxError(err error) *sqlstate.Error {
	var pe *parser.Error
	if errors.As(err, &pe) {
		return &sqlstate.Error{Code: sqlstate.SyntaxError, Message: pe.Message, Position: pe.Cursorpos}
	}
	return &sqlstate.Error{Code: sqlstate.SyntaxError, Message: err.Error()}
}

// quoteIdentText quotes a name for a message the way PostgreSQL does in its
// own messages: always in double quotes.
func qn(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
