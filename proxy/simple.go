package proxy

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// simpleQuery serves one Query message. A statement rejected by a shard with
// LT001 (its slot moved) is routed again on a fresh map, invisibly to the client.
func (s *session) simpleQuery(ctx context.Context, sql string) error {
	s.simple = true
	defer func() { s.simple = false }()
	for attempt := 0; ; attempt++ {
		s.x.reset()
		s.x.client = sql
		s.runQuery(ctx, sql, attempt < maxStaleRetries)
		s.sendBackends()
		if err := s.play(&s.x); err != nil {
			return err
		}
		if s.x.stale == nil {
			break
		}
		s.finish()
		if _, err := s.srv.cache.Refresh(ctx, s.tenant); err != nil {
			s.log.Warn("map refresh after LT001 failed", "err", err)
		}
	}
	return s.endQuery(ctx)
}

// endQuery ends a message of the simple protocol once its exchange has
// played: the backends go back, an implicit transaction ends, and the
// client gets ReadyForQuery.
func (s *session) endQuery(ctx context.Context) error {
	ok := !s.x.errored
	s.x.reset()
	s.finish()
	if err := s.endImplicit(ctx, ok); err != nil {
		s.send(err.Response())
	}
	s.settleCursors(ok)
	if len(s.portals) > 0 && s.txStatus() == 'I' {
		// Portals live until their transaction ends.
		clear(s.portals)
	}
	s.syncListener()
	s.send(readyForQuery(s.txStatus()))
	return s.flush()
}

func (s *session) runQuery(ctx context.Context, sql string, allowRetry bool) {
	plans, v, err := s.planHeld(ctx, sql)
	if err != nil {
		s.qkind = kindUnplanned
		s.fail(err)
		return
	}
	switch len(plans) {
	case 0:
		s.qkind = kindNone
		s.x.answer(emptyQueryMsgs)
	case 1:
		s.qkind = plans[0].Kind
		s.simpleRetry = allowRetry
		s.simpleOne(ctx, v, plans[0])
	default:
		s.qkind = kindMulti
		s.simpleMulti(ctx, v, plans)
	}
}

// abortedTx reports the 25P02 PostgreSQL gives for statements in a failed
// transaction, when the proxy itself holds that transaction.
func (s *session) abortedTx(p *router.Plan) bool {
	if !s.tx.failed && s.txStatus() != 'E' {
		// A participant's own error leaves it 'E': the statement may
		// be routed to a node the transaction has not reached yet.
		return false
	}
	if p.Kind == router.Transaction && (p.Tx == router.Commit || p.Tx == router.Rollback || p.Tx == router.RollbackTo) {
		return false
	}
	return true
}

var errAbortedTx = sqlstate.New(sqlstate.InFailedSQLTransaction, "current transaction is aborted, commands ignored until end of transaction block")

// simpleOne runs the one statement of a Query on the one execute path, with
// no parameters and text results.
func (s *session) simpleOne(ctx context.Context, v *shardmap.View, p *router.Plan) {
	s.q.stmt = clientStmt{sql: p.SQL, plan: p, trees: v.TreesVersion}
	s.q.portal = clientPortal{stmt: &s.q.stmt, parts: s.q.portal.parts[:0]}
	if s.execute(ctx, v, &s.q.portal, &noParams) {
		s.run(ctx, &s.q.portal, 0)
	}
}

func (s *session) forwardQuery(ctx context.Context, node, sql string, loads []loadMark) {
	be, err := s.backend(ctx, node)
	if err != nil {
		s.fail(err)
		return
	}
	be.Send(&pgproto3.Query{String: sql})
	st := step{kind: stepQuery, be: be}
	if len(loads) > 0 {
		st.load, st.more = loads[0], loads[1:]
	}
	s.x.add(st)
}

