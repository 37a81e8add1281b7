package proxy

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// portalPart is one backend portal behind a client portal; a split INSERT
// has one per shard.
type portalPart struct {
	be   *pgshard.Conn
	name string
	sql  string // the simple protocol's statement, sent at run
	// prepared runs the simple protocol's statement as sql prepared, with
	// these parameters (simpleprepared.go); nil runs sql as a Query.
	prepared *router.Prepared
	load     loadMark
	lead     []pgproto3.BackendMessage // rows the proxy sends before the part's own (an Explain's plan)
}

// extendedMsg serves one extended-protocol message. Responses are queued in
// the exchange and played back at Sync or Flush, so a pipeline of many
// Executes costs one round trip to each backend.
func (s *session) extendedMsg(ctx context.Context, msg pgproto3.FrontendMessage) error {
	s.parseAheadMsg(ctx, msg)
	switch msg.(type) {
	case *pgproto3.Sync:
		return s.sync(ctx)
	case *pgproto3.Flush:
		return s.flushBatch()
	}
	if s.skipping {
		return nil
	}
	if s.cancelPending() {
		// The client cancelled the batch before this message's work went
		// out: sent at Sync, a forwarded cancel would find the backend idle.
		s.fail(errCanceled)
		return nil
	}
	// Each message sets the client text its steps take (exchange.client)
	// where it finds its statement.
	s.x.client = ""
	switch m := msg.(type) {
	case *pgproto3.Parse:
		s.parse(ctx, m)
	case *pgproto3.Bind:
		s.bind(ctx, m)
	case *pgproto3.Describe:
		s.describe(ctx, m)
	case *pgproto3.Execute:
		s.noteExecute(m.Portal)
		s.executeMsg(ctx, m)
		if p := s.portals[m.Portal]; p != nil && p.stmt.plan != nil && p.stmt.plan.Copy != nil && p.stmt.plan.Copy.From && p.stmt.plan.Copy.Select == "" && !s.skipping {
			// PostgreSQL answers CopyInResponse at once, and clients wait
			// for it before they send the data (a Sync sent in between
			// is ignored during COPY, here as there).
			return s.flushBatch()
		}
	case *pgproto3.Close:
		s.closeMsg(m)
	}
	if len(s.x.steps) > maxPendingSteps {
		return s.flushBatch()
	}
	return nil
}

func (s *session) parse(ctx context.Context, m *pgproto3.Parse) {
	s.x.client = m.Query
	if _, exists := s.stmts[m.Name]; exists && m.Name != "" {
		s.fail(sqlstate.New(sqlstate.DuplicatePreparedStatement, "prepared statement \"%s\" already exists", m.Name))
		return
	}
	if err := s.stmtRoom(m.Name); err != nil {
		s.fail(err)
		return
	}
	plans, v, err := s.plan(ctx, m.Query)
	if err != nil {
		s.fail(err)
		return
	}
	// A Parse routes nothing: its Bind holds the view it routes by, and
	// narrows or gives back a hold of its own (narrowView, releaseView).
	s.releaseView(v)
	if len(plans) > 1 {
		s.fail(sqlstate.New(sqlstate.SyntaxError, "cannot insert multiple commands into a prepared statement"))
		return
	}
	st := &clientStmt{sql: m.Query, trees: v.TreesVersion, epoch: pgshard.ResultEpoch()}
	if len(m.ParameterOIDs) > 0 {
		st.oids = append(st.oidBuf[:0:len(st.oidBuf)], m.ParameterOIDs...)
	}
	if len(plans) == 1 {
		st.plan = plans[0]
		if st.plan.Kind == router.Refused {
			s.fail(st.plan.Err)
			return
		}
	}
	s.stmts[m.Name] = st
	s.x.answer(parseCompleteMsgs)
	s.aheadOf(m.Name, st)
}

