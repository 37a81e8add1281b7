package rawsock

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pair returns the two ends of a loopback TCP connection, the first
// wrapped.
func pair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	w := Wrap(c)
	if _, ok := w.(*Conn); !ok && supported {
		t.Fatalf("Wrap(%T) = %T, want *Conn", c, w)
	}
	t.Cleanup(func() { w.Close(); peer.Close() })
	return w, peer
}

// TestRoundTrip sends more than a socket buffer holds each way, so that
// writes wait for writability and reads for readability.
func TestRoundTrip(t *testing.T) {
	for _, size := range []int{1, 4096, 8 << 20} {
		w, peer := pair(t)
		msg := bytes.Repeat([]byte("lattice!"), size/8+1)[:size]
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // the peer echoes what it reads
			defer wg.Done()
			_, _ = io.CopyN(peer, peer, int64(size))
		}()
		go func() {
			if n, err := w.Write(msg); n != size || err != nil {
				t.Errorf("size %d: Write = %d, %v", size, n, err)
				w.Close() // the echo can never be whole: end the read below
			}
		}()
		got := make([]byte, size)
		if _, err := io.ReadFull(w, got); err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("size %d: echo differs", size)
		}
		wg.Wait()
	}
}

// TestErrors: the errors a net.Conn gives, which callers test for.
func TestErrors(t *testing.T) {
	tests := []struct {
		name  string
		setup func(w, peer net.Conn)
		op    func(w net.Conn) error
		is    func(error) bool
	}{
		{"end of stream", func(_, peer net.Conn) { peer.Close() },
			func(w net.Conn) error { _, err := w.Read(make([]byte, 8)); return err },
			func(err error) bool { return err == io.EOF }},
		{"read deadline", func(w, _ net.Conn) { _ = w.SetReadDeadline(time.Now().Add(20 * time.Millisecond)) },
			func(w net.Conn) error { _, err := w.Read(make([]byte, 8)); return err },
			func(err error) bool {
				var ne net.Error
				return errors.Is(err, os.ErrDeadlineExceeded) && errors.As(err, &ne) && ne.Timeout()
			}},
		{"write deadline", func(w, _ net.Conn) { _ = w.SetWriteDeadline(time.Now().Add(20 * time.Millisecond)) },
			func(w net.Conn) error { _, err := w.Write(make([]byte, 64<<20)); return err }, // the peer reads nothing
			func(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }},
		{"closed", func(w, _ net.Conn) { w.Close() },
			func(w net.Conn) error { _, err := w.Read(make([]byte, 8)); return err },
			func(err error) bool {
				var oe *net.OpError
				return errors.Is(err, net.ErrClosed) && errors.As(err, &oe) && oe.Op == "read"
			}},
		{"reset", func(_, peer net.Conn) {
			_ = peer.(*net.TCPConn).SetLinger(0)
			peer.Close()
			time.Sleep(20 * time.Millisecond)
		},
			func(w net.Conn) error { _, err := w.Read(make([]byte, 8)); return err },
			func(err error) bool {
				var oe *net.OpError
				return errors.Is(err, syscall.ECONNRESET) && errors.As(err, &oe) && oe.Op == "read"
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, peer := pair(t)
			tt.setup(w, peer)
			if err := tt.op(w); !tt.is(err) {
				t.Fatalf("error %#v", err)
			}
		})
	}
}

// TestCloseWakesReader: a Close from another goroutine ends a read that
// waits, as on a plain connection.
func TestCloseWakesReader(t *testing.T) {
	w, _ := pair(t)
	done := make(chan error)
	go func() { _, err := w.Read(make([]byte, 8)); done <- err }()
	time.Sleep(20 * time.Millisecond)
	w.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("error %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read still waits after Close")
	}
}

// TestSyscallConn: code that peeks at the socket reaches it through the
// wrapper.
func TestSyscallConn(t *testing.T) {
	w, peer := pair(t)
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	sc, ok := w.(syscall.Conn)
	if !ok {
		t.Fatalf("%T has no SyscallConn", w)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var perr error
	deadline := time.Now().Add(5 * time.Second)
	for n == 0 && time.Now().Before(deadline) {
		_ = raw.Control(func(fd uintptr) {
			n, _, perr = syscall.Recvfrom(int(fd), make([]byte, 1), syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		})
		if errors.Is(perr, syscall.EAGAIN) {
			n = 0
			time.Sleep(time.Millisecond)
		}
	}
	if n != 1 {
		t.Fatalf("peek = %d, %v", n, perr)
	}
}

// TestNoAllocs: a read or write that the socket takes at once allocates
// nothing, which is why the callbacks are made once per connection.
func TestNoAllocs(t *testing.T) {
	if !supported {
		t.Skip("no raw system calls here")
	}
	w, peer := pair(t)
	msg := []byte("ping")
	buf := make([]byte, 16)
	pbuf := make([]byte, 16)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := w.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, pbuf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(w, buf[:len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Fatalf("%.1f allocations per round trip", allocs)
	}
}

// TestPeerClosed: a peer that is there, with or without data waiting, is
// not closed, and the data stays to be read; a peer that closed, shut its
// side down or reset the connection is, with data it sent still unread
// (a TLS close_notify, pipelined messages), and behind TLS too.
func TestPeerClosed(t *testing.T) {
	if !supported {
		t.Skip("no raw sockets on this platform")
	}
	for _, end := range []string{"close", "close after data", "shutdown", "reset"} {
		t.Run(end, func(t *testing.T) {
			c, peer := pair(t)
			defer c.Close()
			if PeerClosed(c) {
				t.Fatal("closed with the peer there and nothing sent")
			}
			if _, err := peer.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
			if PeerClosed(c) {
				t.Fatal("closed with the peer there and a byte waiting")
			}
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); err != nil || b[0] != 'x' {
				t.Fatalf("the byte waiting was taken: read %q, %v", b, err)
			}
			switch end {
			case "close after data":
				if _, err := peer.Write([]byte("unread")); err != nil {
					t.Fatal(err)
				}
			case "reset":
				_ = peer.(*net.TCPConn).SetLinger(0)
			}
			if end == "shutdown" {
				_ = peer.(*net.TCPConn).CloseWrite()
				defer peer.Close()
			} else {
				peer.Close()
			}
			deadline := time.Now().Add(2 * time.Second)
			for !PeerClosed(c) {
				if time.Now().After(deadline) {
					t.Fatalf("not closed 2 s after the peer's %s", end)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if PeerClosed(tlsOver(c)) != true {
				t.Fatal("not closed when seen through a TLS connection")
			}
		})
	}
}

// tlsOver wraps c as a TLS client would, without a handshake: PeerClosed
// looks through it to the socket.
func tlsOver(c net.Conn) net.Conn { return tls.Client(c, &tls.Config{InsecureSkipVerify: true}) }