// simpleMulti runs a Query holding several statements. It is forwarded as one
// Query, so PostgreSQL keeps its implicit-transaction semantics, when every
// statement goes to one node; otherwise it is refused.
func (s *session) simpleMulti(ctx context.Context, v *shardmap.View, plans []*router.Plan) {
	if slices.ContainsFunc(plans, isListenPlan) {
		s.listenMulti(ctx, plans)
		return
	}
	node := ""
	parts := make([]string, 0, len(plans))
	// txStmts are the statements that act on the whole transaction; they
	// reach only the node this query string runs on.
	var txStmts []*router.Plan
	var pin, unpin router.Pin
	var sets []string                     // SET and RESET, recorded once the string committed
	loads := make([]loadMark, len(plans)) // one per statement, each answering one CommandComplete
	pathSet := false                      // a statement before this one sets the search_path
	for i, p := range plans {
		var n, sql string
		s.noteRouting(v, p)
		if err := s.checkRouting(ctx, v, p); err != nil {
			s.fail(err)
			return
		}
		if err := s.shadowCheckAfter(ctx, v, p, pathSet); err != nil {
			s.fail(err)
			return
		}
		pathSet = pathSet || setsSearchPath(p)
		pin, unpin = pin|p.Pin, unpin|p.Unpin
		s.noteHides(p)
		if p.Kind == router.LocalSet || p.Kind == router.Transaction && p.Tx != router.Begin {
			txStmts = append(txStmts, p)
		}
		if p.Kind == router.Transaction && p.Tx == router.Begin && !s.tx.active {
			// Replayed on the other nodes the transaction will touch.
			s.tx.begin = strings.TrimSpace("BEGIN " + p.TxOptions)
		}
		if p.Kind == router.SessionSet {
			sets = append(sets, p.SQL)
		}
		if p.SetPath != "" {
			sets = append(sets, p.SetPath)
		}
		if c := p.Cursor; c != nil && len(s.cursors) > 0 && (s.cursors[c.Name] != nil || c.Op == router.CursorClose && c.Name == "") {
			e := sqlstate.New(sqlstate.FeatureNotSupported, "%s of a cursor over trees cannot be combined with other statements in one query string", strings.ToUpper(firstWord(p.SQL)))
			e.Hint = "send it as a query of its own"
			s.fail(e)
			return
		}
		if p.Kind == router.Transaction {
			s.noteTxEnd(p)
		}
		switch p.Kind {
		case router.Catalog, router.LocalSet, router.Transaction, router.SessionSet:
			err := s.catalogGuard(p)
			if err == nil {
				err = s.sharedNames(p)
			}
			if err != nil {
				s.fail(err)
				return
			}
			if s.protocolDealloc(p) {
				e := sqlstate.New(sqlstate.FeatureNotSupported, "DEALLOCATE of protocol-level prepared statement \"%s\" cannot be combined with other statements in one query string through the Lattice proxy", p.Dealloc)
				e.Hint = "send it as a query of its own"
				s.fail(e)
				return
			}
			if p.Unpin&router.PinPrepare != 0 && s.txStatus() != 'E' {
				s.deallocateAll()
			}
			sql = p.SQL
			if p.Kind == router.Catalog && !p.Anywhere {
				n = s.srv.catalogNode
			}
		case router.Single:
			sh, err := s.route(v, p, nil, nil)
			if err != nil {
				s.fail(err)
				return
			}
			n, sql = sh.Node, sh.SQL
			loads[i] = markLoad(p, sh)
		case router.Refused:
			s.fail(p.Err)
			return
		default:
			e := sqlstate.New(sqlstate.FeatureNotSupported, "%s cannot be combined with other statements in one query string: %s", strings.ToUpper(firstWord(p.SQL)), alone(p.Kind))
			e.Hint = "send it as a query of its own"
			s.fail(e)
			return
		}
		if n != "" {
			if node != "" && node != n {
				e := sqlstate.New(sqlstate.FeatureNotSupported, "the statements of this query string need more than one node")
				e.Hint = "send them as separate queries"
				s.fail(e)
				return
			}
			node = n
		}
		parts = append(parts, sql)
	}
	if node == "" {
		node = s.catalogTarget(&router.Plan{Anywhere: true})
	}
	if len(txStmts) > 0 && (len(s.tx.conns) > 1 || len(s.tx.conns) == 1 && s.tx.conns[0].Node != node) {
		e := sqlstate.New(sqlstate.FeatureNotSupported, "%s inside a multi-statement query is not supported in a transaction that spans several nodes", firstWord(txStmts[0].SQL))
		e.Hint = "send COMMIT, ROLLBACK, savepoint and SET LOCAL commands as queries of their own"
		s.fail(e)
		return
	}
	// The string's SET LOCALs and savepoints are made again on the nodes
	// the transaction touches later.
	inTx := s.tx.active
	for _, p := range plans {
		switch {
		case p.Kind == router.Transaction && p.Tx == router.Begin && !inTx,
			p.Kind == router.Transaction && (p.Tx == router.Commit || p.Tx == router.Rollback) && !p.Chain:
			inTx = p.Tx == router.Begin
			s.tx.local, s.tx.savepoints = nil, nil
		case !inTx:
		case p.Kind == router.LocalSet:
			s.tx.local = append(s.tx.local, p.SQL)
		case p.Kind == router.Transaction && (p.Tx == router.Savepoint || p.Tx == router.Release || p.Tx == router.RollbackTo):
			s.applySavepoint(p)
		}
	}
	if err := s.multiSets(sets, txStmts); err != nil {
		s.fail(err)
		return
	}
	if err := s.pinFor(ctx, pin); err != nil {
		s.fail(err)
		return
	}
	s.forwardQuery(ctx, node, strings.Join(parts, ";\n"), loads)
	s.pinEnds(unpin &^ pin)
	s.recordSets(ctx, node, sets)
}

