package proxy

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// The one execution path.
//
// Every statement runs as a plan and a Bind. In the extended protocol the
// Bind is the client's; a statement of a simple Query gets an empty one (its
// literals stay in the SQL) with text results, and the Query ends as if a
// Sync followed. execute chooses, once per plan kind, how the statement runs:
// bound on the backends router.Resolve names (portal.parts), merged from
// several (portal.fan), or done by the proxy itself at Execute (portal.run).
// run then executes the portal. The protocols differ only in how backend
// work is framed (session.simple): the simple protocol sends each backend
// its statements as one Query at run, whose RowDescription comes before the
// rows and whose ReadyForQuery ends it; the extended protocol sends Parse
// and Bind at execute and Execute at run, answers Describe separately, and
// ends nothing before Sync.

// noParams is the Bind of a simple-protocol statement. It is only read.
var noParams pgproto3.Bind

// execute binds portal's statement with the client's Bind m. It reports
// false when the statement failed; the error is queued.
func (s *session) execute(ctx context.Context, v *shardmap.View, portal *clientPortal, m *pgproto3.Bind) bool {
	st := portal.stmt
	p := st.plan
	if p == nil {
		s.bindComplete()
		return true
	}
	if s.abortedTx(p) {
		s.fail(errAbortedTx)
		return false
	}
	s.noteRouting(v, p)
	if err := s.checkRouting(ctx, v, p); err != nil {
		s.fail(err)
		return false
	}
	if err := s.shadowCheckAfter(ctx, v, p, s.x.pathSet); err != nil {
		s.fail(err)
		return false
	}
	s.x.pathSet = s.x.pathSet || setsSearchPath(p)
	s.noteHides(p)
	switch p.Kind {
	case router.Refused:
		s.fail(p.Err)
		return false
	case router.Transaction:
		portal.run = func(ctx context.Context) { s.txControl(ctx, p) }
	case router.SessionSet:
		portal.run = func(ctx context.Context) { s.sessionSet(ctx, p) }
	case router.Discard:
		portal.run = func(context.Context) { s.discardAll() }
	case router.LocalSet:
		if s.tx.active {
			// Runs on every node of the transaction.
			portal.run = func(ctx context.Context) { s.localSet(ctx, p) }
			break
		}
		return s.bindOn(ctx, portal, s.catalogTarget(p), p.SQL, m, m.DestinationPortal, false)
	case router.Cursor:
		return s.declare(ctx, v, portal, p.Cursor, m)
	case router.Catalog:
		s.releaseView(v)
		if len(p.References) > 0 && !p.Anywhere {
			// FOR UPDATE or FOR SHARE of a reference table (or a read
			// beside an ordinary table): the catalog copy's rows.
			s.noteRefLock(p)
		}
		if p.Cursor != nil {
			if bound, ok := s.cursorStatement(portal, p.Cursor); bound {
				return ok
			}
		}
		if isListenPlan(p) {
			// Runs on the session's listen backend.
			portal.run = func(ctx context.Context) { s.listenCommand(ctx, p) }
			break
		}
		if err := s.sharedNames(p); err != nil {
			s.fail(err)
			return false
		}
		if s.protocolDealloc(p) {
			// Only the proxy holds a statement the client prepared with
			// the protocol.
			portal.run = func(context.Context) { s.deallocate(p.Dealloc) }
			break
		}
		if err := s.catalogGuard(p); err != nil {
			s.fail(err)
			return false
		}
		if err := s.pinFor(ctx, p.Pin); err != nil {
			s.fail(err)
			return false
		}
		sql, pr := p.SQL, s.asPrepared(st, m)
		if pr != nil {
			sql = pr.SQL(0)
		}
		if !s.bindWith(ctx, portal, s.referenceRead(v, p), sql, m, m.DestinationPortal, false, pr) {
			return false
		}
		if !s.simple && !s.tx.active && p.Pin|p.Unpin == 0 {
			// Kept for a write that finds the table became a tree (retryable).
			portal.bind = portal.bound.copyOf(m)
		}
		if p.SetPath != "" {
			// Recorded, as SET search_path is, once the node accepted it.
			portal.run = func(context.Context) {
				s.runParts(portal, 0)
				s.recordPath(portal.parts[0].be, p.SetPath)
			}
		}
		if p.Unpin&router.PinPrepare != 0 && s.txStatus() != 'E' {
			// DEALLOCATE ALL: the SQL-level statements go on the backend.
			portal.run = func(context.Context) {
				s.deallocateAll()
				s.runParts(portal, 0)
			}
		}
		return true
	case router.Single:
		pr := s.asPrepared(st, m)
		sh, err := s.routeAs(v, p, m, st.oids, pr != nil)
		if err != nil {
			s.fail(err)
			return false
		}
		if len(p.References) == 0 {
			// One slot of one tree (or of its colocation group) is all the
			// statement routes by.
			s.narrowView(v, p.Tree.Name, sh.Slot)
		}
		if !s.bindWith(ctx, portal, sh.Node, sh.SQL, m, m.DestinationPortal, false, pr) {
			return false
		}
		portal.parts[len(portal.parts)-1].load = markLoad(p, sh)
		if !s.simple && !s.tx.active {
			portal.bind = portal.bound.copyOf(m)
		}
		return true
	case router.InsertSplit:
		return s.bindSplit(ctx, v, portal, m)
	case router.WriteAll:
		return s.bindWriteAll(ctx, v, portal, m)
	case router.RefWrite:
		return s.bindRefWrite(ctx, v, p, portal, m)
	case router.FanOut:
		if t, ok := wholeOnOneNode(v, p, m, st.oids); ok {
			if !s.bindOn(ctx, portal, t.Node, t.SQL, m, m.DestinationPortal, false) {
				return false
			}
			portal.parts[len(portal.parts)-1].load = markShards(v, p, t.Shards)
			return true
		}
		portal.fan = s.startFanOut(ctx, v, p, m, portal)
		return portal.fan != nil
	case router.Explain:
		return s.bindExplain(ctx, v, portal, m)
	case router.DDL:
		return s.bindDDL(ctx, v, portal, m)
	case router.Copy:
		pull := newPullSource(st, m)
		portal.run = func(ctx context.Context) { s.runCopy(ctx, portal, v, pull) }
	case router.Function:
		if p.Compose != nil {
			return s.bindComposed(ctx, portal, m)
		}
		// A Lattice function routes by no map of the view, and some wait
		// for every proxy's acknowledgement: this one's too (a node's
		// removal changes the copies of reference tables).
		s.releaseView(v)
		args, named, err := s.funcArgs(p.Func, m, st.oids)
		if err != nil {
			s.fail(err)
			return false
		}
		portal.run = func(ctx context.Context) { s.callFunction(ctx, p.Func, args, named, portal.resultFmt) }
	default:
		s.fail(sqlstate.New(sqlstate.InternalError, "unhandled plan kind %v", p.Kind))
		return false
	}
	s.bindComplete()
	return true
}

