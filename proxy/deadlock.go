package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/sqlstate"
)

// A transaction over several nodes can wait on one node for a lock that a
// second transaction holds, while the second waits on another node for a
// lock the first holds. Each node sees one wait and no cycle, so neither
// PostgreSQL breaks it, and both would wait for ever. The detector looks
// for such cycles as PostgreSQL looks for its own: when a lock wait has
// lasted a second (deadlock_timeout's default, DeadlockConfig.Every), it
// reads every node's waits (pg_blocking_pids),
// joins the backends of each session of this proxy into one vertex, and
// cancels the waiting statement of one session on a cycle that crosses
// nodes; the client gets 40P01, as from PostgreSQL, and the others go on
// once it rolls back. Cycles within one node are PostgreSQL's to break.
// Proxies that hold transactions over several nodes share their backends
// through Redis (Share), so a cycle through sessions of several proxies is
// one graph to each; each picks the same victim, and its own proxy cancels
// it. A victim is canceled only when two looks in a row chose it, so that
// a backend that changed hands between the reads cannot make a cycle that
// is not there (DESIGN.md section 15).

// DeadlockConfig is what the detector needs of the nodes.
type DeadlockConfig struct {
	// Every is how often it looks, and how long a lock wait lasts before
	// it counts; 0 means DefaultDeadlockTimeout.
	Every time.Duration
	// LockWaits reads a node's backends waiting for a lock longer than
	// older (pgshard.Cluster.LockWaits).
	LockWaits func(ctx context.Context, node string, older time.Duration) ([]pgshard.LockWait, error)
	// Share publishes this proxy's backends held by sessions over several
	// nodes (an encoded []sharedBackend) and returns the other proxies';
	// nil sees this proxy's sessions only.
	Share func(ctx context.Context, mine []byte) ([][]byte, error)
	// ProxyID names this proxy's sessions to the others.
	ProxyID string
}

// sharedBackend is a backend of a session over several nodes, as the
// proxies share them.
type sharedBackend struct {
	Session string `json:"s"` // proxy id and session key
	Node    string `json:"n"`
	PID     uint32 `json:"p"`
}

// owner is the session a backend belongs to, by its name across the
// proxies (sharedBackend.Session), and the session itself when it is one
// of this proxy.
type owner struct {
	local *session
	id    string
}

// DefaultDeadlockTimeout is PostgreSQL's default deadlock_timeout.
const DefaultDeadlockTimeout = time.Second

// backendKey names a backend across the nodes.
type backendKey struct {
	node string
	pid  uint32
}

// RunDeadlockDetector looks for deadlocks across nodes until ctx ends.
func (s *Server) RunDeadlockDetector(ctx context.Context, cfg DeadlockConfig) {
	every := cfg.Every
	if every <= 0 {
		every = DefaultDeadlockTimeout
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var chosen map[backendKey]bool
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		if chosen, err = s.breakDeadlocks(ctx, cfg, every, chosen); err != nil && ctx.Err() == nil {
			s.log.Warn("deadlock detector: cannot read the nodes' lock waits", "err", err)
		}
	}
}