// localSet runs SET LOCAL, SET TRANSACTION or SET CONSTRAINTS inside a
// transaction on every node it holds, and keeps it to replay on the nodes
// it touches later. With no node yet, the catalog node joins so that
// PostgreSQL validates the statement.
func (s *session) localSet(ctx context.Context, p *router.Plan) {
	conns := s.tx.conns
	if len(conns) == 0 {
		be, err := s.backend(ctx, s.srv.catalogNode)
		if err != nil {
			s.fail(err)
			return
		}
		conns = []*pgshard.Conn{be}
	}
	for i, be := range conns {
		s.forwardTx(be, p.SQL, i > 0)
	}
	s.tx.local = append(s.tx.local, p.SQL)
}

// catalogGuard refuses a notification the transaction could not commit.
func (s *session) catalogGuard(p *router.Plan) error {
	if p.Notify && slices.ContainsFunc(s.tx.conns, func(be *pgshard.Conn) bool { return be.Node != s.srv.catalogNode }) {
		// It would join the catalog node to a transaction over several
		// nodes, and PostgreSQL cannot prepare a transaction that notified.
		e := sqlstate.New(sqlstate.FeatureNotSupported, "cannot notify inside a transaction that already uses %s: notifications are sent from the catalog node, and a transaction over several nodes commits with PREPARE TRANSACTION, which PostgreSQL refuses after NOTIFY", nodeList(s.tx.conns))
		e.Hint = "notify outside this transaction, or in a transaction that touches only the catalog node"
		return e
	}
	return nil
}

