package proxy

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

const (
	// holdTimeout bounds how long a statement waits for frozen slots to
	// move (a freeze lasts at most the migrator's budget, 2 s by default).
	holdTimeout = 10 * time.Second
	// leaseWait is how long a statement waits for a lapsed registration
	// to come back before it fails.
	leaseWait = 3 * time.Second
	// leasePoll is how often the registration is checked while waiting.
	leasePoll = 20 * time.Millisecond
)

// acquireView takes the tenant's current view for the statement being
// served and records it as in use until releaseViews. While this proxy's
// registration has lapsed and it cannot serve from its cached maps either
// (shardmap.Registration.Hold), it waits briefly for the registration to
// come back: it must not route by a map that may be stale.
func (s *session) acquireView(ctx context.Context) (*shardmap.View, error) {
	reg := s.srv.cfg.Registration
	var deadline time.Time // set on the first lapse: a clock read less per statement
	for {
		v, err := reg.Hold(ctx, s.tenant)
		switch {
		case err == nil:
			if slices.Contains(s.views, viewHold{v: v}) {
				reg.Release(v) // held whole once per session is enough
				s.freshView = -1
			} else {
				s.views = append(s.views, viewHold{v: v})
				s.freshView = len(s.views) - 1
			}
			return v, nil
		case !errors.Is(err, shardmap.ErrLeaseExpired):
			return nil, sqlstate.New(sqlstate.SystemError, "shard map unavailable: %v", err)
		case deadline.IsZero():
			deadline = time.Now().Add(leaseWait)
		case time.Now().After(deadline):
			e := sqlstate.New(sqlstate.CannotConnectNow, "this Lattice proxy cannot reach Redis, and cannot vouch for its cached shard map (it lost a session on a node, or never served this database)")
			e.Hint = "retry shortly, or connect to another proxy; the proxy serves again once it reaches Redis"
			return nil, e
		}
		select {
		case <-ctx.Done():
			return nil, sqlstate.New(sqlstate.QueryCanceled, "canceling statement: %v", ctx.Err())
		case <-time.After(leasePoll):
		}
	}
}

// releaseViews ends the session's use of the views its statements planned
// on. It runs when the work of those statements is finished: at
// ReadyForQuery, after a Flush played the batch so far, and before a
// statement is held for frozen slots. Nothing holds a view while the
// client is idle, so a freeze never waits for a client.
//
// A portal bound before a Flush may still be executed after it: a SELECT
// took its snapshot at Bind, and a write to a slot that moved since is
// rejected by the fence (LT001), so neither needs the view any more. A
// tree's DDL, which runs at Execute, takes a view again (holdForDDL).
//
// Within a statement a session may hold a view while it waits for a pool
// backend, a node, or the rest of a batch the client is still sending.
// None of those waits on a freeze, so it delays an acknowledgement only
// until that wait ends; and a freeze that cannot get its acknowledgements
// within its budget is rolled back, which releases statements held for
// it (holdFrozen) and with them anything they occupy.
func (s *session) releaseViews() {
	reg := s.srv.cfg.Registration
	for _, h := range s.views {
		if h.tree == "" {
			reg.Release(h.v)
		} else {
			reg.ReleaseSlot(h.v, h.tree, h.slot)
		}
	}
	clear(s.views)
	s.views = s.views[:0]
	s.freshView = -1
}

// releaseView gives back the hold the current statement took on v, when
// it took one of its own: a statement of the catalog node routes by no
// tree's map, so no acknowledgement need wait for it. Held, a long one (a
// report over ordinary tables, a wait for a lock) held every migration's
// freeze of the tenant back for its whole run. A hold shared with an
// earlier statement of the batch stays, for that statement.
func (s *session) releaseView(v *shardmap.View) {
	if i, ok := s.ownHold(v); ok {
		s.dropHold(v, i)
	}
}

// viewHold is a view held for the session's statements: the whole view
// (tree ""), or one slot of one tree's map.
type viewHold struct {
	v    *shardmap.View
	tree string
	slot int
}

// narrowView narrows the hold the current statement took on v to the one
// slot of tree it routes by: a freeze of other slots then does not wait
// for it (shardmap.Registration.Narrow). Only a hold the statement took
// for itself can be narrowed; one it shares with an earlier statement of
// the batch covers that statement too, and stays whole.
func (s *session) narrowView(v *shardmap.View, tree string, slot int) {
	i, ok := s.ownHold(v)
	if !ok {
		return
	}
	h := viewHold{v: v, tree: tree, slot: slot}
	if slices.Contains(s.views, h) {
		// The batch already holds that slot: the statement's own hold goes.
		s.dropHold(v, i)
		return
	}
	s.srv.cfg.Registration.Narrow(v, tree, slot)
	s.views[i] = h
}

