package proxy

import (
	"context"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
)

// simpleQuery serves one Query message. A statement rejected by a shard with
// LT001 (its slot moved) is routed again on a fresh map, invisibly to the client.
func (s *session) simpleQuery(ctx context.Context, sql string) error {
	for attempt := 0; ; attempt++ {
		s.x.reset()
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
	s.x.reset()
	s.finish()
	s.send(&pgproto3.ReadyForQuery{TxStatus: s.txStatus()})
	return s.flush()
}

func (s *session) runQuery(ctx context.Context, sql string, allowRetry bool) {
	plans, v, err := s.plan(ctx, sql)
	if err != nil {
		s.fail(err, false)
		return
	}
	switch len(plans) {
	case 0:
		s.x.synthetic(&pgproto3.EmptyQueryResponse{})
	case 1:
		s.simpleOne(ctx, v, plans[0], allowRetry)
	default:
		s.simpleMulti(ctx, v, plans)
	}
}

// abortedTx reports the 25P02 PostgreSQL gives for statements in a failed
// transaction, when the proxy itself holds that transaction.
func (s *session) abortedTx(p *router.Plan) bool {
	if s.pinned != nil || !s.tx.failed {
		return false
	}
	if p.Kind == router.Transaction && (p.Tx == router.Commit || p.Tx == router.Rollback || p.Tx == router.RollbackTo) {
		return false
	}
	return true
}

var errAbortedTx = Errorf("25P02", "current transaction is aborted, commands ignored until end of transaction block")

func (s *session) simpleOne(ctx context.Context, v *shardmap.View, p *router.Plan, allowRetry bool) {
	if s.abortedTx(p) {
		s.x.synthetic(errAbortedTx.Response())
		return
	}
	switch p.Kind {
	case router.Refused:
		s.fail(p.Err, false)
	case router.Transaction:
		s.txControl(ctx, p, false)
	case router.SessionSet, router.Discard:
		s.sessionCommand(ctx, p, false)
	case router.Function:
		args, named := literalArgs(p.Func)
		s.callFunction(ctx, p.Func, args, named, nil, true)
	case router.Catalog, router.LocalSet:
		if err := s.catalogGuard(p); err != nil {
			s.fail(err, false)
			return
		}
		s.forwardQuery(ctx, s.catalogTarget(p), p.SQL, false)
	case router.Single:
		sh, err := s.route(v, p, p.Key, nil, nil)
		if err != nil {
			s.fail(err, false)
			return
		}
		s.forwardQuery(ctx, sh.Node, p.Render(shardmap.SchemaName(sh.Index)), allowRetry && !s.tx.active)
	case router.InsertSplit:
		s.simpleInsertSplit(ctx, v, p, allowRetry)
	case router.FanOut:
		s.startFanOut(ctx, v, p, nil, nil)
	case router.Copy:
		s.startCopy(ctx, v, p, false)
	default:
		s.fail(Errorf("XX000", "unhandled plan kind %v", p.Kind), false)
	}
}

func (s *session) forwardQuery(ctx context.Context, node, sql string, staleRetry bool) {
	be, err := s.backend(ctx, node)
	if err != nil {
		s.fail(err, false)
		return
	}
	be.Frontend.Send(&pgproto3.Query{String: sql})
	s.x.add(step{kind: stepQuery, be: be, staleRetry: staleRetry})
}

// simpleInsertSplit runs a multi-row INSERT as one statement per shard. All
// parts go to one node as one multi-statement Query, which PostgreSQL runs
// as one implicit transaction, so the INSERT stays atomic.
func (s *session) simpleInsertSplit(ctx context.Context, v *shardmap.View, p *router.Plan, allowRetry bool) {
	shards, rows, err := s.splitRows(v, p, nil, nil)
	if err != nil {
		s.fail(err, false)
		return
	}
	node := shards[0].Node
	parts := make([]string, len(shards))
	for i, sh := range shards {
		if sh.Node != node {
			s.fail(crossNodeInsert(), false)
			return
		}
		parts[i], _ = p.RenderRows(shardmap.SchemaName(sh.Index), rows[i])
	}
	if len(parts) == 1 {
		s.forwardQuery(ctx, node, parts[0], allowRetry && !s.tx.active)
		return
	}
	be, err := s.backend(ctx, node)
	if err != nil {
		s.fail(err, false)
		return
	}
	be.Frontend.Send(&pgproto3.Query{String: strings.Join(parts, ";\n")})
	sp := &splitState{}
	s.x.add(step{kind: stepQuery, be: be, rowsOnly: true, counter: &sp.count})
	// The summed tag is known only once the parts ran.
	s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
		if !x.errored {
			s.send(insertTag(sp.count))
		}
	}})
}