// txControl serves BEGIN, COMMIT, ROLLBACK and savepoints. BEGIN takes no
// backend: each node the transaction touches gets BEGIN replayed before its
// first statement. COMMIT over several nodes is a two-phase commit.
func (s *session) txControl(ctx context.Context, p *router.Plan) {
	s.noteTxEnd(p)
	if p.Tx != router.Savepoint && p.Tx != router.Release {
		// The transaction ends or rolls back to a savepoint: the locks
		// its writes took may go.
		s.tx.wrote, s.tx.lockedRefs = s.tx.wrote[:0], s.tx.lockedRefs[:0]
	}
	if p.Chain {
		s.txChain(ctx, p)
		return
	}
	if p.Tx == router.Begin && s.tx.implicit {
		// As in PostgreSQL, BEGIN inside an implicit transaction makes it
		// a transaction block that includes what ran before.
		s.tx.implicit = false
		s.x.synthetic(commandComplete("BEGIN"))
		return
	}
	if len(s.tx.conns) > 0 && p.Tx != router.Begin {
		s.txOnBackends(ctx, p)
		return
	}
	switch p.Tx {
	case router.Begin:
		if s.tx.active {
			s.x.synthetic(sqlstate.Warning(sqlstate.ActiveSQLTransaction, "there is already a transaction in progress").Notice(), commandComplete("BEGIN"))
			return
		}
		s.tx.active, s.tx.failed, s.tx.savepoints = true, false, nil
		s.tx.begin = "BEGIN"
		if p.TxOptions != "" {
			s.tx.begin = "BEGIN " + p.TxOptions
		}
		s.x.synthetic(commandComplete("BEGIN"))
	case router.Commit, router.Rollback:
		tag := "COMMIT"
		if p.Tx == router.Rollback || s.tx.failed {
			tag = "ROLLBACK"
		}
		if !s.tx.active {
			s.x.synthetic(sqlstate.Warning(sqlstate.NoActiveSQLTransaction, "there is no transaction in progress").Notice(), commandComplete(tag))
			return
		}
		s.tx.active, s.tx.failed, s.tx.savepoints = false, false, nil
		if s.tx.setInTx {
			// No backend holds the transaction any more: nothing committed.
			s.settings.restore(s.tx.setsBefore)
			s.tx.setInTx, s.tx.setsBefore = false, nil
		}
		s.x.synthetic(commandComplete(tag))
	case router.Savepoint, router.Release, router.RollbackTo:
		if !s.tx.active {
			s.fail(notInBlock(p))
			return
		}
		if s.tx.failed && p.Tx != router.RollbackTo {
			s.fail(errAbortedTx)
			return
		}
		if !s.applySavepoint(p) {
			s.fail(noSavepoint(p))
			return
		}
		s.tx.failed = false
		s.x.synthetic(commandComplete(savepointTag(p.Tx)))
	default:
		s.fail(sqlstate.New(sqlstate.FeatureNotSupported, "%s is not supported through the Lattice proxy", firstWord(p.SQL)))
	}
}

func savepointTag(t router.TxKind) string {
	switch t {
	case router.Release:
		return "RELEASE"
	case router.RollbackTo:
		return "ROLLBACK"
	}
	return "SAVEPOINT"
}

// afterTxEnd follows a COMMIT just queued (the last step) on be, the one
// backend of the transaction: when it did not commit after all, SETs made
// inside the transaction are undone, on be by PostgreSQL and here by
// restoring the session's settings. (ROLLBACK TO SAVEPOINT restores them
// in applySavepoint.)
func (s *session) afterTxEnd(be *pgshard.Conn) {
	if !s.tx.setInTx {
		return
	}
	before := s.tx.setsBefore
	s.tx.setInTx, s.tx.setsBefore = false, nil
	tag := new(string)
	s.x.steps[len(s.x.steps)-1].tag = tag
	s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
		if *tag != "COMMIT" {
			s.settings.restore(before)
			be.Settings = unknownSettings
		}
	}})
}

// undoTxSets restores the session's settings after a transaction that
// rolled back. The backends that held it are back at whatever settings they
// had before it, which the proxy did not track, so each replays the
// session's settings on its next use.
func (s *session) undoTxSets(conns []*pgshard.Conn) {
	if !s.tx.setInTx {
		return
	}
	s.settings.restore(s.tx.setsBefore)
	s.tx.setInTx, s.tx.setsBefore = false, nil
	for _, be := range conns {
		be.Settings = unknownSettings
	}
}

// forwardTx sends a transaction statement to be, which holds (part of) the
// transaction; the status in its ReadyForQuery tells finish whether the
// transaction ended. hide keeps its responses from the client.
func (s *session) forwardTx(be *pgshard.Conn, sql string, hide bool) {
	if hide {
		s.hiddenSQL(be, sql)
		return
	}
	if s.simple {
		be.Send(&pgproto3.Query{String: sql})
		s.x.add(step{kind: stepQuery, be: be})
		return
	}
	be.Send(&pgproto3.Parse{Query: sql})
	be.Send(&pgproto3.Bind{})
	be.Send(&pgproto3.Execute{})
	s.x.add(step{kind: stepParse, be: be})
	// The client's own Bind was answered when it came.
	s.x.add(step{kind: stepBind, be: be, hide: true})
	s.x.add(step{kind: stepExecute, be: be})
}

