package proxy

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/lattice-db/lattice/sqlstate"
)

// Defaults of the bounds on connections in startup. A silent socket holds a
// startup slot until --startup-timeout; past the bound, a connection is
// answered 53300 and closed at once, so silent sockets cannot use up the
// file descriptors or the goroutines.
const (
	DefaultMaxStartups        = 256
	DefaultMaxStartupsPerHost = 64
)

// Accept backs off on errors that a later Accept may not see (no file
// descriptor free, a connection reset before it was accepted), as net/http
// does, instead of ending Serve.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// temporaryAccept reports an Accept error after which the listener still
// works.
func temporaryAccept(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ECONNABORTED, syscall.ECONNRESET, syscall.ENOBUFS, syscall.ENOMEM, syscall.EAGAIN, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// acceptLoop accepts connections on ln and hands each to serve, backing off
// on temporary errors. It returns when ctx ends (nil) or ln fails for good.
func acceptLoop(ctx context.Context, ln net.Listener, onTemporary func(error, time.Duration), serve func(net.Conn)) error {
	var delay time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !temporaryAccept(err) {
				return err
			}
			delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
			onTemporary(err, delay)
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			continue
		}
		delay = 0
		serve(conn)
	}
}

// startupSlots bounds the connections in startup, overall and per source
// host.
type startupSlots struct {
	max, perHost int

	mu     sync.Mutex
	total  int
	byHost map[string]int
}

func newStartupSlots(max, perHost int) *startupSlots {
	if max <= 0 {
		max = DefaultMaxStartups
	}
	if perHost <= 0 {
		perHost = DefaultMaxStartupsPerHost
	}
	return &startupSlots{max: max, perHost: perHost, byHost: map[string]int{}}
}

// take reserves a slot for a connection from addr; release gives it back.
// It fails with 53300 when the overall or the host's bound is reached.
func (s *startupSlots) take(addr net.Addr) (release func(), err error) {
	host := addr.String()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total >= s.max {
		e := sqlstate.Fatal(sqlstate.TooManyConnections, "too many connections in startup (%d, the --max-startups limit)", s.max)
		e.Hint = "Clients must finish startup within --startup-timeout; raise --max-startups if this many legitimately connect at once."
		return nil, e
	}
	if s.byHost[host] >= s.perHost {
		e := sqlstate.Fatal(sqlstate.TooManyConnections, "too many connections in startup from %s (%d, the --max-startups-per-host limit)", host, s.perHost)
		e.Hint = "Clients must finish startup within --startup-timeout; raise --max-startups-per-host if one host legitimately opens this many at once."
		return nil, e
	}
	s.total++
	s.byHost[host]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.total--
			if s.byHost[host]--; s.byHost[host] == 0 {
				delete(s.byHost, host)
			}
		})
	}, nil
}

// refuseConn answers a connection refused before its startup was read with
// err's ErrorResponse (libpq reads one in place of the answer to SSLRequest
// too) and closes nothing: the caller does.
func refuseConn(conn net.Conn, err error) {
	buf, encErr := sqlstate.As(err).Response().Encode(nil)
	if encErr != nil {
		return
	}
	_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = conn.Write(buf)
}
