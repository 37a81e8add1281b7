package pgshard

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// fakePools are pools whose backends are pipes to a sink, counting the
// backends open now.
func fakePools(t *testing.T, cfg PoolConfig) (*Pools, *atomic.Int64) {
	t.Helper()
	var open atomic.Int64
	p := NewPools(cfg, func(node, tenant string) (string, error) { return "postgres://u@h/" + tenant, nil })
	p.connect = func(ctx context.Context, node, tenant, dsn string, maxMessage int) (*Conn, error) {
		client, server := net.Pipe()
		go func() {
			io.Copy(io.Discard, server)
			open.Add(-1)
		}()
		t.Cleanup(func() { server.Close() })
		open.Add(1)
		return &Conn{Node: node, Tenant: tenant, TxStatus: 'I', net: client, fe: pgproto3.NewFrontend(client, client)}, nil
	}
	return p, &open
}

// TestNodeCap: the backends open on one node, of every tenant, stay within
// MaxNodeConns. An idle backend of another tenant is closed to make room;
// with none idle, an acquire fails with 53300 and a hint once the wait is
// over, and another node is not held up by it.
func TestNodeCap(t *testing.T) {
	ctx := context.Background()
	p, open := fakePools(t, PoolConfig{MaxConns: 8, MaxNodeConns: 2, MaxUserConns: 8, AcquireTimeout: 50 * time.Millisecond})

	a1, err := p.Acquire(ctx, "u", "n1", "a")
	if err != nil {
		t.Fatal(err)
	}
	a2, err := p.Acquire(ctx, "u", "n1", "a")
	if err != nil {
		t.Fatal(err)
	}
	p.Release(a2) // idle, and still open on n1
	b1, err := p.Acquire(ctx, "u", "n1", "b")
	if err != nil {
		t.Fatalf("tenant b on a node full of a's backends, one idle: %v", err)
	}
	if idle := p.idleOf("n1", "a"); idle != 0 {
		t.Errorf("a's idle backend was kept (%d idle): it should have made room for b", idle)
	}

	_, err = p.Acquire(ctx, "u", "n1", "c")
	var e *sqlstate.Error
	if !errors.As(err, &e) || e.Code != sqlstate.TooManyConnections || e.Hint == "" {
		t.Fatalf("a third backend on a node with room for two, none idle: %v, want 53300 with a hint", err)
	}
	if other, err := p.Acquire(ctx, "u", "n2", "c"); err != nil {
		t.Errorf("another node: %v", err)
	} else {
		p.Release(other)
	}

	// A backend released while another waits for room on its node makes
	// the room, rather than idling.
	got := make(chan error, 1)
	p.cfg.AcquireTimeout = time.Minute
	go func() {
		c, err := p.Acquire(ctx, "u", "n1", "c")
		if err == nil {
			p.Release(c)
		}
		got <- err
	}()
	for p.nodeCapOf("n1").waiting.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	p.Release(a1)
	if err := <-got; err != nil {
		t.Fatalf("waiting for room on n1: %v", err)
	}
	p.Release(b1)
	p.Close()
	for open.Load() != 0 {
		time.Sleep(time.Millisecond)
	}
	if n := len(p.nodeCapOf("n1").open); n != 0 {
		t.Errorf("n1 counts %d backends open after every one closed", n)
	}
}

// TestUserCap: one user's sessions use at most MaxUserConns backends at
// once, across nodes and tenants; past it an acquire fails with 53300 and a
// hint, while another user goes on. A released backend (a pinned one only
// once unpinned) gives its user the room back, and a user with nothing in
// use leaves no entry behind.
func TestUserCap(t *testing.T) {
	ctx := context.Background()
	p, _ := fakePools(t, PoolConfig{MaxConns: 8, MaxNodeConns: 8, MaxUserConns: 2, AcquireTimeout: 50 * time.Millisecond})

	c1, err := p.Acquire(ctx, "mallory", "n1", "a")
	if err != nil {
		t.Fatal(err)
	}
	c2, err := p.Acquire(ctx, "mallory", "n2", "b")
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Acquire(ctx, "mallory", "n3", "c")
	var e *sqlstate.Error
	if !errors.As(err, &e) || e.Code != sqlstate.TooManyConnections || e.Hint == "" {
		t.Fatalf("a third backend for a user allowed two: %v, want 53300 with a hint", err)
	}
	bob, err := p.Acquire(ctx, "bob", "n1", "a")
	if err != nil {
		t.Fatalf("another user while mallory is at her cap: %v", err)
	}
	p.Release(bob)

	p.Pin(c2)
	p.Release(c2) // still the session's
	if _, err := p.Acquire(ctx, "mallory", "n3", "c"); err == nil {
		t.Fatal("a pinned backend's room was given back before it was unpinned")
	}
	p.Unpin(c2)
	c3, err := p.Acquire(ctx, "mallory", "n3", "c")
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	p.Release(c1)
	p.Release(c3)
	p.mu.Lock()
	left := len(p.users)
	p.mu.Unlock()
	if left != 0 {
		t.Errorf("%d user entries left with nothing in use", left)
	}
}

func (p *Pools) idleOf(node, tenant string) int {
	p.mu.Lock()
	pl := p.pools[poolKey{node, tenant}]
	p.mu.Unlock()
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return len(pl.idle)
}