// bindComplete answers a Bind the proxy handles itself; a simple Query has
// no Bind to answer.
func (s *session) bindComplete() {
	if !s.simple {
		s.x.answer(bindCompleteMsgs)
	}
}

// bindOn binds sql on node's backend for portal under portalName. In the
// extended protocol the statement is prepared there (once per backend, or
// for each use: statementOn) and the client's parameters bound to it; hide keeps BindComplete from the
// client (the extra parts of a split INSERT). In the simple protocol
// nothing is sent yet: run sends sql as a Query.
func (s *session) bindOn(ctx context.Context, portal *clientPortal, node, sql string, m *pgproto3.Bind, portalName string, hide bool) bool {
	return s.bindWith(ctx, portal, node, sql, m, portalName, hide, nil)
}

// bindWith is bindOn for sql, the text of pr when pr is not nil: the
// statement then runs prepared with pr's values as its parameters
// (simpleprepared.go).
func (s *session) bindWith(ctx context.Context, portal *clientPortal, node, sql string, m *pgproto3.Bind, portalName string, hide bool, pr *router.Prepared) bool {
	be, err := s.backend(ctx, node)
	if err != nil {
		s.fail(err)
		return false
	}
	if s.simple {
		portal.parts = append(portal.parts, portalPart{be: be, sql: sql, prepared: pr})
		return true
	}
	var name string
	if pr != nil {
		name = s.prepareOn(be, sql, pr.OIDs, portal.stmt.epoch)
	} else {
		name = s.statementOn(be, portal.stmt, sql)
	}
	if portalName != "" && be.PortalOpen(portalName) {
		// A portal of an earlier statement of this transaction (a part of
		// a fan-out, or one the client closed) still holds the name.
		be.Send(&pgproto3.Close{ObjectType: 'P', Name: portalName})
		s.x.add(step{kind: stepClose, be: be, hide: true})
	}
	if pr != nil {
		s.out.sendBindText(be, name, pr.Values, portalName, m.ResultFormatCodes)
	} else {
		s.out.sendBind(be, m, portalName, name)
	}
	s.x.add(step{kind: stepBind, be: be, hide: hide})
	if portal.parts == nil {
		portal.parts = portal.partBuf[:0:len(portal.partBuf)]
	}
	portal.parts = append(portal.parts, portalPart{be: be, name: portalName})
	return true
}

