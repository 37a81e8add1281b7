package proxy

import (
	"context"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
)

// EXPLAIN of a statement over several shards (router.Explain) is one
// statement on one backend: the first node's part, explained there with
// the client's options and parameters. Its result is PostgreSQL's: one
// text column named QUERY PLAN, which Describe reports from the node, and
// the tag EXPLAIN. Lattice's plan of the whole statement goes first, as
// rows the proxy sends before the node's (step.lead).

// bindExplain binds an Explain plan on the node of its first part.
func (s *session) bindExplain(ctx context.Context, v *shardmap.View, portal *clientPortal, m *pgproto3.Bind) bool {
	p := portal.stmt.plan
	q := p.Explain.Query
	if q.Kind == router.FanOut {
		// What the statement itself would refuse is not explained.
		if err := s.uncombinedAggregate(ctx, q); err != nil {
			s.fail(err)
			return false
		}
	}
	oids := portal.stmt.oids
	r, err := router.Resolve(v, p, routerBind(m, oids))
	if err != nil {
		s.fail(err)
		return false
	}
	t := r.Targets[0]
	if !s.simple {
		// The part takes its parameters as the part itself would.
		switch {
		case q.Kind == router.InsertSplit:
			m, oids = splitBind(m, t.Params, oids)
		case q.Kind != router.FanOut || r.Whole:
		case q.Agg != nil:
			oids = queryOIDs(q.Agg.PartialParams, oids, m)
		default:
			oids = limitParamOIDs(q, oids, len(m.Parameters))
		}
	}
	part := &clientPortal{stmt: &clientStmt{sql: t.SQL, oids: oids, epoch: portal.stmt.epoch}}
	if !s.bindOn(ctx, part, t.Node, t.SQL, m, m.DestinationPortal, false) {
		return false
	}
	lead := make([]pgproto3.BackendMessage, len(r.Explain))
	for i, line := range r.Explain {
		lead[i] = &pgproto3.DataRow{Values: [][]byte{[]byte(line)}}
	}
	part.parts[0].lead = lead
	portal.parts = append(portal.parts, part.parts...)
	return true
}
