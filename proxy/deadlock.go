package proxy

import (
	"context"
	"fmt"
	"slices"
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
// lasted DeadlockTimeout, it reads every node's waits (pg_blocking_pids),
// joins the backends of each session of this proxy into one vertex, and
// cancels the waiting statement of one session on a cycle that crosses
// nodes; the client gets 40P01, as from PostgreSQL, and the others go on
// once it rolls back. Cycles within one node are PostgreSQL's to break.
// A cycle through another proxy's session is not seen: its backends are
// unknown here (DESIGN.md section 15).

// DeadlockConfig is what the detector needs of the nodes.
type DeadlockConfig struct {
	// Every is how often it looks, and how long a lock wait lasts before
	// it counts; 0 means DefaultDeadlockTimeout.
	Every time.Duration
	// LockWaits reads a node's backends waiting for a lock longer than
	// older (pgshard.Cluster.LockWaits).
	LockWaits func(ctx context.Context, node string, older time.Duration) ([]pgshard.LockWait, error)
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
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.breakDeadlocks(ctx, cfg.LockWaits, every); err != nil && ctx.Err() == nil {
			s.log.Warn("deadlock detector: cannot read the nodes' lock waits", "err", err)
		}
	}
}

// breakDeadlocks looks once, and cancels one session on each cycle found.
func (s *Server) breakDeadlocks(ctx context.Context, lockWaits func(context.Context, string, time.Duration) ([]pgshard.LockWait, error), older time.Duration) error {
	owners, nodes := s.heldBackends()
	if len(nodes) < 2 {
		return nil // no session of this proxy spans nodes: no cycle of ours can
	}
	g := newWaitGraph()
	for _, node := range nodes {
		waits, err := lockWaits(ctx, node, older)
		if err != nil {
			return err
		}
		for _, w := range waits {
			for _, b := range w.Blockers {
				g.edge(owners, node, w.PID, b, w.Since)
			}
		}
	}
	for _, cycle := range g.crossNodeCycles() {
		victim := cycle.victim()
		if victim == nil {
			continue
		}
		victim.sess.deadlockVictim(ctx, victim.waiting, cycle.describe())
	}
	return nil
}

// heldBackends maps every backend a session of this proxy holds to its
// session, and lists the nodes of those sessions that hold backends on
// more than one.
func (s *Server) heldBackends() (map[backendKey]*session, []string) {
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	owners := make(map[backendKey]*session)
	var nodes []string
	for _, sess := range sessions {
		sess.activeMu.Lock()
		var first string
		spans := false
		for _, be := range sess.active {
			owners[backendKey{be.Node, be.PID()}] = sess
			if first == "" {
				first = be.Node
			}
			spans = spans || be.Node != first
		}
		if spans {
			for _, be := range sess.active {
				if !slices.Contains(nodes, be.Node) {
					nodes = append(nodes, be.Node)
				}
			}
		}
		sess.activeMu.Unlock()
	}
	slices.Sort(nodes)
	return owners, nodes
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

func (g *waitGraph) vertex(owners map[backendKey]*session, k backendKey) int {
	var id any = k
	name := fmt.Sprintf("pid %d on %s", k.pid, k.node)
	if sess := owners[k]; sess != nil {
		id, name = sess, fmt.Sprintf("session %d", sess.key.ProcessID)
	}
	if i, ok := g.ids[id]; ok {
		return i
	}
	g.ids[id] = len(g.verts)
	sess, _ := id.(*session)
	g.verts = append(g.verts, waitVertex{sess: sess, name: name})
	return len(g.verts) - 1
}

func (g *waitGraph) edge(owners map[backendKey]*session, node string, waiter, blocker uint32, since time.Time) {
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

// victim is the session of this proxy on the cycle whose waiting statement
// began last, as PostgreSQL cancels the waiter that found the deadlock.
func (c waitCycle) victim() *waitVertex {
	var v *waitVertex
	for _, i := range c.verts {
		w := &c.g.verts[i]
		if w.sess != nil && len(w.waiting) > 0 && (v == nil || w.since.After(v.since)) {
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