// run executes a bound portal. maxRows is the Execute's row limit (0 for
// none; always 0 in the simple protocol).
func (s *session) run(ctx context.Context, portal *clientPortal, maxRows uint32) {
	switch {
	case portal.fetch != nil:
		portal.fetch(ctx, maxRows)
	case portal.run != nil:
		portal.run(ctx)
	case portal.fan != nil:
		s.runFanOut(portal, maxRows)
	case len(portal.parts) > 0:
		s.runParts(portal, maxRows)
	default:
		s.x.answer(emptyQueryMsgs)
	}
}

// runFanOut executes every part of a fan-out; the merge reads them when the
// exchange plays.
func (s *session) runFanOut(portal *clientPortal, maxRows uint32) {
	f := portal.fan
	if s.simple {
		for _, part := range portal.parts {
			part.be.Send(&pgproto3.Query{String: part.sql})
		}
		s.x.add(step{kind: stepFanOut, fan: f})
		return
	}
	if portal.held != nil {
		s.x.add(step{kind: stepSynthetic, then: func(*exchange) { s.sendBatch(portal.held, maxRows) }})
		return
	}
	if maxRows > 0 {
		// The first batch: the merge's rows go into the portal, and the
		// batch is handed out from there.
		held := s.holdRows(portal)
		s.x.add(step{kind: stepSynthetic, then: func(*exchange) { s.capture = held }})
		s.executeFanOut(portal)
		s.x.add(step{kind: stepSynthetic, then: func(x *exchange) { s.endHold(x, portal, maxRows) }})
		return
	}
	s.executeFanOut(portal)
}

// executeFanOut sends the Execute of every part of a fan-out bound in the
// extended protocol, and the merge's step.
func (s *session) executeFanOut(portal *clientPortal) {
	f := portal.fan
	if (len(f.plan.Sort) > 0 || f.agg != nil) && f.fields == nil {
		// The merge needs the column types: describe the first part for
		// the proxy alone.
		part := portal.parts[0]
		s.out.sendDescribe(part.be, 'P', part.name)
		s.x.add(step{kind: stepDescribePortal, be: part.be, hide: true, capture: f})
	}
	for _, part := range portal.parts {
		s.out.sendExecute(part.be, part.name, 0)
	}
	s.x.add(step{kind: stepFanOut, fan: f})
}

