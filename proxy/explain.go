package proxy

import (
	"context"
	"strings"

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
	bytewise, err := s.sortsAsBytes(ctx, q)
	if err != nil {
		s.fail(err)
		return false
	}
	lead := make([]pgproto3.BackendMessage, len(r.Explain))
	for i, line := range r.Explain {
		if bytewise {
			line = strings.Replace(line, router.PostgresSortNote, "", 1)
		}
		lead[i] = &pgproto3.DataRow{Values: [][]byte{[]byte(line)}}
	}
	part.parts[0].lead = lead
	portal.parts = append(portal.parts, part.parts...)
	return true
}

// sortsAsBytes reports whether the collation probe of a fan-out's ORDER BY
// finds every key without a collation or in one that orders as bytes: the
// merge then orders the rows itself, as the fan-out would.
func (s *session) sortsAsBytes(ctx context.Context, q *router.Plan) (bool, error) {
	if q.Kind != router.FanOut || q.CollationProbe == "" || len(q.Sort) == 0 {
		return false, nil
	}
	c, err := s.collationsOf(ctx, q.CollationProbe, len(q.Sort))
	if err != nil {
		return false, err
	}
	for i := range q.Sort {
		if !c.bytes[i] && c.names[i] != "" {
			return false, nil
		}
	}
	return true, nil
}
