package proxy

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// Transactions over several nodes.
//
// A session's transaction is held by one backend per node it touched
// (session.tx.conns), each started with the client's BEGIN replayed as
// written. Statements that write on several nodes (an UPDATE or DELETE
// without the shard key, a multi-row INSERT whose rows span nodes, and
// likewise COPY or DDL split by shard) use this API:
//
//   - spanNodes(n) before taking backends for a statement over n
//     nodes: outside a transaction block and with n > 1 it starts an
//     implicit transaction, so that the statement is atomic.
//   - backend(ctx, node) then returns the node's participant, joining the
//     node to the transaction (BEGIN queued as a hidden step) when it is new.
//   - endImplicit(ctx, ok) ends an implicit transaction with one call:
//     commit (two-phase over several nodes) when ok, else roll back.
//     simpleQuery and sync call it before ReadyForQuery, which is where
//     PostgreSQL ends its own implicit transactions.
//
// COMMIT of a transaction over several nodes is a two-phase commit
// (TwoPhase.commit); ROLLBACK, an error or a client that disconnects rolls
// back on every node.

// spanNodes starts an implicit transaction for a statement over n nodes
// when no transaction is open.
func (s *session) spanNodes(n int) {
	if n < 2 || s.tx.active {
		return
	}
	s.tx.active, s.tx.implicit, s.tx.failed = true, true, false
	s.tx.begin, s.tx.savepoints = "BEGIN", nil
	// Backends this extended batch already used run in PostgreSQL's own
	// implicit transaction: BEGIN turns it into a block that keeps what
	// they ran, so it commits or rolls back with the rest.
	for _, be := range s.used {
		s.hiddenSQL(be, "BEGIN")
		s.tx.conns = append(s.tx.conns, be)
	}
	s.used = s.used[:0]
}

// endImplicit ends the implicit transaction, if one is open: it commits
// when ok and no participant failed, and rolls back otherwise. The error is
// the commit's, for the client.
func (s *session) endImplicit(ctx context.Context, ok bool) *sqlstate.Error {
	if !s.tx.implicit {
		return nil
	}
	if !ok || s.txStatus() == 'E' {
		s.rollbackConns(ctx)
		return nil
	}
	return sqlstate.As(s.commitConns(ctx))
}

// txOnBackends serves COMMIT, ROLLBACK and savepoints once backends hold
// the transaction.
func (s *session) txOnBackends(ctx context.Context, p *router.Plan) {
	conns := s.tx.conns
	switch p.Tx {
	case router.Commit:
		s.tx.implicit = false
		if len(conns) == 1 && !s.tx.failed {
			s.forwardTx(conns[0], p.SQL, false)
			s.afterTxEnd(conns[0])
			s.leaveTx()
			return
		}
		s.commitMulti(ctx)
	case router.Rollback:
		for i, be := range conns {
			s.forwardTx(be, "ROLLBACK", i > 0)
		}
		s.undoTxSets(conns)
		s.leaveTx()
	default:
		if s.tx.implicit {
			// The proxy's BEGIN made the nodes' transaction a block; the
			// client's is PostgreSQL's implicit one, which has none.
			s.fail(notInBlock(p))
			return
		}
		// Every node holds the savepoints (savepoint.go). One that failed
		// would answer SAVEPOINT or RELEASE with 25P02 while the others
		// went on, so the proxy answers for them all.
		if p.Tx != router.RollbackTo && s.txStatus() == 'E' {
			s.fail(errAbortedTx)
			return
		}
		// An unknown name: each node answers 3B001, and the client sees
		// the first.
		known := s.applySavepoint(p)
		for i, be := range conns {
			s.forwardTx(be, p.SQL, i > 0)
			if known && p.Tx == router.RollbackTo {
				// It brings a failed part back: what the batch queues
				// after it goes where it would once it has run, not to
				// the 25P02 of the status read before it.
				be.TxStatus = 'T'
			}
		}
	}
}

