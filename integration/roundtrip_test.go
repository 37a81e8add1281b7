package integration

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
)

// wireRelay sits between the proxy and one node and records what the proxy
// sends there: each Query's and Parse's text, in flights. A flight is what
// the proxy sends on a connection before the node next answers on it, so
// the flights of a transaction are its round trips to the node.
type wireRelay struct {
	addr string
	mu   sync.Mutex
	// flights[conn] lists the flights of that backend connection, each the
	// statement texts it carried.
	flights map[int][][]string
	next    int
}

// startWireRelay forwards a loopback port to the node at target.
func startWireRelay(t *testing.T, target string) *wireRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &wireRelay{addr: ln.Addr().String(), flights: map[int][][]string{}}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			front, err := ln.Accept()
			if err != nil {
				return
			}
			back, err := net.Dial("tcp", target)
			if err != nil {
				front.Close()
				continue
			}
			r.mu.Lock()
			id := r.next
			r.next++
			r.mu.Unlock()
			// answered is set when the node has sent something since the
			// proxy's last flight.
			var answered sync.Mutex
			replied := true
			wg.Add(2)
			go func() {
				defer wg.Done()
				defer front.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := back.Read(buf)
					if n > 0 {
						answered.Lock()
						replied = true
						answered.Unlock()
						if _, werr := front.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				defer back.Close()
				r.relayFrontend(id, front, back, func() bool {
					answered.Lock()
					defer answered.Unlock()
					was := replied
					replied = false
					return was
				})
			}()
		}
	}()
	return r
}

// relayFrontend copies the proxy's messages to the node, parsing them:
// the startup packet (and an SSL or GSS request before it) has no type
// byte, every later message has one. newFlight reports, for each read,
// whether the node answered since the last one.
func (r *wireRelay) relayFrontend(id int, front, back net.Conn, newFlight func() bool) {
	var pending []byte
	started := false
	prepared := map[string]string{} // the text of each statement parsed on this connection
	buf := make([]byte, 32<<10)
	for {
		n, err := front.Read(buf)
		if n > 0 {
			// Record before forwarding: once the node has the bytes, its
			// answer may reach the proxy (and the test) before a record
			// made afterwards, and would count towards this flight.
			fresh := newFlight()
			pending = append(pending, buf[:n]...)
			for {
				var stmt string
				var size int
				if !started {
					if len(pending) < 8 {
						break
					}
					size = int(binary.BigEndian.Uint32(pending))
					if code := binary.BigEndian.Uint32(pending[4:]); code != 80877103 && code != 80877104 {
						started = true
					}
				} else {
					if len(pending) < 5 {
						break
					}
					size = 1 + int(binary.BigEndian.Uint32(pending[1:]))
					if len(pending) >= size {
						switch body := pending[5:size]; pending[0] {
						case 'Q':
							stmt, _, _ = strings.Cut(string(body), "\x00")
						case 'P':
							name, rest, _ := strings.Cut(string(body), "\x00")
							prepared[name], _, _ = strings.Cut(rest, "\x00")
						case 'B':
							// A statement runs at its Bind, prepared in
							// this flight or an earlier one.
							_, rest, _ := strings.Cut(string(body), "\x00")
							name, _, _ := strings.Cut(rest, "\x00")
							stmt = prepared[name]
						}
					}
				}
				if len(pending) < size {
					break
				}
				pending = pending[size:]
				if stmt != "" {
					r.record(id, stmt, fresh)
					fresh = false
				}
			}
			if _, werr := back.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *wireRelay) record(id int, stmt string, fresh bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.flights[id]
	if fresh || len(f) == 0 {
		f = append(f, nil)
	}
	f[len(f)-1] = append(f[len(f)-1], stmt)
	r.flights[id] = f
}

// reset forgets what was recorded.
func (r *wireRelay) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.flights)
}

// trips returns the flights of the connections that carried a statement
// naming one of tables since the last reset, each flight rendered as the
// kinds of its statements joined by "+" (BEGIN+UPDATE): the proxy's own
// background queries (presence, the recoverer) are left out. The decision
// and its COMMIT are one Query, shown as DECIDE.
func (r *wireRelay) trips(tables ...string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, id := range slices.Sorted(maps.Keys(r.flights)) {
		mine := false
		for _, f := range r.flights[id] {
			for _, s := range f {
				for _, tb := range tables {
					mine = mine || strings.Contains(s, tb)
				}
			}
		}
		if !mine {
			continue
		}
		for _, f := range r.flights[id] {
			kinds := make([]string, len(f))
			for i, s := range f {
				kinds[i] = stmtKind(s)
			}
			out = append(out, strings.Join(kinds, "+"))
		}
	}
	return out
}

