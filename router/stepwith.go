package router

import pg "github.com/pganalyze/pg_query_go/v6"

// WITH beside aggregates, or beside windows that run in the final step,
// goes into each node's partial query, which reads its CTEs as the
// statement does; the final step reads only the partial rows and has no
// WITH. A CTE that reads a tree never gets there: the colocation analysis
// refuses one that is not pinned to a key (one that can be inlined is a
// derived table by then: inline.go), and a tree reference outside
// FROM and WHERE is refused by stepInput, so each node evaluates CTEs of
// constants, functions and reference tables, whose copies are equal.
// Evaluated once per node rather than once, a CTE must not call a function
// whose value differs between nodes (random(), now(), nextval(): PostgreSQL
// evaluates such a CTE once for the whole statement), and WITH RECURSIVE
// is not carried.

// stepWithProblem says why w cannot go into the partial queries of a
// two-step fan-out: the hint's tail and the reason; "" for none.
func stepWithProblem(w *pg.WithClause, plural string) (hint, why string) {
	if w == nil {
		return "", ""
	}
	if w.Recursive {
		return ", or run the CTE as its own statement.", "WITH RECURSIVE with " + plural + " over several shards is not supported"
	}
	for _, c := range w.Ctes {
		if f := perNodeCall(c); f != "" {
			return ", or compute " + f + " in the application and pass it as a parameter.",
				"a CTE beside " + plural + " over several shards would evaluate " + f + " once per node"
		}
	}
	return "", ""
}