// replan refreshes a statement planned under an older trees version, as a
// tree may have been created since the client prepared it.
func (s *session) replan(st *clientStmt, v *shardmap.View) error {
	if st.plan == nil || st.trees == v.TreesVersion {
		return nil
	}
	plans, err := s.srv.planner.Plan(st.sql, viewTrees{v}, v.TreesVersion)
	if err != nil {
		return err
	}
	if len(plans) != 1 {
		return sqlstate.New(sqlstate.SyntaxError, "cannot insert multiple commands into a prepared statement")
	}
	st.plan, st.trees = plans[0], v.TreesVersion
	return nil
}

// bind serves a client's Bind: the statement, replanned on a current map
// and held while its slots are frozen, goes through execute.
func (s *session) bind(ctx context.Context, m *pgproto3.Bind) {
	st, ok := s.stmts[m.PreparedStatement]
	if !ok {
		s.fail(sqlstate.New(sqlstate.InvalidSQLStatementName, "prepared statement \"%s\" does not exist", m.PreparedStatement))
		return
	}
	s.x.client = st.sql
	if n := len(m.ParameterFormatCodes); n > 1 && n != len(m.Parameters) {
		s.fail(sqlstate.New(sqlstate.ProtocolViolation, "bind message has %d parameter formats but %d parameters", n, len(m.Parameters)))
		return
	}
	if _, open := s.portals[m.DestinationPortal]; open && m.DestinationPortal != "" {
		s.fail(sqlstate.New(sqlstate.DuplicateCursor, "cursor \"%s\" already exists", m.DestinationPortal))
		return
	}
	if err := s.portalRoom(m.DestinationPortal); err != nil {
		s.fail(err)
		return
	}
	v, err := s.view(ctx)
	if err != nil {
		s.fail(err)
		return
	}
	if err := s.replan(st, v); err != nil {
		s.fail(err)
		return
	}
	if v, ok = s.bindHeld(ctx, st, v, m); !ok {
		return
	}
	portal := &clientPortal{stmt: st}
	if len(m.ResultFormatCodes) > 0 {
		portal.resultFmt = append(portal.fmtBuf[:0:len(portal.fmtBuf)], m.ResultFormatCodes...)
	}
	if s.execute(ctx, v, portal, m) {
		s.portals[m.DestinationPortal] = portal
	}
}

// funcArgs reads the arguments of a lattice function call: its literals and
// the Bind's parameters.
func (s *session) funcArgs(f *router.FuncCall, m *pgproto3.Bind, oids []uint32) ([]*string, map[string]*string, error) {
	args := make([]*string, len(f.Args))
	for i, v := range f.Args {
		a, err := s.funcArg(v, m, oids)
		if err != nil {
			return nil, nil, err
		}
		args[i] = a
	}
	var named map[string]*string
	if len(f.Named) > 0 {
		named = make(map[string]*string, len(f.Named))
		for k, v := range f.Named {
			a, err := s.funcArg(v, m, oids)
			if err != nil {
				return nil, nil, err
			}
			named[k] = a
		}
	}
	return args, named, nil
}

func (s *session) funcArg(v router.Value, m *pgproto3.Bind, oids []uint32) (*string, error) {
	if v.Param == 0 {
		return literalPtr(v), nil
	}
	if v.Param > len(m.Parameters) {
		return nil, sqlstate.New(sqlstate.ProtocolViolation, "bind message supplies %d parameters, but the statement uses $%d", len(m.Parameters), v.Param)
	}
	var oid uint32
	if v.Param <= len(oids) {
		oid = oids[v.Param-1]
	}
	return paramText(m.Parameters[v.Param-1], formatFor(m.ParameterFormatCodes, v.Param-1), oid)
}

// prepareOn names the backend statement for sql with these parameter types,
// queueing its Parse on be the first time this backend sees it.
func (s *session) prepareOn(be *pgshard.Conn, sql string, oids []uint32, epoch uint64) string {
	s.keyBuf = appendPreparedKey(s.keyBuf[:0], sql, oids, epoch)
	name, ok := be.Prepared(s.keyBuf)
	if !ok {
		name = be.AddPrepared(string(s.keyBuf))
		be.Send(&pgproto3.Parse{Name: name, Query: sql, ParameterOIDs: oids})
		s.x.add(step{kind: stepParse, be: be})
	}
	return name
}