// breakDeadlocks looks once. It returns the waiting backends of the
// victims it chose, and cancels those chosen in the last look too.
func (s *Server) breakDeadlocks(ctx context.Context, cfg DeadlockConfig, older time.Duration, last map[backendKey]bool) (map[backendKey]bool, error) {
	owners, mine := s.heldBackends(cfg.ProxyID)
	if len(mine) == 0 {
		return nil, nil // no session of this proxy spans nodes: no cycle of ours can
	}
	if cfg.Share != nil {
		payload, err := json.Marshal(mine)
		if err != nil {
			return nil, err
		}
		theirs, err := cfg.Share(ctx, payload)
		if err != nil {
			return nil, err
		}
		for _, p := range theirs {
			var bs []sharedBackend
			if json.Unmarshal(p, &bs) != nil {
				continue
			}
			for _, b := range bs {
				k := backendKey{b.Node, b.PID}
				if owners[k].local == nil {
					owners[k] = owner{id: b.Session}
				}
			}
		}
	}
	var nodes []string
	for _, b := range mine {
		if !slices.Contains(nodes, b.Node) {
			nodes = append(nodes, b.Node)
		}
	}
	slices.Sort(nodes)
	g := newWaitGraph()
	for _, node := range nodes {
		waits, err := cfg.LockWaits(ctx, node, older)
		if err != nil {
			return nil, err
		}
		for _, w := range waits {
			for _, b := range w.Blockers {
				g.edge(owners, node, w.PID, b, w.Since)
			}
		}
	}
	chosen := make(map[backendKey]bool)
	for _, cycle := range g.crossNodeCycles() {
		victim := cycle.victim()
		if victim == nil || victim.sess == nil {
			continue // another proxy's session: that proxy cancels it
		}
		var again []backendKey
		for _, k := range victim.waiting {
			chosen[k] = true
			if last[k] {
				again = append(again, k)
			}
		}
		if len(again) > 0 {
			victim.sess.deadlockVictim(ctx, again, cycle.describe())
		}
	}
	return chosen, nil
}

// heldBackends maps every backend a session of this proxy holds to its
// session, and lists the backends of those sessions that hold backends on
// more than one node.
func (s *Server) heldBackends(proxyID string) (map[backendKey]owner, []sharedBackend) {
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	owners := make(map[backendKey]owner)
	var mine []sharedBackend
	for _, sess := range sessions {
		sess.activeMu.Lock()
		var first string
		spans := false
		id := proxyID + "/" + strconv.FormatUint(uint64(sess.key.ProcessID), 10)
		for _, be := range sess.active {
			owners[backendKey{be.Node, be.PID()}] = owner{local: sess, id: id}
			if first == "" {
				first = be.Node
			}
			spans = spans || be.Node != first
		}
		if spans {
			for _, be := range sess.active {
				mine = append(mine, sharedBackend{Session: id, Node: be.Node, PID: be.PID()})
			}
		}
		sess.activeMu.Unlock()
	}
	return owners, mine
}

// waitGraph has a vertex per session of this proxy, and one per backend
// of no session of it (another proxy's, a direct client's), with an edge
// from a waiter to each backend ahead of it, labelled with the node.
type waitGraph struct {
	ids   map[any]int
	verts []waitVertex
}

type waitVertex struct {
	sess    *session // nil for a backend of no session of this proxy
	session bool     // a session of this proxy or of another
	name    string
	out     []waitEdge
	waiting []backendKey // the session's backends that wait
	since   time.Time    // the latest start of a waiting statement
}

type waitEdge struct {
	to   int
	node string
}

func newWaitGraph() *waitGraph { return &waitGraph{ids: make(map[any]int)} }

func (g *waitGraph) vertex(owners map[backendKey]owner, k backendKey) int {
	var id any = k
	name := fmt.Sprintf("pid %d on %s", k.pid, k.node)
	o := owners[k]
	if o.id != "" {
		id, name = o.id, "session "+o.id
	}
	if i, ok := g.ids[id]; ok {
		return i
	}
	g.ids[id] = len(g.verts)
	g.verts = append(g.verts, waitVertex{sess: o.local, session: o.id != "", name: name})
	return len(g.verts) - 1
}

func (g *waitGraph) edge(owners map[backendKey]owner, node string, waiter, blocker uint32, since time.Time) {
	w := g.vertex(owners, backendKey{node, waiter})
	b := g.vertex(owners, backendKey{node, blocker})
	if w == b {
		return
	}
	v := &g.verts[w]
	v.out = append(v.out, waitEdge{to: b, node: node})
	if k := (backendKey{node, waiter}); !slices.Contains(v.waiting, k) {
		v.waiting = append(v.waiting, k)
	}
	if since.After(v.since) {
		v.since = since
	}
}

// waitCycle is a strongly connected set of vertices of the graph.
type waitCycle struct {
	g     *waitGraph
	verts []int
}

