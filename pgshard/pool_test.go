package pgshard

import (
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