// stmtKind names a statement by its first word, telling apart the
// statements of a commit across nodes.
func stmtKind(s string) string {
	u := strings.ToUpper(strings.TrimSpace(s))
	switch {
	case strings.Contains(u, "DECIDE_COMMIT"):
		return "DECIDE"
	case strings.HasPrefix(u, "PREPARE TRANSACTION"):
		return "PREPARE"
	case strings.HasPrefix(u, "COMMIT PREPARED"):
		return "COMMIT PREPARED"
	}
	w, _, _ := strings.Cut(u, " ")
	return strings.TrimRight(w, ";")
}

// TestTPCBRoundTrips counts the round trips and statements pgbench's
// TPC-B-like transaction (in the simple protocol) costs on each node: the
// account in a tree, the teller, branch and history tables on the catalog
// node. The client's BEGIN goes with the first statement on each node; a
// transaction on the catalog node alone commits in one round trip; one
// that also wrote on the other node prepares there, records the decision
// and commits on the catalog node in one round trip, and then commits the
// prepared part: no PREPARE on the catalog node, no separate BEGIN, no
// decision for a transaction on one node.
func TestTPCBRoundTrips(t *testing.T) {
	resetNodes(t)
	relays := []*wireRelay{
		startWireRelay(t, fmt.Sprintf("127.0.0.1:%d", testNode(t, 0).Port)),
		startWireRelay(t, fmt.Sprintf("127.0.0.1:%d", testNode(t, 1).Port)),
	}
	dsns := make([]string, len(relays))
	for i, r := range relays {
		dsns[i] = fmt.Sprintf("postgres://lattice@%s/lattice?sslmode=disable", r.addr)
	}
	p := startProxyOn(t, testRedisURL(t), dsns, nil)
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE rt_acct (id bigint PRIMARY KEY, bal bigint NOT NULL)`)
	mustExec(t, c, `SELECT lattice_create_tree('rt_acct', 'id', shard_count => 4)`)
	mustExec(t, c, `CREATE TABLE rt_teller (tid int PRIMARY KEY, tbalance bigint NOT NULL)`)
	mustExec(t, c, `CREATE TABLE rt_branch (bid int PRIMARY KEY, bbalance bigint NOT NULL)`)
	mustExec(t, c, `CREATE TABLE rt_hist (aid bigint, delta bigint)`)
	mustExec(t, c, `INSERT INTO rt_teller VALUES (1, 0)`)
	mustExec(t, c, `INSERT INTO rt_branch VALUES (1, 0)`)
	for aid := 1; aid <= 40; aid++ {
		mustExec(t, c, fmt.Sprintf(`INSERT INTO rt_acct VALUES (%d, 0)`, aid))
	}
	var on [2]int64
	for i := range on {
		ids := slices.Sorted(maps.Keys(tenantRows(t, i, "lattice", "rt_acct")))
		if len(ids) == 0 {
			t.Fatalf("node %d holds no row of rt_acct", i+1)
		}
		on[i] = ids[0]
	}
	tpcb := func(aid int64) {
		t.Helper()
		for _, sql := range []string{
			`BEGIN`,
			fmt.Sprintf(`UPDATE rt_acct SET bal = bal + 5 WHERE id = %d`, aid),
			fmt.Sprintf(`SELECT bal FROM rt_acct WHERE id = %d`, aid),
			`UPDATE rt_teller SET tbalance = tbalance + 5 WHERE tid = 1`,
			`UPDATE rt_branch SET bbalance = bbalance + 5 WHERE bid = 1`,
			fmt.Sprintf(`INSERT INTO rt_hist VALUES (%d, 5)`, aid),
			`END`,
		} {
			if _, err := c.PgConn().Exec(context.Background(), sql).ReadAll(); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
	}
	for _, tc := range []struct {
		name         string
		aid          int64
		node1, node2 []string
	}{
		{"account on the catalog node", on[0],
			[]string{"BEGIN+UPDATE", "SELECT", "UPDATE", "UPDATE", "INSERT", "END"}, nil},
		{"account on the other node", on[1],
			[]string{"BEGIN+UPDATE", "UPDATE", "INSERT", "DECIDE"},
			[]string{"BEGIN+UPDATE", "SELECT", "PREPARE", "COMMIT PREPARED"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tpcb(tc.aid) // the first commit across nodes creates the decision log
			for _, r := range relays {
				r.reset()
			}
			tpcb(tc.aid)
			for i, want := range [][]string{tc.node1, tc.node2} {
				if got := relays[i].trips("rt_"); !slices.Equal(got, want) {
					t.Errorf("node %d: round trips %q, want %q", i+1, got, want)
				}
			}
		})
	}
	var bal int64
	if err := c.QueryRow(context.Background(), `SELECT sum(bal)::int8 FROM rt_acct`).Scan(&bal); err != nil || bal != 20 {
		t.Fatalf("sum of the balances %d (%v), want 20", bal, err)
	}
}