// statementOn names the backend statement that serves client statement st
// as sql on be: the one kept per backend (prepareOn) or, for a statement
// whose result columns are session state's when it is parsed (Plan.Reparse:
// FETCH, EXECUTE), the unnamed statement parsed here and now, so that it
// describes the cursor or SQL-level statement as it is.
func (s *session) statementOn(be *pgshard.Conn, st *clientStmt, sql string) string {
	if st.plan != nil && st.plan.Reparse {
		be.Send(&pgproto3.Parse{Query: sql, ParameterOIDs: st.oids})
		s.x.add(step{kind: stepParse, be: be})
		return ""
	}
	return s.prepareOn(be, sql, st.oids, st.epoch)
}

// parsedOn reports whether statementOn(be, st, st.sql) would send no Parse.
func (s *session) parsedOn(be *pgshard.Conn, st *clientStmt) bool {
	if st.plan != nil && st.plan.Reparse {
		return false
	}
	s.keyBuf = appendPreparedKey(s.keyBuf[:0], st.sql, st.oids, st.epoch)
	_, ok := be.Prepared(s.keyBuf)
	return ok
}

// appendPreparedKey appends the name of a backend statement to b: its
// text, parameter types and the result epoch of the client statement it
// serves. The key is built in the session's buffer and looked up without
// a string of its own, so a Bind of a statement the backend already holds
// allocates nothing for it.
func appendPreparedKey(b []byte, sql string, oids []uint32, epoch uint64) []byte {
	b = append(b, sql...)
	if len(oids) == 0 && epoch == 0 {
		return b
	}
	b = append(b, 0)
	b = strconv.AppendUint(b, epoch, 36)
	for _, o := range oids {
		b = append(b, 0)
		b = strconv.AppendUint(b, uint64(o), 10)
	}
	return b
}

// bindSplit binds one part per shard of a multi-row INSERT, each with only
// its rows' parameters. On one node the batch's implicit transaction keeps
// the INSERT atomic; over several, spanNodes does.
func (s *session) bindSplit(ctx context.Context, v *shardmap.View, portal *clientPortal, m *pgproto3.Bind) bool {
	p := portal.stmt.plan
	shards, err := s.splitRows(v, p, m, portal.stmt.oids)
	if err != nil {
		s.fail(err)
		return false
	}
	nodes := map[string]bool{}
	for _, sh := range shards {
		nodes[sh.Node] = true
	}
	countSplitRows(p, shards)
	span := len(nodes)
	if len(shards) > 1 {
		portal.split = &splitState{}
		if p.InOrder {
			portal.split.order = newReturnOrder(len(p.Rows), s.srv.cfg.MaxMergeMemory)
			for _, sh := range shards {
				portal.split.order.addPart(sh.Rows)
			}
			// Its RETURNING rows can fail in the proxy after every
			// part ran: the proxy, not PostgreSQL, ends the
			// transaction, on one node too.
			span = max(span, 2)
		}
	}
	s.spanNodes(span)
	for i, sh := range shards {
		b, partOIDs := splitBind(m, sh.Params, portal.stmt.oids)
		name := partPortal(m.DestinationPortal, i)
		part := &clientPortal{stmt: &clientStmt{sql: sh.SQL, oids: partOIDs, epoch: portal.stmt.epoch}}
		if !s.bindOn(ctx, part, sh.Node, sh.SQL, b, name, i > 0) {
			return false
		}
		// Counted by countSplitRows; the mark only records the write.
		part.parts[len(part.parts)-1].load = loadMark{shard: shardRef{p.Tree.MapName(), sh.Shard, sh.Node}, tree: p.Tree.Name}
		portal.parts = append(portal.parts, part.parts...)
	}
	return true
}

