package pgshard

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// slowFirstWrite is a client socket whose first write (the startup
// message) lingers after its bytes went out, as a write does when the
// machine deschedules the writer: pgconn then starts its background reader,
// which is still blocked in a read of the socket when startup ends.
type slowFirstWrite struct {
	*net.TCPConn
	writes atomic.Int32
}

func (c *slowFirstWrite) Write(b []byte) (int, error) {
	n, err := c.TCPConn.Write(b)
	if c.writes.Add(1) == 1 {
		time.Sleep(40 * time.Millisecond) // past pgconn's 15 ms slow-write timer
	}
	return n, err
}

// TestTakeOverStopsBackgroundReader: a backend whose startup left pgconn's
// background reader in a read of the socket must not lose its first answer
// to that reader once the proxy reads the socket itself. It did: the
// session waited for an answer the reader had taken, holding its view, and
// a reshard waited on it (the stalls of TestReshardUnderLoadTwoProxies).
func TestTakeOverStopsBackgroundReader(t *testing.T) {
	addr := fakeServer(t, func(be *pgproto3.Backend) error {
		be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		return nil
	})
	cfg, err := pgconn.ParseConfig("postgres://u@" + addr + "/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &slowFirstWrite{TCPConn: nc.(*net.TCPConn)}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := connectConfig(ctx, "n1", "t", cfg, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
		t.Fatal(err)
	}
	c.Send(&pgproto3.Query{String: "SELECT 1"})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := c.Receive()
		if err != nil {
			t.Fatalf("the backend's answer did not arrive: %v", err)
		}
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			return
		}
	}
}
