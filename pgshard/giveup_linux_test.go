package pgshard

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestResetOnGiveUp: bytes a connection still holds to send when a write,
// or a read awaiting the answer, times out never reach the peer; a
// connection closed normally delivers everything it was given.
func TestResetOnGiveUp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		giveUp   string // "write": write until a write times out, as a partition makes it; "read": leave bytes queued, then a read times out
		wantDrop bool
	}{
		{"a write timed out", "write", true},
		{"a read timed out with bytes unacknowledged", "read", true},
		{"closed normally", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				c, err := ln.Accept()
				if err == nil {
					c.(*net.TCPConn).SetReadBuffer(4096)
				}
				accepted <- c
			}()
			d := &net.Dialer{}
			c, err := ResetOnGiveUp(d.DialContext)(context.Background(), "tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			gc := c.(*giveUpConn)
			gc.SetWriteBuffer(4096)
			peer := <-accepted
			if peer == nil {
				t.Fatal("accept failed")
			}
			defer peer.Close()

			chunk := make([]byte, 8192)
			written := 0
			switch tc.giveUp {
			case "write":
				// The peer reads nothing, so the buffers fill and a write
				// times out with bytes still queued.
				for range 10000 {
					gc.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
					n, err := gc.Write(chunk)
					written += n
					if errors.Is(err, os.ErrDeadlineExceeded) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
				}
			case "read":
				// Small writes until the peer's buffer is full and the
				// kernel holds some unsent: a request written whole, its
				// answer awaited.
				for range 100000 {
					gc.SetWriteDeadline(time.Now().Add(time.Second))
					n, err := gc.Write(chunk[:512])
					written += n
					if err != nil {
						t.Fatal(err)
					}
					if notSent(t, gc.TCPConn) > 0 {
						break
					}
				}
				gc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				if _, err := gc.Read(chunk); !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("read: %v, want a timeout", err)
				}
			default:
				n, err := gc.Write(chunk[:1000])
				if err != nil {
					t.Fatal(err)
				}
				written = n
			}
			if tc.giveUp != "" && !gc.timedOut.Load() {
				t.Fatal("no I/O timed out")
			}
			// Given up on, the connection is reset at once, not at its
			// close (pgconn closes up to 15 s later): the peer reads before
			// it. Closed normally, it delivers all.
			if tc.giveUp == "" {
				if err := gc.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				defer gc.Close()
			}
			peer.SetReadDeadline(time.Now().Add(2 * time.Second))
			got, err := io.Copy(io.Discard, peer)
			dropped := int(got) < written
			if dropped != tc.wantDrop {
				t.Fatalf("the peer read %d of %d bytes written (read error %v); want bytes dropped: %v", got, written, err, tc.wantDrop)
			}
			t.Logf("the peer read %d of %d bytes (read error %v)", got, written, err)
		})
	}
}

// notSent is how many bytes written to c the kernel has not sent yet.
func notSent(t *testing.T, c *net.TCPConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	raw.Control(func(fd uintptr) {
		if n, err = unix.IoctlGetInt(int(fd), unix.SIOCOUTQNSD); err != nil {
			t.Fatal(err)
		}
	})
	return n
}
