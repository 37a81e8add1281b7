package sqlstate

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/secret"
)

// What a client may see of a node is its name (n1), which every message
// about a node carries. Its address, its user and its connection string
// are the operator's: the errors of connecting and of the network name
// them, so clientText leaves those parts out.

// clientText is err's message as a client may read it.
func clientText(err error) string {
	msg := err.Error()
	for _, e := range chain(err) {
		if safe, ok := safeText(e); ok {
			msg = strings.ReplaceAll(msg, e.Error(), safe)
		}
	}
	return secret.Redact(msg)
}

// chain lists err and every error it wraps, outermost first, so that a
// wrapper is rewritten before the errors inside its text.
func chain(err error) []error {
	var out []error
	stack := []error{err}
	for len(stack) > 0 && len(out) < 64 {
		e := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if e == nil {
			continue
		}
		out = append(out, e)
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			stack = append(stack, u.Unwrap())
		case interface{ Unwrap() []error }:
			errs := u.Unwrap()
			for i := len(errs) - 1; i >= 0; i-- {
				stack = append(stack, errs[i])
			}
		}
	}
	return out
}

// safeText is the client's text for an error that names a node's address
// or user, and false for any other error.
func safeText(e error) (string, bool) {
	switch x := e.(type) {
	case *pgconn.ConnectError:
		return "cannot connect: " + connectCause(x), true
	case *pgconn.ParseConfigError:
		return "invalid connection settings", true
	case *net.OpError:
		if x.Err == nil {
			return x.Op, true
		}
		s, ok := safeText(x.Err)
		if !ok {
			s = x.Err.Error()
		}
		return x.Op + ": " + s, true
	case *net.DNSError:
		return "cannot resolve the host name: " + x.Err, true
	case *net.AddrError:
		return "bad address: " + x.Err, true
	}
	return "", false
}

// connectCause says why a connection failed, in words that name nothing.
func connectCause(e *pgconn.ConnectError) string {
	var pg *pgconn.PgError
	var errno syscall.Errno
	var ne net.Error
	var dns *net.DNSError
	switch {
	case errors.As(e, &pg):
		return connectPgText(pg)
	case errors.Is(e, context.DeadlineExceeded), errors.As(e, &ne) && ne.Timeout():
		return "timed out"
	case errors.Is(e, context.Canceled):
		return "canceled"
	case errors.As(e, &dns):
		return "cannot resolve the host name"
	case errors.As(e, &errno):
		return errno.Error()
	}
	return "the connection failed"
}

// connectPgText is a server's refusal of a new connection. Those of class
// 28 (authentication) name the node's user and the proxy's address.
func connectPgText(pg *pgconn.PgError) string {
	if strings.HasPrefix(pg.Code, "28") {
		return "the node refused the proxy's credentials (SQLSTATE " + pg.Code + ")"
	}
	return pg.Message + " (SQLSTATE " + pg.Code + ")"
}