// discardAll serves DISCARD ALL: the session's settings, pin, statements,
// portals and LISTENs end.
func (s *session) discardAll() {
	if s.tx.active {
		s.fail(sqlstate.New(sqlstate.ActiveSQLTransaction, "DISCARD ALL cannot run inside a transaction block"))
		return
	}
	s.settings.reset()
	s.discardPin()
	s.stmts = map[string]*clientStmt{}
	s.portals = map[string]*clientPortal{}
	clear(s.cursors)
	// DISCARD ALL includes UNLISTEN *.
	s.x.add(step{kind: stepSynthetic, then: func(*exchange) { s.dropListener() }})
	s.x.synthetic(commandComplete("DISCARD ALL"))
}

// sessionSet serves SET and RESET. It runs on a backend so that PostgreSQL
// validates it, then becomes part of the session's settings replayed on
// every backend the session uses.
func (s *session) sessionSet(ctx context.Context, p *router.Plan) {
	node := s.srv.catalogNode
	if len(s.tx.conns) > 0 {
		node = s.tx.conns[0].Node
	}
	be, err := s.backend(ctx, node)
	if err != nil {
		s.fail(err)
		return
	}
	s.forwardTx(be, p.SQL, false)
	// Recorded only once PostgreSQL accepted it.
	s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
		if !x.failed[be] {
			s.recordSet(be, p.SQL, s.tx.active)
		}
	}})
}

func literalPtr(v router.Value) *string {
	if v.Null {
		return nil
	}
	t := v.Text
	return &t
}

// repinReady lets lattice_reshard's empty-tree re-pin get this proxy's
// acknowledgement of the map it freezes: the views this session holds
// would hold it back past the re-pin's budget, and the tree would read as
// not empty. What the round queued before the call is played first (an
// extended batch), so no statement planned on those views runs after
// them; false when that failed (the error is queued).
func (s *session) repinReady() bool {
	if len(s.x.steps) > 0 && !s.simple {
		if err := s.flushBatch(); err != nil {
			s.fail(err)
			return false
		}
		if s.skipping {
			return false
		}
	}
	if len(s.x.steps) == 0 {
		s.releaseViews()
	}
	return true
}

// callFunction runs a lattice_* function and queues its result; in the
// simple protocol its RowDescription comes first.
func (s *session) callFunction(ctx context.Context, f *router.FuncCall, args []*string, named map[string]*string, resultFmt []int16) {
	if s.srv.functions == nil {
		s.fail(sqlstate.New(sqlstate.UndefinedFunction, "function %s does not exist", f.Name))
		return
	}
	fields, err := s.srv.functions.Describe(f.Name)
	if err == nil {
		err = s.functionGuard(f.Name)
	}
	if err != nil {
		s.fail(err)
		return
	}
	if f.Name == "lattice_reshard" && !s.repinReady() {
		return
	}
	rows, err := s.srv.functions.Call(ctx, s.tenant, f.Name, args, named)
	if err != nil {
		s.fail(err)
		return
	}
	fields = resultFields(fields, resultFmt)
	enc, err := encodeRows(fields, rows)
	if err != nil {
		s.fail(sqlstate.New(sqlstate.InternalError, "%v", err))
		return
	}
	var msgs []pgproto3.BackendMessage
	if s.simple {
		msgs = append(msgs, &pgproto3.RowDescription{Fields: fields})
	}
	for _, r := range enc {
		msgs = append(msgs, &pgproto3.DataRow{Values: r})
	}
	msgs = append(msgs, commandComplete("SELECT "+strconv.Itoa(len(enc))))
	s.x.synthetic(msgs...)
}

// alone says, for the multi-statement error, why a statement of kind k
// runs only as a query string of its own: the proxy runs it its own way,
// not as one node's part of a shared string.
func alone(k router.Kind) string {
	switch k {
	case router.FanOut:
		return "it reads several shards"
	case router.WriteAll:
		return "it writes to several shards"
	case router.InsertSplit:
		return "its rows go to several shards"
	case router.Function:
		return "it calls a Lattice function"
	case router.DDL:
		return "it changes every shard of a tree"
	case router.Copy:
		return "it copies rows of a tree"
	case router.RefWrite:
		return "it writes a reference table on every node"
	case router.Explain:
		return "it explains a statement over trees"
	case router.Discard:
		return "it discards the session's state"
	default:
		return "the proxy runs it on its own"
	}
}
