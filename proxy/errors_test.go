package proxy

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/shardmap"
)

func TestErrorf(t *testing.T) {
	e := Errorf("0A000", "cannot %s across nodes", "join")
	if got, want := e.Error(), "ERROR: cannot join across nodes (SQLSTATE 0A000)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e.Hint = "Add the shard key."
	r := e.Response()
	if r.Severity != "ERROR" || r.SeverityUnlocalized != "ERROR" || r.Code != "0A000" ||
		r.Message != "cannot join across nodes" || r.Hint != "Add the shard key." {
		t.Errorf("Response() = %+v", r)
	}
}

func TestAsError(t *testing.T) {
	own := Errorf("42P01", "relation %q does not exist", "t")
	pg := &pgconn.PgError{
		Severity: "ERREUR", SeverityUnlocalized: "ERROR", Code: "23505",
		Message: "duplicate key value violates unique constraint \"t_pkey\"", Detail: "Key (id)=(1) already exists.",
		Position: 17, SchemaName: "lattice_s0005", TableName: "t", ConstraintName: "t_pkey", Routine: "_bt_check_unique",
	}

	if AsError(nil) != nil {
		t.Error("AsError(nil) != nil")
	}
	if got := AsError(fmt.Errorf("routing: %w", own)); got != own {
		t.Errorf("AsError(wrapped *Error) = %v, want the same *Error", got)
	}

	got := AsError(fmt.Errorf("node n1: %w", pg))
	if got.Severity != "ERROR" || got.Code != "23505" || got.Message != pg.Message || got.Detail != pg.Detail {
		t.Errorf("AsError(PgError) = %+v", got)
	}
	r := got.Response()
	if r.ConstraintName != "t_pkey" || r.TableName != "t" || r.SchemaName != "lattice_s0005" || r.Routine != "_bt_check_unique" {
		t.Errorf("Response() lost the backend's fields: %+v", r)
	}
	if r.Position != 0 {
		t.Errorf("Response().Position = %d, want 0: it points into the rewritten statement", r.Position)
	}

	old := AsError(&pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection"})
	if old.Severity != "FATAL" {
		t.Errorf("without SeverityUnlocalized, Severity = %q, want FATAL", old.Severity)
	}

	other := AsError(errors.New("redis: connection refused"))
	if other.Severity != "ERROR" || other.Code != "XX000" || other.Message != "redis: connection refused" {
		t.Errorf("AsError(plain error) = %+v", other)
	}

	down := AsError(fmt.Errorf("shardmap: read tree: %w", &shardmap.UnavailableError{Err: syscall.ECONNREFUSED}))
	if down.Code != "58000" || down.Hint == "" {
		t.Errorf("AsError(store out of reach) = %+v, want 58000 with a hint", down)
	}
	// A node's network error is not the store's.
	if node := AsError(fmt.Errorf("node n1: %w", syscall.ECONNREFUSED)); node.Code == "58000" {
		t.Errorf("AsError(a node's network error) = %+v, taken for the store's", node)
	}
}