// leaveTx is called once COMMIT or ROLLBACK is queued on every backend of
// the transaction: what follows in the same batch runs outside it, as in
// PostgreSQL. The backends stay in this exchange; finish returns them to
// the pool, or keeps one whose COMMIT was skipped after an error (its
// ReadyForQuery still says 'E').
func (s *session) leaveTx() {
	s.used = append(s.used, s.tx.conns...)
	s.tx.conns = nil
	s.resetTx()
}

func nodeList(conns []*pgshard.Conn) string {
	out := ""
	for i, be := range conns {
		if i > 0 {
			out += ", "
		}
		out += be.Node
	}
	return "nodes " + out
}

// commitMulti serves COMMIT of a transaction over several nodes (or one
// that lost a participant). It first plays what the batch queued so far,
// so that it talks to idle backends.
func (s *session) commitMulti(ctx context.Context) {
	if !s.settle() {
		// An error earlier in the batch: PostgreSQL skips COMMIT until Sync.
		s.skipping = !s.simple
		return
	}
	if s.txStatus() == 'E' {
		s.rollbackConns(ctx)
		s.x.synthetic(commandComplete("ROLLBACK"))
		return
	}
	conns := slices.Clone(s.tx.conns)
	if err := s.commitConns(ctx); err != nil {
		s.undoTxSets(conns)
		s.x.synthetic(sqlstate.As(err).Response())
		s.skipping = !s.simple
		return
	}
	s.tx.setInTx, s.tx.setsBefore = false, nil
	s.x.synthetic(commandComplete("COMMIT"))
}

// settle plays the steps queued so far (with a Sync for every backend of an
// extended batch), leaving each backend idle. It reports false when an error
// reached the client or the client is gone.
func (s *session) settle() bool {
	if !s.simple {
		// What is played now is over before Sync: no statement of it is
		// routed again then.
		s.keepRetry(func(step) bool { return false })
		for _, be := range s.backends() {
			if s.inBatch(be) {
				be.Send(&pgproto3.Sync{})
				s.x.add(step{kind: stepSync, be: be})
			}
		}
	}
	s.sendBackends()
	if err := s.play(&s.x); err != nil {
		// Responses may be left unread: no backend can be trusted.
		for _, be := range s.backends() {
			be.MarkBroken()
		}
		s.tx.failed = true
		return false
	}
	s.x.steps = s.x.steps[:0]
	clear(s.x.sentSinceSync)
	return !s.x.errored
}

// commitConns commits the session's transaction: a plain COMMIT on one
// node, two-phase commit on several. Either way the transaction is over and
// its backends go back to the pool.
func (s *session) commitConns(ctx context.Context) error {
	conns := s.tx.conns
	defer s.releaseTx()
	switch {
	case len(conns) == 0:
		return nil
	case len(conns) == 1:
		return execAll(ctx, conns, "COMMIT")[0]
	case s.srv.twoPhase == nil:
		execAll(ctx, conns, "ROLLBACK")
		return sqlstate.New(sqlstate.FeatureNotSupported, "this transaction spans %s, and this proxy has no two-phase commit coordinator", nodeList(conns))
	}
	return s.srv.twoPhase.commit(ctx, s.tenant, conns)
}

// rollbackConns rolls the transaction back on every backend holding it.
func (s *session) rollbackConns(ctx context.Context) {
	s.undoTxSets(s.tx.conns)
	execAll(ctx, s.tx.conns, "ROLLBACK")
	s.releaseTx()
}

// releaseTx returns the transaction's backends to the pool (closing any
// not idle) and forgets the transaction.
func (s *session) releaseTx() {
	for _, be := range s.tx.conns {
		if be.TxStatus != 'I' {
			be.MarkBroken()
		}
		s.putBack(be)
	}
	s.tx.conns = nil
	s.resetTx()
}

