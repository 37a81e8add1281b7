package proxy

import (
	"context"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// The fastpath function call (the FunctionCall message) is how libpq's lo_*
// functions, psql's \lo_import and \lo_export, pg_dump and JDBC's
// LargeObjectManager reach large objects. Large objects live in the catalog
// node's database, so a call goes there, inside the session's transaction
// as a statement for that node would: a descriptor lo_open returns stays
// valid until that transaction ends, as in PostgreSQL, and a transaction
// over several nodes commits the large object's writes with the rest.
//
// Only the large-object functions pass. Any other function could leave
// session state on a pooled backend out of the router's sight (a setting by
// set_config, an advisory lock), so it is refused, with its SQL form as the
// hint.

// largeObjectFunctions are the functions libpq calls by fastpath, by their
// OIDs in PostgreSQL's catalog (pg_proc.dat), which are the same in every
// database of a major version; libpq looks them up by name at its first
// large-object call and gets these.
var largeObjectFunctions = map[uint32]string{
	715:  "lo_create",
	952:  "lo_open",
	953:  "lo_close",
	954:  "loread",
	955:  "lowrite",
	956:  "lo_lseek",
	957:  "lo_creat",
	958:  "lo_tell",
	964:  "lo_unlink",
	1004: "lo_truncate",
	3170: "lo_lseek64",
	3171: "lo_tell64",
	3172: "lo_truncate64",
}

// functionCall serves a FunctionCall message: one call on the catalog
// node, answered with the node's FunctionCallResponse and the session's
// ReadyForQuery.
func (s *session) functionCall(ctx context.Context, m *pgproto3.FunctionCall) error {
	s.simple = true
	defer func() { s.simple = false }()
	s.qkind = kindFastpath
	s.x.reset()
	switch {
	case largeObjectFunctions[m.Function] == "":
		e := sqlstate.New(sqlstate.FeatureNotSupported, "fastpath function call of function OID %d is not supported through the Lattice proxy: only the large-object functions (lo_open, loread, lowrite and the rest of libpq's lo_* calls) are", m.Function)
		e.Hint = "call the function in a statement: SELECT f(...)"
		s.fail(e)
	case s.txStatus() == 'E':
		s.fail(errAbortedTx)
	default:
		be, err := s.backend(ctx, s.srv.catalogNode)
		if err != nil {
			s.fail(err)
			break
		}
		be.Send(m)
		// A step of the simple protocol: the node answers up to its
		// ReadyForQuery, and the proxy sends its own.
		s.x.add(step{kind: stepQuery, be: be})
	}
	s.sendBackends()
	if err := s.play(&s.x); err != nil {
		return err
	}
	return s.endQuery(ctx)
}
