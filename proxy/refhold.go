package proxy

import (
	"context"
	"slices"
	"time"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Before a node gets or loses its copy of a reference table, pgshard marks
// the table's entry as changing (ChangingSince) and waits until every
// proxy has acknowledged that entry; only then does it lock the catalog copy, change the copies
// and the list the fences check, and write the new entry. A write planned
// under the marked entry is held here until the new one arrives, as a
// statement on frozen slots is held for a flip. Without the hold, every
// write that queued behind the copy's table lock carried the old list and
// got LT001 once the lock went, in the middle of its transaction (three
// TPC-C payments of a run that added a node and drained one).
//
// A write of a table its transaction already wrote, or read with FOR
// UPDATE or FOR SHARE (on the catalog copy), is not held: the transaction
// holds a lock on the table that the change's lock waits for, so the
// list has not changed yet, and the write passes the fence. Held, it would
// wait for a change that waits for its transaction.
//
// PostgreSQL takes the same lock when it parses such a statement, and
// keeps it to the end of the transaction: a Parse sent ahead of its Bind
// (parseahead.go), or for a Describe, locks the catalog copy before the
// write is bound. A Bind held after it waited for a change that waited
// for the Parse's lock, until the change gave up after referenceLockWait
// (55P03; four writers through two proxies, each preparing its INSERT in
// a transaction, met it in one undistribution in four). So such a Parse
// goes to a backend only under a view whose entry is not marked, which the
// session holds until the Parse is answered: no proxy acknowledges a mark
// before the lock is taken, so no change locks the table before it, and
// the tables count as locked (parseLock). Under a marked entry the Parse
// waits for the change, as its Bind would.

// changingReference is the first reference table p writes or reads whose
// copies are changing under v, unless the session's transaction holds a
// lock on it, and the time its hold ends: holdTimeout from start, or the
// mark's end (shardmap.MaxChange) if that comes first. Nil once that time
// has passed.
func (s *session) changingReference(v *shardmap.View, p *router.Plan, start time.Time) (*shardmap.Reference, time.Time) {
	if p == nil || p.Kind != router.RefWrite {
		return nil, time.Time{}
	}
	return s.changingOf(v, p.References, start)
}

// changingOf is changingReference for the tables names.
func (s *session) changingOf(v *shardmap.View, names []string, start time.Time) (*shardmap.Reference, time.Time) {
	for _, name := range names {
		r := v.Reference(name)
		if r == nil || r.ChangingSince.IsZero() || s.refLocked(name) {
			continue
		}
		now := time.Now()
		if until, ok := r.Changing(now); ok {
			end := start.Add(holdTimeout)
			if until.Before(end) {
				end = until
			}
			if now.Before(end) {
				return r, end
			}
		}
	}
	return nil, time.Time{}
}

func (s *session) changingPlans(v *shardmap.View, plans []*router.Plan, start time.Time) (*shardmap.Reference, time.Time) {
	for _, p := range plans {
		if r, end := s.changingReference(v, p, start); r != nil {
			return r, end
		}
	}
	return nil, time.Time{}
}

// holdReference waits, holding no view, until ref's entry is replaced or
// end. Work queued before the statement in an extended batch is played
// first (flush). At end it stops waiting without an error: the statement
// goes on under the entry it has, and the fence refuses it (LT001) only
// if the copies changed meanwhile.
func (s *session) holdReference(ctx context.Context, ref *shardmap.Reference, end time.Time, flush func() error) error {
	if flush != nil && len(s.x.steps) > 0 {
		if err := flush(); err != nil {
			return err
		}
	}
	s.releaseViews()
	wctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	_, err := s.srv.cache.WaitReference(wctx, s.tenant, ref.Name, ref.Epoch+1)
	if err != nil && ctx.Err() != nil {
		return sqlstate.New(sqlstate.QueryCanceled, "canceling statement: %v", ctx.Err())
	}
	s.srv.metrics.referenceHeld(err == nil)
	return nil
}

// refLocked reports whether a backend of the session holds a lock on the
// catalog copy of reference table name that a change of its copies waits
// for.
func (s *session) refLocked(name string) bool {
	return s.tx.active && slices.Contains(s.tx.lockedRefs, name) || slices.Contains(s.parsedRefs, name)
}

// locksReferences reports whether running p locks the catalog copy of its
// reference tables in a mode that a change's EXCLUSIVE lock waits for: a
// write, or a read the catalog copy serves with FOR UPDATE or FOR SHARE
// (or beside an ordinary table).
func locksReferences(p *router.Plan) bool {
	return p != nil && len(p.References) > 0 && (p.Kind == router.RefWrite || p.Kind == router.Catalog && !p.Anywhere)
}

// parseLock is called before a Parse of p goes to a backend of the catalog
// node. It returns the table whose copies are changing under the session's
// view, which the Parse would lock and so must wait for; else it holds the
// view until the exchange's answers are played (the Parse's among them) and
// notes p's tables as locked: in the transaction, or for this exchange
// outside one.
func (s *session) parseLock(ctx context.Context, p *router.Plan, start time.Time) (*shardmap.Reference, time.Time, error) {
	if !locksReferences(p) {
		return nil, time.Time{}, nil
	}
	v, err := s.view(ctx)
	if err != nil {
		return nil, time.Time{}, err
	}
	if r, end := s.changingOf(v, p.References, start); r != nil {
		return r, end, nil
	}
	if s.tx.active {
		s.noteRefLock(p)
		return nil, time.Time{}, nil
	}
	for _, name := range p.References {
		if !slices.Contains(s.parsedRefs, name) {
			s.parsedRefs = append(s.parsedRefs, name)
		}
	}
	return nil, time.Time{}, nil
}

// noteRefLock records, in the session's transaction, the reference tables
// p writes or locks rows of: their locks are the transaction's until it
// ends (or rolls back to a savepoint, which forgets them all).
func (s *session) noteRefLock(p *router.Plan) {
	if !s.tx.active {
		return
	}
	for _, name := range p.References {
		if !slices.Contains(s.tx.lockedRefs, name) {
			s.tx.lockedRefs = append(s.tx.lockedRefs, name)
		}
	}
}

// describeHeld holds a Describe of st, whose Parse would lock a reference
// table whose copies are changing, until the change ends (parseLock); false
// when it failed (the error is queued) or the batch is being skipped.
func (s *session) describeHeld(ctx context.Context, st *clientStmt) bool {
	for start := time.Now(); ; {
		r, end, err := s.parseLock(ctx, st.plan, start)
		if err == nil && r == nil {
			return true
		}
		if err == nil {
			err = s.holdReference(ctx, r, end, s.flushBatch)
		}
		if err != nil {
			s.fail(err)
			return false
		}
		if s.skipping {
			return false
		}
	}
}
