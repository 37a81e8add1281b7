package proxy

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lattice-db/lattice/sqlstate"
)

// TestSessionPanicEndsOnlyThatSession: a panic in a session's code is
// logged with its stack, counted, and answered with FATAL XX000, and the
// server goes on serving other sessions.
func TestSessionPanicEndsOnlyThatSession(t *testing.T) {
	srv := nodelessServer(t)
	var logs bytes.Buffer
	srv.log = slog.New(slog.NewTextHandler(&logs, nil))
	conn := &dribbleConn{in: aliceStartup}
	st, err := Handshake(context.Background(), conn, srv.cfg.Startup)
	if err != nil {
		t.Fatal(err)
	}
	sess := srv.newSession(conn, st)
	func() {
		defer srv.recoverSession(sess)
		var plans map[string]int
		plans["bug"]++ // a nil map: the kind of bug the recovery is for
	}()
	msgs := serverMessages(t, conn.out.Bytes())
	last, ok := msgs[len(msgs)-1].(*pgproto3.ErrorResponse)
	if !ok || last.Severity != "FATAL" || last.Code != sqlstate.InternalError || !strings.Contains(last.Message, "assignment to entry in nil map") {
		t.Fatalf("the client got %+v, want FATAL XX000 naming the panic", msgs[len(msgs)-1])
	}
	if got := testutil.ToFloat64(srv.metrics.conns[connPanicked]); got != 1 {
		t.Errorf("panicked sessions counted %v, want 1", got)
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "panic_test.go") {
		t.Errorf("the log has no error with the panic's stack:\n%s", logs.String())
	}
	// Another session is served.
	other := runSession(t, srv, cat(aliceStartup, encode(&pgproto3.Query{String: "SELECT 1 FROM t FOR UPDATE"})))
	if msgs := serverMessages(t, other.out.Bytes()); len(msgs) < 2 {
		t.Fatalf("another session got %d messages", len(msgs))
	}
}