// ownHold is the index in s.views of the whole hold of v that the current
// statement took for itself, if it took one; either way the statement's
// hold is no longer fresh.
func (s *session) ownHold(v *shardmap.View) (int, bool) {
	i := s.freshView
	s.freshView = -1
	ok := s.srv.cfg.Registration != nil && i >= 0 && i < len(s.views) && s.views[i] == (viewHold{v: v})
	return i, ok
}

// dropHold gives back the whole hold of v at s.views[i].
func (s *session) dropHold(v *shardmap.View, i int) {
	s.srv.cfg.Registration.Release(v)
	s.views = slices.Delete(s.views, i, i+1)
}

// frozenTree reports the tree of p, and its map, when p would touch a
// frozen slot under v: a statement for one key whose slot is frozen, or
// any statement over several shards of a tree with frozen slots.
func frozenTree(v *shardmap.View, p *router.Plan, bind *pgproto3.Bind, oids []uint32) (*shardmap.Map, bool) {
	if p == nil || p.Tree == nil {
		return nil, false
	}
	m := v.Maps[p.Tree.Name]
	if m == nil || len(m.Frozen) == 0 {
		return nil, false
	}
	r, err := router.Resolve(v, p, routerBind(bind, oids))
	return m, err == nil && r.Frozen // a bad key fails at routing
}

// holdFrozen waits for a map of tree newer than m, whose slots froze: the
// statement is held, not failed, until the migrator flips or thaws them,
// and the caller plans it again on a fresh view. Work queued before it in
// an extended batch is played first (flush), and every view the session
// holds is released before waiting: a held statement then keeps no view
// at all, so it delays neither the acknowledgement of the freeze epoch
// nor that of the flip. It fails with 55000 once the hold passes
// holdTimeout from start.
func (s *session) holdFrozen(ctx context.Context, m *shardmap.Map, start time.Time, flush func() error) error {
	if flush != nil && len(s.x.steps) > 0 {
		if err := flush(); err != nil {
			return err
		}
	}
	s.releaseViews()
	wctx, cancel := context.WithDeadline(ctx, start.Add(holdTimeout))
	defer cancel()
	if _, err := s.srv.cache.Wait(wctx, s.tenant, m.Tree, m.Epoch+1); err != nil {
		if ctx.Err() != nil {
			return sqlstate.New(sqlstate.QueryCanceled, "canceling statement: %v", ctx.Err())
		}
		e := sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "slots of tree %q are moving to another shard and did not settle within %s", m.Tree, holdTimeout)
		e.Hint = "retry the statement; a reshard is running"
		return e
	}
	return nil
}

// planHeld plans a simple Query, holding it while one of its statements
// would touch frozen slots or write a reference table whose copies are
// changing, and plans it again on the newer view.
func (s *session) planHeld(ctx context.Context, sql string) ([]*router.Plan, *shardmap.View, error) {
	plans, v, err := s.plan(ctx, sql)
	for start := time.Now(); err == nil; {
		if m := s.frozenPlans(v, plans); m != nil {
			err = s.holdFrozen(ctx, m, start, nil)
		} else if r, end := s.changingPlans(v, plans, start); r != nil {
			err = s.holdReference(ctx, r, end, nil)
		} else {
			break
		}
		if err == nil {
			plans, v, err = s.plan(ctx, sql)
		}
	}
	return plans, v, err
}

func (s *session) frozenPlans(v *shardmap.View, plans []*router.Plan) *shardmap.Map {
	for _, p := range plans {
		if m, frozen := frozenTree(v, p, nil, nil); frozen && !s.passesFreeze(v, p, nil, nil) {
			return m
		}
	}
	return nil
}

// bindHeld holds a statement at Bind while it would touch frozen slots
// under v, or write a reference table whose copies are changing
// (refhold.go), and returns the view to bind it on; false when it failed (the
// error is queued) or the batch is being skipped.
func (s *session) bindHeld(ctx context.Context, st *clientStmt, v *shardmap.View, m *pgproto3.Bind) (*shardmap.View, bool) {
	for start := time.Now(); ; {
		var err error
		if fm, frozen := frozenTree(v, st.plan, m, st.oids); frozen && !s.passesFreeze(v, st.plan, m, st.oids) {
			err = s.holdFrozen(ctx, fm, start, s.flushBatch)
		} else if r, end := s.changingReference(v, st.plan, start); r != nil {
			err = s.holdReference(ctx, r, end, s.flushBatch)
		} else {
			return v, true
		}
		if err != nil {
			s.fail(err)
			return nil, false
		}
		if s.skipping {
			return nil, false // what ran before it failed: skipped up to Sync
		}
		if v, err = s.view(ctx); err == nil {
			err = s.replan(st, v)
		}
		if err != nil {
			s.fail(err)
			return nil, false
		}
	}
}
