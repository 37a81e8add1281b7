package proxy

import (
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
)

// A simple-protocol statement on one shard whose plan has a prepared form
// (router.Prepared: its constants as parameters of their literals' types)
// runs as that statement, prepared once per backend and shape: Parse when
// the backend lacks it, then Bind, Describe, Execute and Sync. PostgreSQL
// parses and plans a Query's text every time; the prepared statement is
// parsed once and planned as any client's prepared statement is.
//
// The client sees what a Query gives: ParseComplete, BindComplete and
// NoData are swallowed, and the RowDescription is held until the first row
// or the command's end, where a Query's comes, so that a statement failing
// with LT001 (its slot moved) before it can still be routed again unseen.
// A statement whose result columns changed under its backend statement
// (DDL through another proxy: "cached plan must not change result type")
// is run again outside a transaction block, prepared anew; inside one the
// error reaches the client, as it would reach an extended-protocol client.

// asPrepared is the prepared form st's plan runs as, or nil. An extended-protocol
// statement whose values are literals (a driver's statement without
// parameters: JDBC's Statement, Npgsql's unparameterized command) runs so
// too, its result formats the client's: it shares one backend statement
// per shard with the others of its shape instead of one per text.
// A client's Bind with parameters, or a Parse that declared some, keeps
// the statement's own path, where PostgreSQL checks them against it.
func (s *session) asPrepared(st *clientStmt, m *pgproto3.Bind) *router.Prepared {
	p := st.plan
	if p.Prepared == nil || s.srv.cfg.SimpleAsText || !s.simple && (len(m.Parameters) > 0 || len(st.oids) > 0) {
		return nil
	}
	return p.Prepared
}

// queryPrepared sends part's statement prepared. retry marks it to be
// routed again after LT001 or a changed result type.
func (s *session) queryPrepared(part portalPart, retry bool) {
	be, pr := part.be, part.prepared
	name := s.prepareOn(be, part.sql, pr.OIDs, pgshard.ResultEpoch())
	s.out.sendBindText(be, name, pr.Values, "", nil)
	s.x.add(step{kind: stepBind, be: be, hide: true, staleRetry: retry})
	s.out.sendDescribe(be, 'P', "")
	s.x.add(step{kind: stepDescribePortal, be: be, hide: true, leadTo: len(s.x.steps) + 1})
	s.out.sendExecute(be, "", 0)
	s.x.add(step{kind: stepExecute, be: be, staleRetry: retry, load: part.load})
	be.Send(syncMsg)
	s.x.add(step{kind: stepSync, be: be})
}

var syncMsg = &pgproto3.Sync{}

// holdRowDescription keeps a copy of rd as the lead of step i: the
// backend's message is reused by its next Receive.
func (s *session) holdRowDescription(x *exchange, i int, rd *pgproto3.RowDescription) {
	s.heldDesc.Fields = s.heldDesc.Fields[:0]
	n := 0
	for _, f := range rd.Fields {
		n += len(f.Name)
	}
	if cap(s.heldNames) < n {
		s.heldNames = make([]byte, 0, n)
	}
	names := s.heldNames[:0]
	for _, f := range rd.Fields {
		at := len(names)
		names = append(names, f.Name...)
		f.Name = names[at:len(names):len(names)]
		s.heldDesc.Fields = append(s.heldDesc.Fields, f)
	}
	s.heldLead[0] = &s.heldDesc
	x.steps[i].lead = s.heldLead[:]
}