// splitBind is the client's Bind m for the part of a split INSERT that
// takes the given parameters (original numbers, in their new order), with
// their declared types.
func splitBind(m *pgproto3.Bind, params []int, oids []uint32) (*pgproto3.Bind, []uint32) {
	b := *m
	b.Parameters = make([][]byte, len(params))
	var formats []int16
	if len(m.ParameterFormatCodes) > 1 {
		formats = make([]int16, len(params))
	}
	for j, orig := range params {
		b.Parameters[j] = m.Parameters[orig-1]
		if formats != nil {
			formats[j] = m.ParameterFormatCodes[orig-1]
		}
	}
	if formats != nil {
		b.ParameterFormatCodes = formats
	}
	partOIDs := oids
	if len(partOIDs) > 0 {
		partOIDs = make([]uint32, len(params))
		for j, orig := range params {
			if orig-1 < len(oids) {
				partOIDs[j] = oids[orig-1]
			}
		}
	}
	return &b, partOIDs
}

// partPortal names the backend portal of part i of a client portal.
func partPortal(name string, i int) string {
	if i == 0 {
		return name
	}
	return "lattice_part_" + strconv.Itoa(i) + "_" + name
}

// bindWriteAll binds an UPDATE or DELETE without the shard key once per
// shard, every part with all of the client's parameters, atomically
// (spanNodes).
func (s *session) bindWriteAll(ctx context.Context, v *shardmap.View, portal *clientPortal, m *pgproto3.Bind) bool {
	p := portal.stmt.plan
	r, err := router.Resolve(v, p, routerBind(m, portal.stmt.oids))
	if err != nil {
		s.fail(err)
		return false
	}
	s.spanNodes(len(r.Nodes()))
	portal.split = &splitState{}
	for i, t := range r.Targets {
		part := &clientPortal{stmt: &clientStmt{sql: t.SQL, oids: portal.stmt.oids, epoch: portal.stmt.epoch}}
		if !s.bindOn(ctx, part, t.Node, part.stmt.sql, m, partPortal(m.DestinationPortal, i), i > 0) {
			return false
		}
		mark := markShards(v, p, []int{t.Shard})
		mark.shard, mark.tree = shardRef{p.Tree.MapName(), t.Shard, t.Node}, p.Tree.Name
		part.parts[len(part.parts)-1].load = mark
		portal.parts = append(portal.parts, part.parts...)
	}
	return true
}

func (s *session) describe(ctx context.Context, m *pgproto3.Describe) {
	if m.ObjectType == 'P' {
		s.describePortal(ctx, m.Name)
		return
	}
	st, ok := s.stmts[m.Name]
	if !ok {
		s.fail(sqlstate.New(sqlstate.InvalidSQLStatementName, "prepared statement \"%s\" does not exist", m.Name))
		return
	}
	s.x.client = st.sql
	p := st.plan
	if p == nil || p.Kind == router.Transaction || p.Kind == router.SessionSet || p.Kind == router.Discard || p.Kind == router.DDL || isListenPlan(p) {
		s.x.synthetic(&pgproto3.ParameterDescription{ParameterOIDs: st.oids}, &pgproto3.NoData{})
		return
	}
	if p.Kind == router.Function && p.Compose != nil {
		s.describeComposed(ctx, st)
		return
	}
	if p.Cursor != nil && s.describeCursor(p.Cursor, nil, st, nil) {
		return
	}
	if p.Kind == router.Function {
		fields, err := s.describeFunction(p.Func.Name)
		if err != nil {
			s.fail(err)
			return
		}
		oids := make([]uint32, maxParam(p.Func))
		for i := range oids {
			oids[i] = s.funcParamType(p.Func, i+1)
			if i < len(st.oids) && st.oids[i] != 0 {
				oids[i] = st.oids[i]
			}
		}
		// As in PostgreSQL, the described types are the statement's: Bind
		// decodes binary parameters by them.
		if len(st.oids) < len(oids) {
			st.oids = append(st.oids, make([]uint32, len(oids)-len(st.oids))...)
		}
		copy(st.oids, oids)
		s.x.synthetic(&pgproto3.ParameterDescription{ParameterOIDs: oids}, &pgproto3.RowDescription{Fields: fields})
		return
	}
	be, err := s.parseBackend(ctx, st.plan)
	if err != nil {
		s.fail(err)
		return
	}
	if !s.parsedOn(be, st) && !s.describeHeld(ctx, st) {
		return
	}
	name := s.statementOn(be, st, st.sql)
	be.Send(&pgproto3.Describe{ObjectType: 'S', Name: name})
	s.x.add(step{kind: stepDescribeStmt, be: be})
}

