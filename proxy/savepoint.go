package proxy

import (
	"slices"
	"strings"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// savepoint is one the session's transaction holds. Every node of the
// transaction holds it too: one that joins later makes it again in its
// place among the transaction's SET LOCALs (txPrologue), so that ROLLBACK
// TO undoes on each node what ran there after it, and RELEASE and ROLLBACK
// TO are sent to every node.
type savepoint struct {
	name  string
	local int       // how many of tx.local were made before it
	sets  []setting // the session's SETs when it was made
}

// applySavepoint records SAVEPOINT, RELEASE or ROLLBACK TO; false when
// there is no savepoint of that name to release or roll back to.
func (s *session) applySavepoint(p *router.Plan) bool {
	if p.Tx == router.Savepoint {
		s.tx.savepoints = append(s.tx.savepoints, savepoint{name: p.Savepoint, local: len(s.tx.local), sets: slices.Clone(s.settings.set)})
		return true
	}
	// As in PostgreSQL, the latest savepoint of the name.
	i := len(s.tx.savepoints) - 1
	for i >= 0 && s.tx.savepoints[i].name != p.Savepoint {
		i--
	}
	if i < 0 {
		return false
	}
	s.savepointCursors(p.Tx, i)
	if p.Tx == router.Release {
		s.tx.savepoints = s.tx.savepoints[:i]
		return true
	}
	// ROLLBACK TO keeps the savepoint and undoes the SET LOCALs and SETs
	// made after it.
	sp := s.tx.savepoints[i]
	s.tx.savepoints = s.tx.savepoints[:i+1]
	s.tx.local = s.tx.local[:sp.local]
	if !slices.Equal(s.settings.set, sp.sets) {
		s.settings.restore(slices.Clone(sp.sets))
		for _, be := range s.tx.conns {
			be.Settings = unknownSettings
		}
	}
	return true
}

// notInBlock is PostgreSQL's error for a savepoint outside a transaction
// block.
func notInBlock(p *router.Plan) *sqlstate.Error {
	return sqlstate.New(sqlstate.NoActiveSQLTransaction, "%s can only be used in transaction blocks", strings.ToUpper(firstWord(p.SQL)))
}

// noSavepoint is the error for RELEASE or ROLLBACK TO an unknown savepoint.
func noSavepoint(p *router.Plan) *sqlstate.Error {
	return sqlstate.New(sqlstate.InvalidSavepointSpecification, "savepoint %q does not exist", p.Savepoint)
}

// txPrologue is what a node joining the transaction runs first: BEGIN,
// then the SET LOCALs and savepoints in the order they were made.
func (s *session) txPrologue() string {
	stmts := []string{s.tx.begin}
	done := 0
	for _, sp := range s.tx.savepoints {
		stmts = append(stmts, s.tx.local[done:sp.local]...)
		stmts = append(stmts, "SAVEPOINT "+quoteIdent(sp.name))
		done = sp.local
	}
	stmts = append(stmts, s.tx.local[done:]...)
	return strings.Join(stmts, "; ")
}

// txContext is what a backend outside the transaction runs to evaluate an
// expression as the transaction block would (the final step of an
// aggregate, aggregate.go): BEGIN with the block's options, then its SET
// LOCALs, without the savepoints, which nothing there rolls back to. It is
// "" outside a block. The caller ends that transaction.
func (s *session) txContext() string {
	if !s.tx.active || s.tx.begin == "" {
		return ""
	}
	return joinStatements(append([]string{s.tx.begin}, s.tx.local...)...)
}

// joinStatements joins statements into one simple query, skipping empty ones.
func joinStatements(stmts ...string) string {
	return strings.Join(slices.DeleteFunc(slices.Clone(stmts), func(q string) bool { return q == "" }), "; ")
}
