package sqlstate

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// unavailable stands for a Coded error of a package above this one, such as
// shardmap's UnavailableError.
type unavailable struct{ err error }

func (u *unavailable) Error() string    { return "redis out of reach: " + u.err.Error() }
func (u *unavailable) Unwrap() error    { return u.err }
func (u *unavailable) SQLState() string { return SystemError }
func (u *unavailable) Hint() string     { return "retry once Redis is back" }

// coded is a Coded error without a hint.
type coded struct{}

func (coded) Error() string    { return "bad request" }
func (coded) SQLState() string { return InvalidParameterValue }

func TestConstructors(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    *Error
		want Error
		str  string
	}{
		{"New", New(FeatureNotSupported, "cannot %s across nodes", "join"),
			Error{Severity: "ERROR", Code: "0A000", Message: "cannot join across nodes"},
			"ERROR: cannot join across nodes (SQLSTATE 0A000)"},
		{"Fatal", Fatal(ProtocolViolation, "invalid message length"),
			Error{Severity: "FATAL", Code: "08P01", Message: "invalid message length"},
			"FATAL: invalid message length (SQLSTATE 08P01)"},
		{"Warning", Warning(ActiveSQLTransaction, "there is already a transaction in progress"),
			Error{Severity: "WARNING", Code: "25001", Message: "there is already a transaction in progress"},
			"WARNING: there is already a transaction in progress (SQLSTATE 25001)"},
		{"WithHint", New(ObjectNotInPrerequisiteState, "busy").WithHint("wait for %s", "it"),
			Error{Severity: "ERROR", Code: "55000", Message: "busy", Hint: "wait for it"},
			"ERROR: busy (SQLSTATE 55000)"},
		{"WithDetail", New(SlotMoved, "slot moved").WithDetail("epoch %d", 7),
			Error{Severity: "ERROR", Code: "LT001", Message: "slot moved", Detail: "epoch 7"},
			"ERROR: slot moved (SQLSTATE LT001)"},
		{"composite literal", &Error{Code: UndefinedTable, Message: "tree \"t\" does not exist"},
			Error{Code: "42P01", Message: "tree \"t\" does not exist"},
			"ERROR: tree \"t\" does not exist (SQLSTATE 42P01)"},
		{"literal percent", New(InternalError, "%s", "100% done"),
			Error{Severity: "ERROR", Code: "XX000", Message: "100% done"},
			"ERROR: 100% done (SQLSTATE XX000)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if *tc.e != tc.want {
				t.Errorf("got %+v, want %+v", *tc.e, tc.want)
			}
			if got := tc.e.Error(); got != tc.str {
				t.Errorf("Error() = %q, want %q", got, tc.str)
			}
			if got := tc.e.SQLState(); got != tc.want.Code {
				t.Errorf("SQLState() = %q, want %q", got, tc.want.Code)
			}
		})
	}
}

// TestWithHintCopies checks that a hint added to a shared error does not
// change the shared one: sessions add hints concurrently.
func TestWithHintCopies(t *testing.T) {
	shared := New(InFailedSQLTransaction, "current transaction is aborted")
	h := shared.WithHint("roll back")
	d := shared.WithDetail("detail")
	if shared.Hint != "" || shared.Detail != "" || h == shared || d == shared {
		t.Errorf("WithHint/WithDetail changed the shared error: %+v", shared)
	}
}

