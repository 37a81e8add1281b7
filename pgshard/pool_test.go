package pgshard

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestForgetClosesBackendsOnRelease: a backend in use when its node's pools
// are forgotten is closed when released, and never joins the new pool that
// a later Acquire opened under the same node and tenant (whose slot
// accounting it is no part of).
func TestForgetClosesBackendsOnRelease(t *testing.T) {
	p := NewPools(PoolConfig{MaxConns: 2}, func(node, tenant string) (string, error) { return "postgres://u@h/" + tenant, nil })
	old, err := p.get("n4", "app")
	if err != nil {
		t.Fatal(err)
	}
	client, server := net.Pipe()
	defer server.Close()
	go func() { // the "server" swallows the Terminate
		b := make([]byte, 64)
		for {
			if _, err := server.Read(b); err != nil {
				return
			}
		}
	}()
	c := &Conn{Node: "n4", Tenant: "app", TxStatus: 'I', net: client, fe: pgproto3.NewFrontend(client, client), pool: old}
	old.slots <- struct{}{} // c is in use

	p.Forget("n4")
	fresh, err := p.get("n4", "app")
	if err != nil {
		t.Fatal(err)
	}
	if fresh == old {
		t.Fatal("Forget kept the pool")
	}
	done := make(chan struct{})
	go func() {
		p.Release(c)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Release of a forgotten pool's backend blocked on the new pool's slots")
	}
	fresh.mu.Lock()
	idle := len(fresh.idle)
	fresh.mu.Unlock()
	if idle != 0 || len(fresh.slots) != 0 {
		t.Fatalf("the new pool took the old backend: %d idle, %d in use", idle, len(fresh.slots))
	}
	if _, err := client.Write([]byte{0}); err == nil {
		t.Fatal("the old backend was not closed")
	}
}

// TestPoolRefusesReportedStartup: a new backend whose startup values
// CheckParam refuses (a role's ALTER ROLE ... SET) is closed and fails the
// acquire; its node token goes back, so the next backend opens (the node
// allows one).
func TestPoolRefusesReportedStartup(t *testing.T) {
	ctx := context.Background()
	refuse := errors.New("refused")
	p, _ := fakePools(t, PoolConfig{MaxConns: 1, MaxNodeConns: 1, AcquireTimeout: 50 * time.Millisecond,
		CheckParam: func(name, value string) error {
			if name == "standard_conforming_strings" && value != "on" {
				return refuse
			}
			return nil
		}})
	fake := p.connect
	scs, opened := "off", []*Conn{}
	p.connect = func(ctx context.Context, node, tenant, dsn string, maxMessage int) (*Conn, error) {
		c, err := fake(ctx, node, tenant, dsn, maxMessage)
		if err == nil {
			c.Params = map[string]string{"standard_conforming_strings": scs}
			opened = append(opened, c)
		}
		return c, err
	}
	if _, err := p.Acquire(ctx, "u", "n1", "a"); !errors.Is(err, refuse) {
		t.Fatalf("acquire of a backend that started with standard_conforming_strings off: %v, want the refusal", err)
	}
	scs = "on"
	c, err := p.Acquire(ctx, "u", "n1", "a")
	if err != nil {
		t.Fatalf("the next backend: %v", err)
	}
	p.Release(c)
	if !opened[0].closed.Load() {
		t.Fatal("the refused backend is open")
	}
}