func maxParam(f *router.FuncCall) int {
	n := 0
	for _, a := range f.Args {
		n = max(n, a.Param)
	}
	for _, a := range f.Named {
		n = max(n, a.Param)
	}
	return n
}

func (s *session) describeFunction(name string) ([]pgproto3.FieldDescription, error) {
	if s.srv.functions == nil {
		return nil, sqlstate.New(sqlstate.UndefinedFunction, "function %s does not exist", name)
	}
	return s.srv.functions.Describe(name)
}

func (s *session) describePortal(ctx context.Context, name string) {
	portal, ok := s.portals[name]
	if !ok {
		if cur := s.cursors[name]; cur != nil {
			// A SQL cursor is a portal too (psycopg 3 describes its
			// server-side cursors so).
			s.describeCursor(nil, cur, nil, nil)
			return
		}
		s.fail(sqlstate.New(sqlstate.InvalidCursorName, "portal \"%s\" does not exist", name))
		return
	}
	s.x.client = portal.stmt.sql
	if s.describeBound(ctx, portal) {
		return
	}
	p := portal.stmt.plan
	if p != nil && p.Cursor != nil && s.describeCursor(p.Cursor, nil, nil, portal.resultFmt) {
		return
	}
	if p != nil && p.Kind == router.Function {
		fields, err := s.describeFunction(p.Func.Name)
		if err != nil {
			s.fail(err)
			return
		}
		s.x.synthetic(&pgproto3.RowDescription{Fields: resultFields(fields, portal.resultFmt)})
		return
	}
	s.x.answer(noDataMsgs)
}

// describeBound describes a portal bound on backends by its first part's
// portal there (an aggregate's by its final statement); it reports false
// for a portal bound on none.
func (s *session) describeBound(ctx context.Context, portal *clientPortal) bool {
	if portal.fan != nil && portal.fan.agg != nil {
		s.describeAggPortal(ctx, portal)
		return true
	}
	if len(portal.parts) == 0 {
		return false
	}
	part := portal.parts[0]
	s.out.sendDescribe(part.be, 'P', part.name)
	st := step{kind: stepDescribePortal, be: part.be}
	if portal.fan != nil {
		st.trim, st.capture = portal.fan.plan.Hidden, portal.fan
	}
	s.x.add(st)
	return true
}

func (s *session) executeMsg(ctx context.Context, m *pgproto3.Execute) {
	portal, ok := s.portals[m.Portal]
	if !ok {
		s.fail(sqlstate.New(sqlstate.InvalidCursorName, "portal \"%s\" does not exist", m.Portal))
		return
	}
	s.x.client = portal.stmt.sql
	s.run(ctx, portal, m.MaxRows)
}

func (s *session) closeMsg(m *pgproto3.Close) {
	if m.ObjectType == 'S' {
		delete(s.stmts, m.Name)
	} else if p := s.portals[m.Name]; p != nil {
		delete(s.portals, m.Name)
		// The backend portals go too, so that the name can be bound again
		// in this transaction, and their resources are freed.
		for _, part := range p.parts {
			if part.name != "" && part.be.PortalOpen(part.name) {
				part.be.Send(&pgproto3.Close{ObjectType: 'P', Name: part.name})
				s.x.add(step{kind: stepClose, be: part.be, hide: true})
			}
		}
	}
	s.x.answer(closeCompleteMsgs)
}

