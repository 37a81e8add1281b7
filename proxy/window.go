package proxy

import (
	"fmt"

	"github.com/lattice-db/lattice/sqlstate"
)

// Windows that run in the final step (router/windowstep.go) gather the
// statement's rows, not one row per group: their size is the result's,
// so the proxy refuses past --max-merge-memory rather than hand PostgreSQL
// an unbounded temporary table. Below it, rows past one VALUES list still
// go through the aggregate's temporary table (aggregate.go).

// overWindowRows reports gathered window rows larger than the server allows.
func (s *session) overWindowRows(held int64) *sqlstate.Error {
	if s.overMemory(held) == nil {
		return nil
	}
	return &sqlstate.Error{Code: sqlstate.ProgramLimitExceeded,
		Message: fmt.Sprintf("window functions over several shards gather more than %d bytes of rows (--max-merge-memory)", s.srv.cfg.MaxMergeMemory),
		Detail:  "A window not partitioned by the shard key runs over every row the statement reads, gathered in one place.",
		Hint:    "Partition the windows by the shard key so that they run on the shards, narrow the WHERE clause, select fewer columns, or raise --max-merge-memory."}
}