// crossNodeCycles returns the strongly connected components whose edges
// lie on more than one node (Tarjan's algorithm).
func (g *waitGraph) crossNodeCycles() []waitCycle {
	n := len(g.verts)
	index, low := make([]int, n), make([]int, n)
	on := make([]bool, n)
	for i := range index {
		index[i] = -1
	}
	var stack []int
	var out []waitCycle
	next := 0
	var visit func(v int)
	visit = func(v int) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		on[v] = true
		for _, e := range g.verts[v].out {
			switch {
			case index[e.to] < 0:
				visit(e.to)
				low[v] = min(low[v], low[e.to])
			case on[e.to]:
				low[v] = min(low[v], index[e.to])
			}
		}
		if low[v] != index[v] {
			return
		}
		var comp []int
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			on[w] = false
			comp = append(comp, w)
			if w == v {
				break
			}
		}
		if c := (waitCycle{g: g, verts: comp}); len(comp) > 1 && c.crossesNodes() {
			out = append(out, c)
		}
	}
	for v := range n {
		if index[v] < 0 {
			visit(v)
		}
	}
	return out
}

// crossesNodes reports whether the component's edges lie on two nodes or
// more: a cycle on one node is PostgreSQL's to break.
func (c waitCycle) crossesNodes() bool {
	first := ""
	for _, v := range c.verts {
		for _, e := range c.g.verts[v].out {
			if !slices.Contains(c.verts, e.to) {
				continue
			}
			if first == "" {
				first = e.node
			} else if e.node != first {
				return true
			}
		}
	}
	return false
}

// victim is the session on the cycle, of any proxy, whose waiting
// statement began last, as PostgreSQL cancels the waiter that found the
// deadlock; every proxy that sees the cycle picks the same. Ties go to
// the name, so that they too pick the same.
func (c waitCycle) victim() *waitVertex {
	var v *waitVertex
	for _, i := range c.verts {
		w := &c.g.verts[i]
		if !w.session || len(w.waiting) == 0 {
			continue
		}
		if v == nil || w.since.After(v.since) || w.since.Equal(v.since) && w.name > v.name {
			v = w
		}
	}
	return v
}

// describe lists the cycle's waits, as the error's detail.
func (c waitCycle) describe() string {
	var b strings.Builder
	for _, i := range c.verts {
		for _, e := range c.g.verts[i].out {
			if slices.Contains(c.verts, e.to) {
				fmt.Fprintf(&b, "%s waits on node %s for %s. ", c.g.verts[i].name, e.node, c.g.verts[e.to].name)
			}
		}
	}
	return strings.TrimSpace(b.String())
}

// deadlockVictim cancels the session's waiting statements, and marks the
// session so that the cancel reaches its client as 40P01 with detail.
func (s *session) deadlockVictim(ctx context.Context, waiting []backendKey, detail string) {
	ctx, done := context.WithTimeout(ctx, cancelTimeout)
	defer done()
	s.activeMu.Lock()
	defer s.activeMu.Unlock()
	s.deadlock.Store(&detail)
	s.log.Warn("deadlock across nodes: canceling a waiting statement", "session", s.key.ProcessID, "cycle", detail)
	for _, be := range s.active {
		if slices.Contains(waiting, backendKey{be.Node, be.PID()}) {
			if err := be.Cancel(ctx); err != nil {
				s.log.Warn("deadlock detector: cancel request failed", "node", be.Node, "err", err)
			}
		}
	}
}

// deadlockError is the error the cancel of a deadlock's victim reports.
func deadlockError(m *pgproto3.ErrorResponse, detail string) *pgproto3.ErrorResponse {
	e := sqlstate.New(sqlstate.DeadlockDetected, "deadlock detected")
	e.Detail = detail + " Each node saw one wait; the cycle crosses nodes."
	e.Hint = "Retry the transaction. Transactions that change rows in one order (by the shard key, say) do not deadlock."
	r := e.Response()
	r.Severity, r.SeverityUnlocalized = m.Severity, m.SeverityUnlocalized
	return r
}