func crossNodeInsert() *Error {
	e := Errorf("0A000", "the rows of this INSERT belong to shards on more than one node")
	e.Hint = "insert the rows in separate statements, grouped by node; atomic writes across nodes are not supported yet"
	return e
}

// simpleMulti runs a Query holding several statements. It is forwarded as one
// Query, so PostgreSQL keeps its implicit-transaction semantics, when every
// statement goes to one node; otherwise it is refused.
func (s *session) simpleMulti(ctx context.Context, v *shardmap.View, plans []*router.Plan) {
	node := ""
	parts := make([]string, 0, len(plans))
	for _, p := range plans {
		var n, sql string
		switch p.Kind {
		case router.Catalog, router.LocalSet, router.Transaction:
			if err := s.catalogGuard(p); err != nil {
				s.fail(err, false)
				return
			}
			sql = p.SQL
			if p.Kind == router.Catalog && !p.Anywhere {
				n = s.srv.catalogNode
			}
		case router.Single:
			sh, err := s.route(v, p, p.Key, nil, nil)
			if err != nil {
				s.fail(err, false)
				return
			}
			n, sql = sh.Node, p.Render(shardmap.SchemaName(sh.Index))
		case router.Refused:
			s.fail(p.Err, false)
			return
		default:
			e := Errorf("0A000", "%s cannot be combined with other statements in one query string", p.Kind)
			e.Hint = "send it as a query of its own"
			s.fail(e, false)
			return
		}
		if n != "" {
			if node != "" && node != n {
				e := Errorf("0A000", "the statements of this query string need more than one node")
				e.Hint = "send them as separate queries"
				s.fail(e, false)
				return
			}
			node = n
		}
		parts = append(parts, sql)
	}
	if node == "" {
		node = s.catalogTarget(&router.Plan{Anywhere: true})
	}
	s.forwardQuery(ctx, node, strings.Join(parts, ";\n"), false)
}

// catalogGuard refuses statements whose effect would be stranded on one
// pooled backend: SQL-level prepared statements and the like.
func (s *session) catalogGuard(p *router.Plan) error {
	switch firstWord(p.SQL) {
	case "PREPARE", "EXECUTE":
		e := Errorf("0A000", "SQL-level PREPARE and EXECUTE are not supported through the Lattice proxy")
		e.Hint = "use the extended query protocol (your driver's prepared statements), which works across pooled backends"
		return e
	case "LISTEN", "UNLISTEN":
		e := Errorf("0A000", "LISTEN is not supported yet through the Lattice proxy")
		return e
	}
	return nil
}