func TestAs(t *testing.T) {
	own := New(UndefinedTable, "relation %q does not exist", "t")
	pg := &pgconn.PgError{
		Severity: "ERREUR", SeverityUnlocalized: "ERROR", Code: "23505",
		Message: "duplicate key value violates unique constraint \"t_pkey\"", Detail: "Key (id)=(1) already exists.",
		Hint: "h", Where: "SQL function f", Position: 17, SchemaName: "lattice_s0005", TableName: "t", ConstraintName: "t_pkey", Routine: "_bt_check_unique",
	}
	for _, tc := range []struct {
		name string
		err  error
		same *Error // when set, As must return this very *Error
		want Error  // compared without the backend error
	}{
		{name: "own", err: own, same: own},
		{name: "own wrapped twice", err: fmt.Errorf("routing: %w", fmt.Errorf("plan: %w", own)), same: own},
		{name: "own joined", err: errors.Join(errors.New("first"), own), same: own},
		{name: "backend", err: fmt.Errorf("node n1: %w", pg),
			want: Error{Severity: "ERROR", Code: "23505", Message: pg.Message, Detail: pg.Detail, Hint: "h", Where: "SQL function f"}},
		{name: "backend without unlocalized severity", err: &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection"},
			want: Error{Severity: "FATAL", Code: "57P01", Message: "terminating connection"}},
		{name: "coded with hint", err: fmt.Errorf("shardmap: read tree: %w", &unavailable{syscall.ECONNREFUSED}),
			want: Error{Severity: "ERROR", Code: "58000", Message: "shardmap: read tree: redis out of reach: connection refused", Hint: "retry once Redis is back"}},
		{name: "coded without hint", err: fmt.Errorf("api: %w", coded{}),
			want: Error{Severity: "ERROR", Code: "22023", Message: "api: bad request"}},
		{name: "plain", err: errors.New("redis: connection refused"),
			want: Error{Severity: "ERROR", Code: "XX000", Message: "redis: connection refused"}},
		{name: "a node's network error is not the store's", err: fmt.Errorf("node n1: %w", syscall.ECONNREFUSED),
			want: Error{Severity: "ERROR", Code: "XX000", Message: "node n1: connection refused"}},
		{name: "percent in a plain message", err: errors.New("50% %d"),
			want: Error{Severity: "ERROR", Code: "XX000", Message: "50% %d"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := As(tc.err)
			if tc.same != nil {
				if got != tc.same {
					t.Errorf("As = %v, want the same *Error %v", got, tc.same)
				}
				return
			}
			c := *got
			c.pg = nil
			if c != tc.want {
				t.Errorf("As = %+v, want %+v", c, tc.want)
			}
			if !Is(tc.err, tc.want.Code) && tc.want.Code != InternalError {
				t.Errorf("Is(err, %s) = false", tc.want.Code)
			}
		})
	}
	if As(nil) != nil {
		t.Error("As(nil) != nil")
	}
}

func TestIs(t *testing.T) {
	pg := &pgconn.PgError{Code: LockNotAvailable}
	for _, tc := range []struct {
		err  error
		code string
		want bool
	}{
		{nil, InternalError, false},
		{fmt.Errorf("fence: %w", pg), LockNotAvailable, true},
		{fmt.Errorf("fence: %w", pg), ObjectInUse, false},
		{New(SlotMoved, "moved"), SlotMoved, true},
		{FromPgError(pg), LockNotAvailable, true},
		{&unavailable{syscall.ECONNRESET}, SystemError, true},
		// A plain error is XX000 to a client, but nothing matched that code.
		{errors.New("plain"), InternalError, false},
	} {
		if got := Is(tc.err, tc.code); got != tc.want {
			t.Errorf("Is(%v, %s) = %v, want %v", tc.err, tc.code, got, tc.want)
		}
	}
}

