package proxy

import (
	"context"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// extRetry is a statement of an extended batch that may be routed again
// after LT001 (slot moved), as simpleQuery does: a statement for one key,
// outside a transaction, the only Execute of its batch, so that running it
// again after the Sync loses nothing else the batch did.
type extRetry struct {
	stmt *clientStmt
	bind *pgproto3.Bind // the client's Bind, copied out of the read buffer
	step int            // index of its Execute step in the exchange
}

// copyOf keeps a client's Bind beyond the next read from the client, in c.
// It runs for every point statement outside a transaction: a Bind of a
// few short parameters fits c, which lives in its portal's allocation.
func (c *boundCopy) copyOf(m *pgproto3.Bind) *pgproto3.Bind {
	*c = boundCopy{b: *m}
	c.b.ParameterFormatCodes = append(c.pfc[:0:len(c.pfc)], m.ParameterFormatCodes...)
	c.b.ResultFormatCodes = append(c.rfc[:0:len(c.rfc)], m.ResultFormatCodes...)
	if m.ParameterFormatCodes == nil {
		c.b.ParameterFormatCodes = nil
	}
	if m.ResultFormatCodes == nil {
		c.b.ResultFormatCodes = nil
	}
	c.b.Parameters = c.params[:0:len(c.params)]
	size := 0
	for _, p := range m.Parameters {
		size += len(p)
	}
	arena := c.arena[:0:len(c.arena)]
	if size > len(c.arena) {
		arena = make([]byte, 0, size)
	}
	for _, p := range m.Parameters {
		if p == nil {
			c.b.Parameters = append(c.b.Parameters, nil)
			continue
		}
		arena = append(arena, p...)
		c.b.Parameters = append(c.b.Parameters, arena[len(arena)-len(p):len(arena):len(arena)])
	}
	return &c.b
}

// boundCopy is a copied Bind with room for the lists of a small one.
type boundCopy struct {
	b      pgproto3.Bind
	pfc    [2]int16
	rfc    [2]int16
	params [4][]byte
	arena  [32]byte
}

// staleCatalog reports whether p, a statement for the catalog node, may be
// planned and routed again after LT001: the fence of a template answers so
// to a write planned before this proxy knew the table is a tree (a tree
// made through another proxy, or whose creation the write waited for).
// Nothing of it ran, and the map refreshed for the retry names the tree. A
// statement that pins session state to its backend is left alone.
func staleCatalog(p *router.Plan) bool {
	return p.Kind == router.Catalog && p.Pin|p.Unpin == 0
}

// retryable reports whether the Execute of portal about to be queued may be
// routed again after LT001.
func (s *session) retryable(portal *clientPortal, maxRows uint32) bool {
	p := portal.stmt.plan
	if p == nil || p.Kind != router.Single && !staleCatalog(p) || portal.bind == nil || len(portal.parts) != 1 ||
		portal.split != nil || portal.fan != nil || maxRows != 0 || s.tx.active ||
		s.extRetry != nil || len(s.x.sentSinceSync) > 0 {
		return false
	}
	for _, st := range s.x.steps {
		switch st.kind {
		case stepExecute, stepQuery, stepFanOut, stepCopy:
			return false // work that a failure would roll back with it
		}
	}
	return true
}

// retryStale routes the batch's one retryable statement again while it got
// LT001: the map is refreshed, the statement is bound on the new owner
// (its BindComplete already reached the client) and executed, and the
// backend synced. Run by sync after the batch was played.
func (s *session) retryStale(ctx context.Context) error {
	r := s.extRetry
	s.extRetry = nil
	if r == nil {
		return nil
	}
	for attempt := 1; s.x.stale != nil; attempt++ {
		held := s.x.stale
		s.x.reset()
		s.finish()
		if _, err := s.srv.cache.Refresh(ctx, s.tenant); err != nil {
			s.log.Warn("map refresh after LT001 failed", "err", err)
		}
		s.releaseViews()
		if be := s.rebindStale(ctx, r, held); be != nil {
			be.Send(&pgproto3.Execute{Portal: r.bind.DestinationPortal})
			s.x.add(step{kind: stepExecute, be: be, staleRetry: attempt < maxStaleRetries})
			be.Send(&pgproto3.Sync{})
			s.x.add(step{kind: stepSync, be: be})
		}
		s.sendBackends()
		if err := s.play(&s.x); err != nil {
			return err
		}
	}
	return nil
}

// rebindStale binds r on its shard under a fresh view, holding it while
// its slot is frozen; nil when that failed (the error is queued). A
// statement whose new plan is not for one shard (a write to a table that
// became a tree, planned again, may touch several) gets held, its LT001.
func (s *session) rebindStale(ctx context.Context, r *extRetry, held *pgproto3.ErrorResponse) *pgshard.Conn {
	v, err := s.view(ctx)
	if err == nil {
		err = s.replan(r.stmt, v)
	}
	if err != nil {
		s.fail(err)
		return nil
	}
	var ok bool
	if v, ok = s.bindHeld(ctx, r.stmt, v, r.bind); !ok {
		return nil
	}
	p := r.stmt.plan
	if p.Kind != router.Single {
		s.fail(staleAgain(held))
		return nil
	}
	sh, err := s.route(v, p, r.bind, r.stmt.oids)
	if err != nil {
		s.fail(err)
		return nil
	}
	part := &clientPortal{stmt: r.stmt}
	if !s.bindOn(ctx, part, sh.Node, sh.SQL, r.bind, r.bind.DestinationPortal, true) {
		return nil
	}
	return part.parts[0].be
}

// keepRetry keeps the batch's retryable statement only when every step
// queued after its Execute satisfies after; otherwise its LT001 reaches the
// client like any error.
func (s *session) keepRetry(after func(step) bool) {
	r := s.extRetry
	if r == nil {
		return
	}
	if r.step >= len(s.x.steps) {
		// Played before the Sync (settle, flushBatch).
		s.extRetry = nil
		return
	}
	for _, st := range s.x.steps[r.step+1:] {
		if !after(st) {
			s.x.steps[r.step].staleRetry = false
			s.extRetry = nil
			return
		}
	}
}

// staleAgain is the LT001 a statement that cannot be routed again by the
// proxy gets, with a hint that running it again routes it.
func staleAgain(held *pgproto3.ErrorResponse) *sqlstate.Error {
	return &sqlstate.Error{Severity: "ERROR", Code: held.Code, Message: held.Message, Detail: held.Detail,
		Hint: "The table is a tree now, or its rows moved, since the statement was planned: run it again."}
}