// txControl serves BEGIN, COMMIT, ROLLBACK and savepoints. BEGIN takes no
// backend: the first statement that needs one decides which node holds the
// transaction, and BEGIN is replayed there.
func (s *session) txControl(ctx context.Context, p *router.Plan, extended bool) {
	if s.pinned != nil {
		if p.Tx == router.Begin {
			s.x.synthetic(&pgproto3.NoticeResponse{Severity: "WARNING", Code: "25001", Message: "there is already a transaction in progress"}, commandComplete("BEGIN"))
			return
		}
		s.forwardTx(p.SQL, extended)
		return
	}
	switch p.Tx {
	case router.Begin:
		if s.tx.active {
			s.x.synthetic(&pgproto3.NoticeResponse{Severity: "WARNING", Code: "25001", Message: "there is already a transaction in progress"}, commandComplete("BEGIN"))
			return
		}
		s.tx.active, s.tx.failed, s.tx.deferred = true, false, nil
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
			s.x.synthetic(&pgproto3.NoticeResponse{Severity: "WARNING", Code: "25P01", Message: "there is no transaction in progress"}, commandComplete(tag))
			return
		}
		s.tx.active, s.tx.failed, s.tx.deferred = false, false, nil
		s.x.synthetic(commandComplete(tag))
	case router.Savepoint, router.Release, router.RollbackTo:
		if !s.tx.active {
			s.fail(Errorf("25P01", "%s can only be used in transaction blocks", strings.ToUpper(firstWord(p.SQL))), extended)
			return
		}
		if p.Tx == router.RollbackTo && s.tx.failed {
			s.tx.failed = false
		}
		s.tx.deferred = append(s.tx.deferred, p.SQL)
		s.x.synthetic(commandComplete(savepointTag(p.Tx)))
	default:
		s.fail(Errorf("0A000", "%s is not supported through the Lattice proxy", firstWord(p.SQL)), extended)
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

// forwardTx sends a transaction statement to the backend holding the
// transaction; the status in its ReadyForQuery tells finish whether the
// transaction ended.
func (s *session) forwardTx(sql string, extended bool) {
	be := s.pinned
	if !extended {
		be.Frontend.Send(&pgproto3.Query{String: sql})
		s.x.add(step{kind: stepQuery, be: be})
		return
	}
	s.forwardExtendedSQL(be, sql)
}

// sessionCommand serves SET, RESET and DISCARD ALL. SET runs on a backend so
// that PostgreSQL validates it, then becomes part of the session's settings
// replayed on every backend the session uses.
func (s *session) sessionCommand(ctx context.Context, p *router.Plan, extended bool) {
	if p.Kind == router.Discard {
		if s.tx.active || s.pinned != nil {
			s.fail(Errorf("25001", "DISCARD ALL cannot run inside a transaction block"), extended)
			return
		}
		s.settings.reset()
		s.stmts = map[string]*clientStmt{}
		s.portals = map[string]*clientPortal{}
		s.x.synthetic(commandComplete("DISCARD ALL"))
		return
	}
	node := s.srv.catalogNode
	if s.pinned != nil {
		node = s.pinned.Node
	}
	be, err := s.backend(ctx, node)
	if err != nil {
		s.fail(err, extended)
		return
	}
	if extended {
		s.forwardExtendedSQL(be, p.SQL)
	} else {
		be.Frontend.Send(&pgproto3.Query{String: p.SQL})
		s.x.add(step{kind: stepQuery, be: be})
	}
	// Recorded only once PostgreSQL accepted it.
	s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
		if !x.failed[be] {
			s.settings.apply(p.SQL)
			be.Settings = s.settings.fp
		}
	}})
}

// forwardExtendedSQL runs a parameterless statement on be with the extended
// protocol inside an extended batch.
func (s *session) forwardExtendedSQL(be *pgshard.Conn, sql string) {
	be.Frontend.Send(&pgproto3.Parse{Query: sql})
	be.Frontend.Send(&pgproto3.Bind{})
	be.Frontend.Send(&pgproto3.Execute{})
	s.x.add(step{kind: stepParse, be: be})
	s.x.add(step{kind: stepBind, be: be})
	s.x.add(step{kind: stepExecute, be: be})
}

func literalArgs(f *router.FuncCall) ([]*string, map[string]*string) {
	args := make([]*string, len(f.Args))
	for i, a := range f.Args {
		args[i] = literalPtr(a)
	}
	var named map[string]*string
	if len(f.Named) > 0 {
		named = make(map[string]*string, len(f.Named))
		for k, a := range f.Named {
			named[k] = literalPtr(a)
		}
	}
	return args, named
}

func literalPtr(v router.Value) *string {
	if v.Null {
		return nil
	}
	t := v.Text
	return &t
}

// callFunction runs a lattice_* function and queues its result. With
// withDesc the RowDescription is sent first (simple protocol).
func (s *session) callFunction(ctx context.Context, f *router.FuncCall, args []*string, named map[string]*string, resultFmt []int16, withDesc bool) {
	if s.srv.functions == nil {
		s.fail(Errorf("42883", "function %s does not exist", f.Name), !withDesc)
		return
	}
	fields, err := s.srv.functions.Describe(f.Name)
	if err != nil {
		s.fail(err, !withDesc)
		return
	}
	rows, err := s.srv.functions.Call(ctx, s.tenant, f.Name, args, named)
	if err != nil {
		s.fail(err, !withDesc)
		return
	}
	fields = resultFields(fields, resultFmt)
	enc, err := encodeRows(fields, rows)
	if err != nil {
		s.fail(Errorf("XX000", "%v", err), !withDesc)
		return
	}
	var msgs []pgproto3.BackendMessage
	if withDesc {
		msgs = append(msgs, &pgproto3.RowDescription{Fields: fields})
	}
	for _, r := range enc {
		msgs = append(msgs, &pgproto3.DataRow{Values: r})
	}
	msgs = append(msgs, commandComplete("SELECT "+strconv.Itoa(len(enc))))
	s.x.synthetic(msgs...)
}
