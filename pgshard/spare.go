package pgshard

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Spare connections serve the migrator's connections that live no longer
// than a step of a migration: its shadow copy's source and target, its
// snapshots and comparison, the drop of its shadow copy. Each used to be a
// connection of its own, eight a migration, and a new PostgreSQL backend
// costs a fork and cold caches: 25 to 35 ms of CPU each on the 2-core
// virtual machines the tests run on, and as much again in latency.
//
// Unlike a pool, Borrow never waits: with no spare idle it connects, so
// migrations that hold several connections at once cannot starve one
// another. Only a few are kept idle, and not for long.
const (
	// maxSpares is how many are kept idle per node and tenant: a split on
	// one node holds five at once (the exporting transactions, the
	// comparison's, the drop).
	maxSpares = 8
	// spareMaxIdle is how long an idle spare is kept.
	spareMaxIdle = time.Minute
	// spareCheckIdle: a spare idle for longer is pinged before it is
	// lent, as pgxpool does, so that one the node dropped meanwhile
	// costs a round trip rather than the borrower's statement.
	spareCheckIdle = time.Second
	// spareCloseTimeout bounds the reset of a connection given back, and
	// the Terminate of one not kept.
	spareCloseTimeout = 5 * time.Second
)

type spare struct {
	conn  *pgx.Conn
	where nodeAddress // what it was opened with
	idle  time.Time
}

// nodeAddress is what a node's connections are opened with: a spare
// opened with another is not lent.
type nodeAddress struct{ dsn, password string }

func (c *Cluster) address(node string) nodeAddress {
	s := c.set()
	if i, ok := s.byName[node]; ok {
		return nodeAddress{s.nodes[i].DSN, s.nodes[i].Password}
	}
	return nodeAddress{}
}

// spares are the idle spare connections, per node and tenant.
type spares struct {
	mu     sync.Mutex
	idle   map[adminKey][]spare
	closed bool
}

// Borrow returns a connection to node for tenant in no transaction, like
// connect's: an idle spare if there is one, or a new one. give hands it
// back. A connection given back closed, inside a transaction, or beyond
// the spares kept is closed instead, so a borrower that gives up midway
// needs no cleanup; one given back idle is reset (reusable).
func (c *Cluster) Borrow(ctx context.Context, node, tenant string) (conn *pgx.Conn, give func(), err error) {
	k := adminKey{node: node, tenant: tenant, role: "spare"}
	where := c.address(node)
	for {
		s, ok := c.spares.take(k, where)
		if !ok {
			break
		}
		if time.Since(s.idle) > spareCheckIdle && s.conn.Ping(ctx) != nil {
			closeSpare(s.conn)
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			continue
		}
		return s.conn, c.giver(k, s.conn, where), nil
	}
	if conn, err = c.connect(ctx, node, tenant); err != nil {
		return nil, nil, err
	}
	return conn, c.giver(k, conn, where), nil
}

func (c *Cluster) giver(k adminKey, conn *pgx.Conn, where nodeAddress) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			if !reusable(conn) || !c.spares.keep(k, spare{conn: conn, where: where, idle: time.Now()}) {
				closeSpare(conn)
				return
			}
			time.AfterFunc(spareMaxIdle, func() { c.spares.expire(k) })
		})
	}
}

// reusable says whether conn can serve another borrower as a new
// connection would: open, in no transaction, and reset by DISCARD ALL (a
// shadow copy labels its target connection and sets the migrator's
// setting) with pgx's statement caches emptied too, since a statement pgx
// cached for one borrower fails another's once DDL changed its result's
// type (0A000), or once DISCARD ALL deallocated it (26000).
func reusable(conn *pgx.Conn) bool {
	if conn.IsClosed() || conn.PgConn().TxStatus() != 'I' {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), spareCloseTimeout)
	defer cancel()
	if _, err := conn.PgConn().Exec(ctx, "DISCARD ALL").ReadAll(); err != nil {
		return false
	}
	return conn.DeallocateAll(ctx) == nil
}

// take pops the newest idle spare of k opened with where.
func (s *spares) take(k adminKey, where nodeAddress) (spare, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for list := s.idle[k]; len(list) > 0; list = s.idle[k] {
		last := list[len(list)-1]
		s.idle[k] = list[:len(list)-1]
		if last.where == where && time.Since(last.idle) < spareMaxIdle {
			return last, true
		}
		// The node's DSN may have changed, or it is stale: not lent.
		go closeSpare(last.conn)
	}
	return spare{}, false
}

// keep adds sp to k's idle spares, unless there are enough or the spares
// are closed.
func (s *spares) keep(k adminKey, sp spare) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.idle[k]) >= maxSpares {
		return false
	}
	if s.idle == nil {
		s.idle = map[adminKey][]spare{}
	}
	s.idle[k] = append(s.idle[k], sp)
	return true
}

// expire closes k's spares idle for spareMaxIdle.
func (s *spares) expire(k adminKey) {
	s.mu.Lock()
	var old []spare
	kept := s.idle[k][:0]
	for _, sp := range s.idle[k] {
		if time.Since(sp.idle) >= spareMaxIdle {
			old = append(old, sp)
		} else {
			kept = append(kept, sp)
		}
	}
	s.idle[k] = kept
	s.mu.Unlock()
	for _, sp := range old {
		closeSpare(sp.conn)
	}
}

// drop closes the idle spares of node.
func (s *spares) drop(node string) {
	s.closeAll(s.remove(func(k adminKey) bool { return k.node == node }))
}

// close closes every idle spare and keeps none from then on.
func (s *spares) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.closeAll(s.remove(func(adminKey) bool { return true }))
}

func (s *spares) remove(match func(adminKey) bool) []spare {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []spare
	for k, list := range s.idle {
		if match(k) {
			out = append(out, list...)
			delete(s.idle, k)
		}
	}
	return out
}

func (s *spares) closeAll(list []spare) {
	for _, sp := range list {
		go closeSpare(sp.conn)
	}
}

func closeSpare(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), spareCloseTimeout)
	defer cancel()
	_ = conn.Close(ctx)
}