// hiddenSQL queues a parameterless statement on be whose responses other
// than errors stay in the proxy.
func (s *session) hiddenSQL(be *pgshard.Conn, sql string) {
	if s.simple {
		be.Send(&pgproto3.Query{String: sql})
		s.x.add(step{kind: stepHiddenQuery, be: be})
		return
	}
	be.Send(&pgproto3.Parse{Query: sql})
	be.Send(&pgproto3.Bind{})
	be.Send(&pgproto3.Execute{})
	s.x.add(step{kind: stepParse, be: be})
	s.x.add(step{kind: stepBind, be: be, hide: true})
	s.x.add(step{kind: stepExecute, be: be, hide: true})
}

// execAll runs sql as a simple Query on every backend at once (one round
// trip) and waits for each ReadyForQuery. errs[i] is backend i's error; a
// backend that failed at the I/O level is marked broken. The backends must
// be idle: nothing else may be queued or unread on them.
func execAll(ctx context.Context, conns []*pgshard.Conn, sql string) (errs []error) {
	sqls := make([]string, len(conns))
	for i := range sqls {
		sqls[i] = sql
	}
	_, errs = execEach(ctx, conns, sqls)
	return errs
}

// execEach is execAll with a statement of its own for each backend; it
// also returns each backend's last command tag.
func execEach(ctx context.Context, conns []*pgshard.Conn, sqls []string) (tags []string, errs []error) {
	tags, errs = make([]string, len(conns)), make([]error, len(conns))
	for _, be := range conns {
		defer interruptOnCancel(ctx, be)()
	}
	for i, be := range conns {
		be.Send(&pgproto3.Query{String: sqls[i]})
		if err := be.Flush(); err != nil {
			be.MarkBroken()
			errs[i] = sqlstate.New(sqlstate.ConnectionFailure, "lost connection to node %s: %v", be.Node, err)
		}
	}
	for i, be := range conns {
		if errs[i] == nil {
			errs[i] = readResult(be, &tags[i], nil)
		}
	}
	return tags, errs
}

// interruptOnCancel makes cancelling ctx interrupt be's reads and writes
// through its deadline; the returned func ends that.
func interruptOnCancel(ctx context.Context, be *pgshard.Conn) (stop func()) {
	after := context.AfterFunc(ctx, func() { _ = be.SetDeadline(time.Now()) })
	return func() {
		if after() {
			_ = be.SetDeadline(time.Time{})
		}
	}
}

// queryRow runs sql as a simple Query on be and returns its last row.
func queryRow(ctx context.Context, be *pgshard.Conn, sql string) ([][]byte, error) {
	defer interruptOnCancel(ctx, be)()
	be.Send(&pgproto3.Query{String: sql})
	if err := be.Flush(); err != nil {
		be.MarkBroken()
		return nil, backendLost(be, err)
	}
	var tag string
	var row [][]byte
	err := readResult(be, &tag, &row)
	return row, err
}

// readResult reads a simple Query's responses up to ReadyForQuery, keeps
// the last command tag in tag (and, when row is not nil, a copy of the
// last row in row), and returns the first error the backend reported.
func readResult(be *pgshard.Conn, tag *string, row *[][]byte) error {
	var first error
	for {
		msg, err := be.Receive()
		if err != nil {
			be.MarkBroken()
			return backendLost(be, err)
		}
		switch m := msg.(type) {
		case *pgproto3.CommandComplete:
			*tag = string(m.CommandTag)
		case *pgproto3.DataRow:
			if row != nil {
				// The message's buffer is the connection's, reused.
				*row = make([][]byte, len(m.Values))
				for i, v := range m.Values {
					(*row)[i] = slices.Clone(v)
				}
			}
		case *pgproto3.ErrorResponse:
			if first == nil {
				first = fmt.Errorf("node %s: %w", be.Node, pgconn.ErrorResponseToPgError(m))
			}
		case *pgproto3.ParameterStatus:
		case *pgproto3.ReadyForQuery:
			return first
		}
	}
}
