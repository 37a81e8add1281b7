package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/shardmap"
)

// pgForwarder relays TCP connections to a PostgreSQL server and can stall
// the replication connections among them (those whose startup packet asks
// for replication), or all of them: it stops passing their bytes, both
// ways, as a network that stops delivering does, and passes what it holds
// once resumed, even from a client that has closed meanwhile.
type pgForwarder struct {
	ln     net.Listener
	target string
	scope  stallScope

	mu      sync.Mutex
	stalled chan struct{} // non-nil while stalled; closed to resume
	conns   []net.Conn
	ports   []int        // local ports of the connections to the server
	repl    atomic.Int64 // replication connections seen
	held    atomic.Int64 // reads held by a stall
}

// stallScope is which relayed connections a stall stops.
type stallScope int

const (
	stallReplication stallScope = iota
	stallEvery
)

func startForwarder(t *testing.T, target string, scope stallScope) *pgForwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &pgForwarder{ln: ln, target: target, scope: scope}
	go f.serve()
	t.Cleanup(f.close)
	return f
}

func (f *pgForwarder) addr() string { return f.ln.Addr().String() }

func (f *pgForwarder) close() {
	f.ln.Close()
	f.resume()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
}

// stall stops the replication connections' bytes until resume.
func (f *pgForwarder) stall() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stalled == nil {
		f.stalled = make(chan struct{})
	}
}

func (f *pgForwarder) resume() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stalled != nil {
		close(f.stalled)
		f.stalled = nil
	}
}

// gate blocks while stalled.
func (f *pgForwarder) gate() {
	f.mu.Lock()
	ch := f.stalled
	f.mu.Unlock()
	if ch != nil {
		f.held.Add(1)
		<-ch
	}
}

// serverPorts lists the local ports of the relay's connections to the
// server, as pg_stat_activity.client_port shows them.
func (f *pgForwarder) serverPorts() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ports)
}

func (f *pgForwarder) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		go f.relay(c)
	}
}