// Protocol-level prepared statements share one namespace per session with
// SQL PREPARE, as in PostgreSQL. The proxy keeps the first (s.stmts); the
// second live on the session's pinned backend. A statement in a failed
// transaction is left to the backend, which answers 25P02 and changes
// nothing.

// sharedNames refuses SQL PREPARE of a name the client prepared with the
// protocol.
func (s *session) sharedNames(p *router.Plan) error {
	if _, ok := s.stmts[p.Prepare]; ok && p.Prepare != "" && s.txStatus() != 'E' {
		return sqlstate.New(sqlstate.DuplicatePreparedStatement, "prepared statement \"%s\" already exists", p.Prepare)
	}
	return nil
}

// protocolDealloc reports SQL DEALLOCATE of a statement prepared with the
// protocol, which the proxy answers itself.
func (s *session) protocolDealloc(p *router.Plan) bool {
	_, ok := s.stmts[p.Dealloc]
	return ok && p.Dealloc != "" && s.txStatus() != 'E'
}

// deallocate runs SQL DEALLOCATE name of a protocol statement.
func (s *session) deallocate(name string) {
	if _, ok := s.stmts[name]; !ok {
		// Closed since the DEALLOCATE was bound.
		s.fail(sqlstate.New(sqlstate.InvalidSQLStatementName, "prepared statement \"%s\" does not exist", name))
		return
	}
	delete(s.stmts, name)
	s.x.synthetic(commandComplete("DEALLOCATE"))
}

// deallocateAll is SQL DEALLOCATE ALL on the protocol statements: every
// named one goes; PostgreSQL keeps the unnamed statement.
func (s *session) deallocateAll() {
	for name := range s.stmts {
		if name != "" {
			delete(s.stmts, name)
		}
	}
}

// sync ends a batch: every backend used gets its Sync, all responses are
// played back, and the client gets one ReadyForQuery.
func (s *session) sync(ctx context.Context) error {
	for _, list := range s.backendLists() {
		for _, be := range list {
			if s.inBatch(be) {
				be.Send(&pgproto3.Sync{})
				s.x.add(step{kind: stepSync, be: be})
			}
		}
	}
	s.keepRetry(func(st step) bool { return st.kind == stepSync })
	s.sendBackends()
	if err := s.play(&s.x); err != nil {
		return err
	}
	if err := s.retryStale(ctx); err != nil {
		return err
	}
	ok := !s.x.errored
	s.x.reset()
	s.skipping = false
	s.pinSynced(ok)
	s.finish()
	if err := s.endImplicit(ctx, ok); err != nil {
		s.send(err.Response())
	}
	s.settleCursors(ok)
	if s.txStatus() == 'I' {
		// Portals live until their transaction ends.
		clear(s.portals)
	}
	s.syncListener()
	s.send(readyForQuery(s.txStatus()))
	return s.flush()
}

// inBatch reports whether be received anything since the last Sync. A pinned
// backend left alone needs no Sync.
func (s *session) inBatch(be *pgshard.Conn) bool {
	for i := range s.x.steps {
		if s.x.steps[i].uses(be) {
			return true
		}
	}
	return s.x.sentSinceSync[be]
}

// flushBatch plays back what is queued so far, asking each backend to flush
// its output without ending the implicit transaction.
func (s *session) flushBatch() error {
	for _, be := range s.backends() {
		if s.inBatch(be) {
			be.Send(&pgproto3.Flush{})
		}
	}
	for _, st := range s.x.steps {
		if st.be != nil {
			s.x.sentSinceSync[st.be] = true
		}
		if st.fan != nil {
			for _, p := range st.fan.parts {
				s.x.sentSinceSync[p.be] = true
			}
		}
	}
	// The client may see results before Sync: no retry after a Flush.
	s.keepRetry(func(step) bool { return false })
	s.ahead = nil
	s.sendBackends()
	if err := s.play(&s.x); err != nil {
		return err
	}
	s.x.steps = s.x.steps[:0]
	s.x.pathSet = false // played: the session's settings have its SET now
	if s.x.errored {
		s.skipping = true
	}
	s.releaseViews()
	return s.flush()
}
