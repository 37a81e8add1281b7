//go:build unix

package pgshard

import (
	"net"
	"testing"
	"time"
)

// TestConnAlive checks the idle-backend check over a real TCP socket: a
// quiet open socket is alive; one the server wrote to (a FATAL before
// closing) or closed is not.
func TestConnAlive(t *testing.T) {
	for _, tc := range []struct {
		name   string
		server func(net.Conn)
		alive  bool
	}{
		{"quiet", func(net.Conn) {}, true},
		{"server sent bytes", func(c net.Conn) { c.Write([]byte("E")) }, false},
		{"server closed", func(c net.Conn) { c.Close() }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, srv := tcpPair(t)
			tc.server(srv)
			c := &Conn{net: client}
			// What the server did reaches the client's socket after a
			// moment: wait for the expected answer, bounded.
			deadline := time.Now().Add(5 * time.Second)
			for c.alive() != tc.alive {
				if time.Now().After(deadline) {
					t.Fatalf("alive = %v, want %v", !tc.alive, tc.alive)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if tc.alive {
				// Checking consumed nothing and did not block: still alive,
				// and a byte sent now is read whole.
				if !c.alive() {
					t.Fatal("alive changed on a second check")
				}
				srv.Write([]byte("Z"))
				var b [1]byte
				client.SetReadDeadline(time.Now().Add(5 * time.Second))
				if n, err := client.Read(b[:]); n != 1 || b[0] != 'Z' || err != nil {
					t.Fatalf("read after checks = %q, %v", b[:n], err)
				}
			}
		})
	}
}

// TestQuietBesideBlockedReader: the check answers at once while another
// goroutine is blocked reading the same socket, as pgconn's background
// reader can be on an idle presence session; it must not wait for that
// reader's lock (a proxy's shutdown hung on it).
func TestQuietBesideBlockedReader(t *testing.T) {
	client, srv := tcpPair(t)
	read := make(chan struct{})
	go func() {
		var b [1]byte
		client.Read(b[:]) // blocks until the server writes
		close(read)
	}()
	time.Sleep(50 * time.Millisecond) // the reader is in its read
	answer := make(chan bool, 1)
	go func() { answer <- quiet(client) }()
	select {
	case ok := <-answer:
		if !ok {
			t.Fatal("quiet = false on a quiet socket")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("quiet waited for the blocked reader")
	}
	srv.Write([]byte("Z"))
	<-read
}

// tcpPair is a connected pair of loopback TCP sockets, closed when the test
// ends.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}