// runParts executes a statement bound on one or more backends. The parts
// of a split statement report their rows only; one tag with the counts
// added up follows them.
func (s *session) runParts(portal *clientPortal, maxRows uint32) {
	sp := portal.split
	if sp != nil {
		sp.count, sp.rowDescSent = 0, false
		if sp.order != nil {
			// The parts answer in portal order; queryParts says otherwise.
			sp.order.reset()
			for i := range portal.parts {
				sp.order.seq = append(sp.order.seq, i)
			}
		}
	}
	if s.simple {
		s.queryParts(portal)
	} else {
		retry := s.retryable(portal, maxRows)
		if retry {
			s.retryBuf = extRetry{stmt: portal.stmt, bind: portal.bind, step: len(s.x.steps)}
			s.extRetry = &s.retryBuf
		}
		partMax := maxRows
		if sp != nil {
			// Each part would suspend at the limit, and the client get a
			// PortalSuspended per part: the parts run whole, and the
			// client gets every row at once, then the tag.
			partMax = 0
		}
		for i, part := range portal.parts {
			s.out.sendExecute(part.be, part.name, partMax)
			st := step{kind: stepExecute, be: part.be, staleRetry: retry, load: part.load, lead: part.lead}
			portal.parts[i].lead = nil // sent once, before the first rows
			if sp != nil {
				st.rowsOnly, st.split = true, sp
			}
			s.x.add(st)
		}
	}
	if sp != nil {
		s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
			if !x.errored {
				if sp.order != nil {
					sp.order.flush(s.send)
				}
				s.send(sp.tag())
			}
		}})
	}
	s.pinEnds(portal.stmt.plan.Unpin)
}

// queryParts sends each backend of a simple-protocol statement its parts as
// one Query, in order of their first part: on one node PostgreSQL's
// implicit transaction keeps them atomic, over several the session's
// transaction (spanNodes) does. A statement on one shard outside a
// transaction is routed again after LT001 (simpleQuery), and so is one on
// the catalog node (staleCatalog).
func (s *session) queryParts(portal *clientPortal) {
	parts, sp := portal.parts, portal.split
	if len(parts) == 1 {
		k := portal.stmt.plan.Kind
		retry := s.simpleRetry && !s.tx.active && sp == nil && (k == router.Single || k == router.InsertSplit || staleCatalog(portal.stmt.plan))
		if parts[0].prepared != nil {
			s.queryPrepared(parts[0], retry)
			return
		}
		s.out.sendQuery(parts[0].be, parts[0].sql)
		s.x.add(step{kind: stepQuery, be: parts[0].be, staleRetry: retry, rowsOnly: sp != nil, split: sp, load: parts[0].load, lead: parts[0].lead})
		return
	}
	var order []*pgshard.Conn
	sqls := map[*pgshard.Conn][]string{}
	loads := map[*pgshard.Conn][]loadMark{}
	indexes := map[*pgshard.Conn][]int{}
	for i, part := range parts {
		if _, ok := sqls[part.be]; !ok {
			order = append(order, part.be)
		}
		sqls[part.be] = append(sqls[part.be], part.sql)
		loads[part.be] = append(loads[part.be], part.load)
		indexes[part.be] = append(indexes[part.be], i)
	}
	if sp != nil && sp.order != nil {
		// Each backend answers its parts in turn, backend after backend.
		sp.order.seq = sp.order.seq[:0]
		for _, be := range order {
			sp.order.seq = append(sp.order.seq, indexes[be]...)
		}
	}
	for _, be := range order {
		be.Send(&pgproto3.Query{String: strings.Join(sqls[be], ";\n")})
		s.x.add(step{kind: stepQuery, be: be, rowsOnly: sp != nil, split: sp, load: loads[be][0], more: loads[be][1:]})
	}
}

// runCopy starts the COPY of portal. A portal of the extended protocol may
// run in a later batch than its Bind: it is held again on a current map.
func (s *session) runCopy(ctx context.Context, portal *clientPortal, v *shardmap.View, pull *pullSource) {
	if !s.simple {
		var err error
		if v, err = s.view(ctx); err != nil {
			s.fail(err)
			return
		}
		var ok bool
		if v, ok = s.bindHeld(ctx, portal.stmt, v, nil); !ok {
			return
		}
	}
	s.startCopy(ctx, v, portal.stmt.plan, pull)
}
