package shardmap

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/lattice-db/lattice/sqlstate"
)

// UnavailableError is a store command that failed because Redis is out of
// reach (the network, or Redis refusing this client or not ready to serve),
// not because it rejected the request: the client may retry once Redis is
// back.
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string { return "redis out of reach: " + e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// SQLState and Hint make e a sqlstate.Hinted error: a client gets 58000,
// told that trees are served from the cached maps meanwhile.
func (e *UnavailableError) SQLState() string { return sqlstate.SystemError }
func (e *UnavailableError) Hint() string {
	return "retry once Redis is back; statements on trees keep being served from the cached maps meanwhile"
}

// Unavailable reports whether err comes from a store command that found
// Redis out of reach.
func Unavailable(err error) bool {
	var u *UnavailableError
	return errors.As(err, &u)
}

// unreachable tells a Redis error that means Redis is out of reach.
func unreachable(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) {
		return true
	}
	for _, prefix := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}

// unavailableHook marks the errors of commands that found Redis out of
// reach as *UnavailableError, so that they reach a client with a SQLSTATE
// that says so, and a network error of a node is not mistaken for one.
type unavailableHook struct{}

func (unavailableHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (unavailableHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return markUnavailable(next(ctx, cmd), cmd)
	}
}

func (unavailableHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			markUnavailable(cmd.Err(), cmd)
		}
		if err != nil && unreachable(err) {
			return &UnavailableError{Err: err}
		}
		return err
	}
}

func markUnavailable(err error, cmd redis.Cmder) error {
	if err == nil || !unreachable(err) || Unavailable(err) {
		return err
	}
	u := &UnavailableError{Err: err}
	cmd.SetErr(u)
	return u
}
