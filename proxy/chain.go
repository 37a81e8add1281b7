package proxy

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// txChain serves COMMIT AND CHAIN and ROLLBACK AND CHAIN: the transaction
// ends as COMMIT or ROLLBACK ends it, and a new one with the same
// characteristics (BEGIN's options, then SET TRANSACTION) starts at once on
// every node that held the old one, as PostgreSQL starts it on its one
// backend. Nodes the new transaction touches later join it as usual.
func (s *session) txChain(ctx context.Context, p *router.Plan) {
	what := "COMMIT"
	if p.Tx == router.Rollback {
		what = "ROLLBACK"
	}
	if !s.tx.active || s.tx.implicit {
		s.fail(sqlstate.New(sqlstate.NoActiveSQLTransaction, "%s AND CHAIN can only be used in transaction blocks", what))
		return
	}
	begin, local := s.tx.begin, chainedLocal(s.tx.local)
	conns := s.tx.conns
	rollback := p.Tx == router.Rollback
	switch {
	case len(conns) == 0:
		// Nothing ran on a node yet: only the proxy knows the transaction.
		tag := what
		if s.tx.failed {
			tag, rollback = "ROLLBACK", true
		}
		if s.tx.setInTx {
			if rollback {
				s.settings.restore(s.tx.setsBefore)
			}
			s.tx.setInTx, s.tx.setsBefore = false, nil
		}
		s.x.synthetic(commandComplete(tag))
	case rollback || len(conns) == 1 && !s.tx.failed:
		// Each backend chains by itself; they stay with the session.
		for i, be := range conns {
			s.forwardTx(be, what+" AND CHAIN", i > 0)
		}
		if rollback {
			s.undoTxSets(conns)
		} else {
			// A failed transaction answers ROLLBACK: its SETs are undone.
			s.afterTxEnd(conns[0])
		}
	default:
		nodes := make([]string, len(conns))
		for i, be := range conns {
			nodes[i] = be.Node
		}
		s.commitMulti(ctx)
		if !s.endedTx() {
			return // an error: PostgreSQL starts no new transaction either
		}
		s.chained(begin, local)
		for _, node := range nodes {
			if _, err := s.backend(ctx, node); err != nil {
				s.fail(err)
				return
			}
		}
		return
	}
	s.chained(begin, local)
}

// chained opens the session's new transaction after AND CHAIN.
func (s *session) chained(begin string, local []string) {
	s.tx.active, s.tx.failed, s.tx.implicit = true, false, false
	s.tx.begin, s.tx.local, s.tx.savepoints = begin, local, nil
	// The new transaction's snapshots are taken under today's routing, or
	// a later one; the ended one's view stands in for it, which can only
	// fail a statement that would have passed.
	s.tx.isolation = ""
}

// endedTx reports whether the COMMIT just queued ended the transaction
// with a command tag (COMMIT, or ROLLBACK for a failed one) rather than an
// error.
func (s *session) endedTx() bool {
	n := len(s.x.steps)
	if n == 0 || s.tx.active {
		return false
	}
	st := s.x.steps[n-1]
	if st.kind != stepSynthetic || len(st.msgs) != 1 {
		return false
	}
	_, ok := st.msgs[0].(*pgproto3.CommandComplete)
	return ok
}

// chainedLocal keeps, of a transaction's SET LOCAL, SET TRANSACTION and SET
// CONSTRAINTS statements, those that set its characteristics, which a
// chained transaction inherits: SET TRANSACTION, but not the snapshot it
// imported.
func chainedLocal(local []string) []string {
	var out []string
	for _, stmt := range local {
		w := sqlWords(stmt, 2)
		if len(w) == 2 && strings.EqualFold(w[0], "SET") && strings.EqualFold(w[1], "TRANSACTION") && !importsSnapshot(stmt) {
			out = append(out, stmt)
		}
	}
	return out
}

// importsSnapshot reports SET TRANSACTION SNAPSHOT, whose snapshot exists
// only on the node that exported it.
func importsSnapshot(stmt string) bool {
	w := sqlWords(stmt, 3)
	return len(w) == 3 && strings.EqualFold(w[0], "SET") && strings.EqualFold(w[1], "TRANSACTION") && strings.EqualFold(w[2], "SNAPSHOT")
}