func (f *pgForwarder) relay(client net.Conn) {
	server, err := net.Dial("tcp", f.target)
	if err != nil {
		client.Close()
		return
	}
	f.mu.Lock()
	f.conns = append(f.conns, client, server)
	f.ports = append(f.ports, server.LocalAddr().(*net.TCPAddr).Port)
	f.mu.Unlock()
	defer client.Close()
	defer server.Close()
	// The startup packet: length, protocol, then name\0value\0 pairs. A
	// CancelRequest or SSLRequest has no parameters and is not replication.
	var hdr [4]byte
	if _, err := io.ReadFull(client, hdr[:]); err != nil {
		return
	}
	n := int(binary.BigEndian.Uint32(hdr[:]))
	if n < 8 || n > 10000 {
		return
	}
	body := make([]byte, n-4)
	if _, err := io.ReadFull(client, body); err != nil {
		return
	}
	params := bytes.Split(body[4:], []byte{0})
	repl := false
	for i := 0; i+1 < len(params); i += 2 {
		if string(params[i]) == "replication" {
			repl = true
		}
	}
	if repl {
		f.repl.Add(1)
	}
	if _, err := server.Write(append(hdr[:], body...)); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		for {
			k, err := src.Read(buf)
			if k > 0 {
				if repl || f.scope == stallEvery {
					f.gate()
				}
				if _, werr := dst.Write(buf[:k]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
}

// TestReplicationStall stalls the migrator's replication connection to the
// source node in the middle of a drain (a TCP forwarder in front of the
// node stops passing its bytes) while writers and a bulk load raise the
// lag far above --freeze-lag: the migration does not freeze while the lag
// is high, every write is served, and once the stream flows again the
// reshard completes with every acknowledged row in place exactly once.
// The other case terminates the walsender instead.
func TestReplicationStall(t *testing.T) {
	fc := startFaultCluster(t, 2)
	fwd := startForwarder(t, fmt.Sprintf("127.0.0.1:%d", fc.nodes[0].Port), stallReplication)
	dsns := fc.nodeDSNs()
	dsns[0] = fmt.Sprintf("postgres://lattice@%s/lattice?sslmode=disable", fwd.addr())
	for _, tc := range []struct {
		name string
		tree string
		// fault stalls or breaks the stream and returns what ends it.
		fault func(t *testing.T, ctx context.Context) (end func())
	}{
		{"stalled stream", "rs_stall", func(t *testing.T, ctx context.Context) func() {
			fwd.stall()
			return fwd.resume
		}},
		{"walsender terminated", "rs_term", func(t *testing.T, ctx context.Context) func() {
			conn, err := pgx.Connect(ctx, fc.nodeDSN(0))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_replication`).Scan(&n); err != nil || n == 0 {
				t.Fatalf("terminated %d walsenders, %v", n, err)
			}
			return func() {}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			p := startProxyOn(t, fc.redis.URL(), dsns, nil)
			pool := proxyPool(t, ctx, p)
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			initial := createFaultTree(t, ctx, conn.Conn(), tc.tree, 20000, 4)
			l := newInsertLedger()
			stop := startWriters(ctx, pool, tc.tree, 2, l)
			defer stop()

			// 4 -> 5 splits shard 0, whose node n1 sits behind the forwarder.
			// A lock on its table keeps every freeze from arming the fence,
			// so the migration stays in its drain until the fault is on.
			release := fc.lockShard(t, ctx, tc.tree, 0, "ROW EXCLUSIVE")
			defer release()
			if _, err := pool.Exec(ctx, "SELECT lattice_reshard($1, 5)", tc.tree); err != nil {
				t.Fatal(err)
			}
			pollUntil(t, 60*time.Second, "the migration to drain", func() (bool, error) {
				at, err := migrationPhases(ctx, fc, tc.tree)
				return slices.Contains(at, shardmap.PhaseDrain), err
			})
			replBefore := fwd.repl.Load()
			if replBefore == 0 {
				t.Fatal("the migrator's replication connection did not go through the forwarder")
			}
			end := tc.fault(t, ctx)

			// A bulk load of about 2 MB of WAL on the source, through the
			// proxy, puts the lag far above the default --freeze-lag.
			bulk := make([][]any, 4000)
			for i := range bulk {
				bulk[i] = []any{"bulk-" + strconv.Itoa(i), int64(i), strings.Repeat("y", 400)}
			}
			if _, err := conn.Conn().CopyFrom(ctx, pgx.Identifier{tc.tree}, []string{"k", "v", "pad"}, pgx.CopyFromRows(bulk)); err != nil {
				t.Fatalf("bulk load while the stream is stalled: %v", err)
			}
			for _, r := range bulk {
				l.record(r[0].(string), r[1].(int64), nil)
			}
			// Until the lock goes, freezes roll back. Once the drain has
			// measured the lag above --freeze-lag (256 kB) with nothing
			// frozen, the lock goes, and the drain must hold: no freeze
			// while the lag is high, for as long as the fault lasts.
			frozen := func() (bool, error) {
				_, m, err := fc.shardMap(ctx, tc.tree)
				if err != nil {
					return false, err
				}
				return len(m.Frozen) > 0, nil
			}
			if tc.name == "stalled stream" {
				pollUntil(t, 30*time.Second, "the drain to measure a high lag", func() (bool, error) {
					migs, err := fc.store.Migrations(ctx, "lattice", tc.tree)
					if err != nil || len(migs) != 1 {
						return false, err
					}
					if migs[0].Phase != shardmap.PhaseDrain || migs[0].LagBytes <= 256<<10 {
						return false, nil
					}
					f, err := frozen()
					return !f, err
				})
			}
			release()
			if tc.name == "stalled stream" {
				for held := time.Now(); time.Since(held) < 5*time.Second; {
					if f, err := frozen(); err != nil || f {
						t.Fatalf("slots froze while the stream was stalled with a high lag (%v)", err)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			end()
			waitReshardComplete(t, ctx, pool, tc.tree, 90*time.Second)
			stop()
			if fails := func() map[string]int {
				l.mu.Lock()
				defer l.mu.Unlock()
				return maps.Clone(l.failures)
			}(); len(fails) > 0 {
				t.Errorf("writes failed during the fault: %v", fails)
			}
			checkResharded(t, ctx, fc, pool, tc.tree, 5, initial, l)
			acked, _ := l.counts()
			t.Logf("%d inserts acknowledged; %d replication connections through the forwarder", acked, fwd.repl.Load())
		})
	}
}