// TestRelay checks that a backend's error reaches the client with every
// field drivers and ORMs read, except the position in the rewritten text.
func TestRelay(t *testing.T) {
	pg := &pgconn.PgError{
		Severity: "ERREUR", SeverityUnlocalized: "ERROR", Code: "23505",
		Message: "duplicate key", Detail: "Key (id)=(1) already exists.", Hint: "pick another id",
		Position: 17, InternalPosition: 3, InternalQuery: "SELECT 1", Where: "PL/pgSQL function f()",
		SchemaName: "lattice_s0005", TableName: "t", ColumnName: "id", DataTypeName: "int4",
		ConstraintName: "t_pkey", File: "nbtinsert.c", Line: 666, Routine: "_bt_check_unique",
	}
	e := As(fmt.Errorf("node n1: %w", pg))
	r := e.Response()
	for _, f := range []struct{ name, got, want string }{
		{"Severity", r.Severity, "ERROR"},
		{"SeverityUnlocalized", r.SeverityUnlocalized, "ERROR"},
		{"Code", r.Code, "23505"},
		{"Message", r.Message, "duplicate key"},
		{"Detail", r.Detail, pg.Detail},
		{"Hint", r.Hint, pg.Hint},
		{"InternalQuery", r.InternalQuery, pg.InternalQuery},
		{"Where", r.Where, pg.Where},
		{"SchemaName", r.SchemaName, pg.SchemaName},
		{"TableName", r.TableName, pg.TableName},
		{"ColumnName", r.ColumnName, pg.ColumnName},
		{"DataTypeName", r.DataTypeName, pg.DataTypeName},
		{"ConstraintName", r.ConstraintName, pg.ConstraintName},
		{"File", r.File, pg.File},
		{"Routine", r.Routine, pg.Routine},
	} {
		if f.got != f.want {
			t.Errorf("Response().%s = %q, want %q", f.name, f.got, f.want)
		}
	}
	if r.InternalPosition != 3 || r.Line != 666 {
		t.Errorf("Response() InternalPosition, Line = %d, %d, want 3, 666", r.InternalPosition, r.Line)
	}
	if r.Position != 0 {
		t.Errorf("Response().Position = %d, want 0: it points into the rewritten statement", r.Position)
	}
	var back *pgconn.PgError
	if !errors.As(e, &back) || back != pg {
		t.Error("the relayed error does not unwrap to the backend's *pgconn.PgError")
	}
	// A hint added on the way keeps the backend's fields.
	if r := e.WithHint("retry").Response(); r.ConstraintName != "t_pkey" || r.Hint != "retry" {
		t.Errorf("WithHint lost the backend's fields: %+v", r)
	}
}

func TestResponse(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    *Error
	}{
		{"error", New(FeatureNotSupported, "cannot join").WithHint("add the shard key").WithDetail("tree t")},
		{"fatal", Fatal(InvalidPassword, "password authentication failed for user %q", "u")},
		{"context", &Error{Severity: SeverityError, Code: BadCopyFileFormat, Message: "unterminated CSV quoted field", Where: "COPY t, line 3"}},
		{"syntax error with a position", &Error{Severity: SeverityError, Code: SyntaxError, Message: "syntax error at end of input", Position: 15}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.e.Response()
			if r.Severity != tc.e.Severity || r.SeverityUnlocalized != tc.e.Severity || r.Code != tc.e.Code ||
				r.Message != tc.e.Message || r.Detail != tc.e.Detail || r.Hint != tc.e.Hint || r.Where != tc.e.Where {
				t.Errorf("Response() = %+v, want the fields of %+v", r, tc.e)
			}
			if r.Position != int32(tc.e.Position) {
				t.Errorf("Response().Position = %d, want the router's %d", r.Position, tc.e.Position)
			}
			if r.ConstraintName != "" || r.Routine != "" {
				t.Errorf("Response() = %+v: fields set that Lattice's own errors do not have", r)
			}
		})
	}
	if r := (&Error{Code: UndefinedTable, Message: "m"}).Response(); r.Severity != "ERROR" || r.SeverityUnlocalized != "ERROR" {
		t.Errorf("Response() of an Error without a severity = %+v, want ERROR", r)
	}
	n := Warning(NoActiveSQLTransaction, "there is no transaction in progress").Notice()
	if n.Severity != "WARNING" || n.SeverityUnlocalized != "WARNING" || n.Code != "25P01" || n.Message != "there is no transaction in progress" {
		t.Errorf("Notice() = %+v", n)
	}
}
