package proxy

import (
	"fmt"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// Windows and aggregates that run in the final step over the statement's
// rows (router/windowstep.go), and set operations compared there
// (router/setopstep.go), gather the rows the statement reads, not one row
// per group: their size is the input's, so
// the proxy refuses past --max-merge-memory rather than hand PostgreSQL an
// unbounded temporary table. Below it, rows past one VALUES list still go
// through the aggregate's temporary table (aggregate.go).

// overGathered reports gathered rows of a larger than the server allows;
// nil for an aggregate's partial rows, which are one per group.
func (s *session) overGathered(a *router.AggPlan, held int64) *sqlstate.Error {
	if !a.Gathered && !a.SetOp || s.overMemory(held) == nil {
		return nil
	}
	if a.SetOp {
		return &sqlstate.Error{Code: sqlstate.ProgramLimitExceeded,
			Message: fmt.Sprintf("a set operation over several shards gathers more than %d bytes of rows (--max-merge-memory)", s.srv.cfg.MaxMergeMemory),
			Detail:  "UNION, INTERSECT and EXCEPT whose branches do not output the shard key at one position compare every branch's rows, gathered in one place.",
			Hint:    "Output the shard key at the same position in every branch so that each shard compares its own rows, use UNION ALL, narrow the WHERE clauses, or raise --max-merge-memory."}
	}
	if a.Limited {
		return &sqlstate.Error{Code: sqlstate.ProgramLimitExceeded,
			Message: fmt.Sprintf("LIMIT or FETCH FIRST over several shards gathers more than %d bytes of rows (--max-merge-memory)", s.srv.cfg.MaxMergeMemory),
			Detail:  "Each node returns its first LIMIT + OFFSET rows, and with WITH TIES every row tied with them, gathered in one place.",
			Hint:    "Lower the LIMIT or OFFSET, order by more columns so that fewer rows tie, narrow the WHERE clause, or raise --max-merge-memory."}
	}
	if a.Sorted {
		return &sqlstate.Error{Code: sqlstate.ProgramLimitExceeded,
			Message: fmt.Sprintf("COPY (SELECT ... ORDER BY ...) over several shards gathers more than %d bytes of rows (--max-merge-memory)", s.srv.cfg.MaxMergeMemory),
			Detail:  "PostgreSQL sorts the rows of every shard in one place for the COPY's order.",
			Hint:    "COPY without ORDER BY, whose rows stream from each node as they come, add a LIMIT, narrow the WHERE clause, or raise --max-merge-memory."}
	}
	if !a.Window {
		return &sqlstate.Error{Code: sqlstate.ProgramLimitExceeded,
			Message: fmt.Sprintf("aggregates over several shards gather more than %d bytes of rows (--max-merge-memory)", s.srv.cfg.MaxMergeMemory),
			Detail:  "An aggregate other than count, sum, min, max and avg without FILTER or ORDER BY, a grouping set, GROUP BY DISTINCT or DISTINCT ON runs over every row the statement reads, gathered in one place.",
			Hint:    "Use count, sum, min, max or avg without FILTER or ORDER BY, which combine on the shards, narrow the WHERE clause, or raise --max-merge-memory."}
	}
	return &sqlstate.Error{Code: sqlstate.ProgramLimitExceeded,
		Message: fmt.Sprintf("window functions over several shards gather more than %d bytes of rows (--max-merge-memory)", s.srv.cfg.MaxMergeMemory),
		Detail:  "A window not partitioned by the shard key runs over every row the statement reads, gathered in one place.",
		Hint:    "Partition the windows by the shard key so that they run on the shards, narrow the WHERE clause, select fewer columns, or raise --max-merge-memory."}
}
