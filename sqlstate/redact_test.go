package sqlstate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TestClientTextHidesNodes: errors of connecting to a node and of its
// network reach a client naming the node, not its address, user or
// password.
func TestClientTextHidesNodes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, connErr := pgconn.Connect(ctx, "postgres://nodeuser:s3cret@"+addr+"/lattice?sslmode=disable&connect_timeout=5")
	if connErr == nil {
		t.Fatal("connected to a closed port")
	}
	_, dialErr := net.Dial("tcp", addr)
	if dialErr == nil {
		t.Fatal("dialed a closed port")
	}
	_, parseErr := pgconn.ParseConfig("postgres://nodeuser:s3cret@" + addr + "/x?sslmode=bogus")
	if parseErr == nil {
		t.Fatal("parsed a bad DSN")
	}
	wrapped := fmt.Errorf("node n2: %w", connErr)
	tests := []struct {
		name string
		err  *Error
		want string
	}{
		{"New with a connect error", New(ConnectionFailure, "cannot reach node %s: %v", "n2", wrapped), "cannot reach node n2: node n2: cannot connect: connection refused"},
		{"As of a connect error", As(wrapped), "node n2: cannot connect: connection refused"},
		{"New with a network error", New(ConnectionFailure, "lost connection to node %s: %v", "n2", dialErr), "lost connection to node n2: dial: connect: connection refused"},
		{"As of a joined error", As(errors.Join(errors.New("n1 ok"), fmt.Errorf("node n2: %w", dialErr))), "n1 ok\nnode n2: dial: connect: connection refused"},
		{"a bad DSN", As(fmt.Errorf("node n2: %w", parseErr)), "node n2: invalid connection settings"},
		{"detail", New(ConnectionFailure, "x").WithDetail("%v", wrapped), ""},
	}
	for _, tc := range tests {
		text := tc.err.Message + " " + tc.err.Detail + " " + tc.err.Hint
		for _, leak := range []string{addr, "127.0.0.1", "nodeuser", "s3cret", "user="} {
			if strings.Contains(text, leak) {
				t.Errorf("%s: %q shows %q", tc.name, text, leak)
			}
		}
		if tc.want != "" && tc.err.Message != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, tc.err.Message, tc.want)
		}
	}
}

// TestClientTextLoginRefused: a node that refuses the proxy's login says so
// without the user it names. The node is a listener that answers every
// startup as PostgreSQL does a wrong password.
func TestClientTextLoginRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			be := pgproto3.NewBackend(c, c)
			if msg, err := be.ReceiveStartupMessage(); err == nil {
				if _, ssl := msg.(*pgproto3.SSLRequest); ssl {
					c.Write([]byte("N"))
					be.ReceiveStartupMessage()
				}
				be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01", Message: `password authentication failed for user "nodeuser"`})
				be.Flush()
			}
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, connErr := pgconn.Connect(ctx, "postgres://nodeuser:s3cret@"+ln.Addr().String()+"/lattice?sslmode=disable")
	if connErr == nil {
		t.Fatal("connected")
	}
	e := As(fmt.Errorf("node n2: %w", connErr))
	if strings.Contains(e.Message, "nodeuser") || strings.Contains(e.Message, "127.0.0.1") || e.Code != "28P01" || !strings.Contains(e.Message, "n2") {
		t.Errorf("login refused: %+v", e)
	}
}
