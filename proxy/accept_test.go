package proxy

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// flakyListener fails Accept with errs in turn, then hands out conn, then
// fails for good once closed.
type flakyListener struct {
	mu     sync.Mutex
	errs   []error
	conn   net.Conn
	closed chan struct{}
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		l.mu.Unlock()
		return nil, err
	}
	c := l.conn
	l.conn = nil
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	<-l.closed
	return nil, net.ErrClosed
}
func (l *flakyListener) Close() error   { return nil }
func (l *flakyListener) Addr() net.Addr { return &net.TCPAddr{} }

func TestAcceptLoopRetriesTemporaryErrors(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ECONNABORTED} {
		t.Run(errno.Error(), func(t *testing.T) {
			client, server := net.Pipe()
			defer client.Close()
			opErr := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
			ln := &flakyListener{errs: []error{opErr, opErr, opErr}, conn: server, closed: make(chan struct{})}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var retries int
			got := make(chan net.Conn, 1)
			done := make(chan error, 1)
			go func() {
				done <- acceptLoop(ctx, ln, func(error, time.Duration) { retries++ }, func(c net.Conn) { got <- c })
			}()
			select {
			case <-got:
			case err := <-done:
				t.Fatalf("accept loop ended on %v: %v", errno, err)
			}
			if retries != 3 {
				t.Errorf("retries = %d, want 3", retries)
			}
			cancel()
			close(ln.closed)
			if err := <-done; err != nil {
				t.Errorf("accept loop after cancel: %v", err)
			}
		})
	}
}

func TestAcceptLoopEndsOnPermanentError(t *testing.T) {
	ln := &flakyListener{errs: []error{net.ErrClosed}, closed: make(chan struct{})}
	err := acceptLoop(context.Background(), ln, func(error, time.Duration) { t.Error("retried a closed listener") }, func(net.Conn) {})
	if err == nil {
		t.Fatal("accept loop went on after its listener closed")
	}
}

func TestStartupSlots(t *testing.T) {
	addr := func(host string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(host), Port: 5000} }
	s := newStartupSlots(3, 2)
	type step struct {
		host string
		want bool // granted
	}
	var releases []func()
	for i, st := range []step{
		{"10.0.0.1", true}, {"10.0.0.1", true}, {"10.0.0.1", false}, // the host's bound
		{"10.0.0.2", true}, {"10.0.0.3", false}, // the overall bound
	} {
		rel, err := s.take(addr(st.host))
		if (err == nil) != st.want {
			t.Fatalf("step %d (%s): err = %v, want granted %v", i, st.host, err, st.want)
		}
		if err != nil {
			if code := sqlstate.As(err).Code; code != sqlstate.TooManyConnections {
				t.Errorf("step %d: SQLSTATE %s, want 53300", i, code)
			}
			continue
		}
		releases = append(releases, rel)
	}
	releases[0]()
	releases[0]() // twice is once
	if _, err := s.take(addr("10.0.0.1")); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := s.take(addr("10.0.0.3")); err == nil {
		t.Fatal("a double release freed two slots")
	}
}

// readError reads the first message the server sends on conn, which must be
// an ErrorResponse after at most AuthenticationOk.
func readError(t *testing.T, conn net.Conn) *pgproto3.ErrorResponse {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(conn, io.Discard)
	for {
		msg, err := fe.Receive()
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		switch m := msg.(type) {
		case *pgproto3.AuthenticationOk:
		case *pgproto3.ErrorResponse:
			return m
		default:
			t.Fatalf("got %T, want ErrorResponse", msg)
		}
	}
}

// TestServeBoundsStartups: silent sockets hold startup slots only up to the
// bound, and count toward --max-clients while they do.
func TestServeBoundsStartups(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      Config
		complete bool   // the third connection sends its startup
		want     string // in the third connection's error
	}{
		{"max-startups", Config{MaxStartups: 2, MaxStartupsPerHost: 10}, false, "--max-startups limit"},
		{"max-startups-per-host", Config{MaxStartups: 10, MaxStartupsPerHost: 2}, false, "--max-startups-per-host limit"},
		{"max-clients", Config{MaxClients: 2, MaxStartups: 10, MaxStartupsPerHost: 10}, true, "too many clients"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			tc.cfg.Startup.StartupTimeout = time.Minute
			srv := NewServer(tc.cfg, nil, nil, nil, nil)
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ctx, ln) }()
			defer func() {
				cancel()
				if err := <-served; err != nil {
					t.Errorf("Serve: %v", err)
				}
			}()
			dial := func() net.Conn {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			waitClients := func(n int64) {
				for deadline := time.Now().Add(10 * time.Second); srv.Clients() != n; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("clients = %d, want %d", srv.Clients(), n)
					}
				}
			}
			silent := dial()
			dial()
			waitClients(2)
			third := dial()
			if tc.complete {
				if _, err := third.Write(startupPacket(pgproto3.ProtocolVersion30, "user", "u")); err != nil {
					t.Fatal(err)
				}
			}
			e := readError(t, third)
			if e.Code != sqlstate.TooManyConnections || !strings.Contains(e.Message, tc.want) {
				t.Fatalf("third connection: %s %s, want 53300 with %q", e.Code, e.Message, tc.want)
			}
			// A cancel request is no client: it frees what it held.
			if _, err := silent.Write(codePacket(cancelRequestCode, 0, 0, 0, 1, 0, 0, 0, 2)); err != nil {
				t.Fatal(err)
			}
			waitClients(1)
		})
	}
}
