package proxy

import (
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// returnOrder puts the RETURNING rows of a multi-row INSERT split across
// shards (router.Plan.InOrder) back in VALUES order. Each part is one
// INSERT of some VALUES rows into one shard, and PostgreSQL returns its
// rows in the order it lists them; the parts answer one after another.
// So the n-th row of a part is that part's n-th VALUES row. The rows are
// held until every part has answered, within --max-merge-memory.
type returnOrder struct {
	rows [][]int // each part's VALUES rows (0-based), parts in portal order
	seq  []int   // the parts in the order they answer
	cur  int     // the index in seq of the part answering
	n    int     // the rows it has returned so far
	// byRow holds the returned rows by VALUES row; nil for a row that
	// returned none.
	byRow       [][][]byte
	values      int // the VALUES rows
	held, limit int64
	err         *sqlstate.Error
}

func newReturnOrder(values int, limit int64) *returnOrder {
	return &returnOrder{byRow: make([][][]byte, values), values: values, limit: limit}
}

// reset readies o for a run of its portal.
func (o *returnOrder) reset() {
	if o.byRow == nil {
		o.byRow = make([][][]byte, o.values)
	}
	clear(o.byRow)
	o.seq, o.cur, o.n, o.held, o.err = o.seq[:0], 0, 0, 0, nil
}

// addPart records the VALUES rows of the next part, in portal order.
func (o *returnOrder) addPart(rows []int) { o.rows = append(o.rows, rows) }

// add takes the next row the answering part returned.
func (o *returnOrder) add(values [][]byte) {
	if o.err != nil {
		return
	}
	if o.cur >= len(o.seq) || o.n >= len(o.rows[o.seq[o.cur]]) {
		o.fail(sqlstate.New(sqlstate.InternalError, "a shard's part of the INSERT returned more rows than it inserted"))
		return
	}
	o.held += rowSize(values)
	if o.held > o.limit {
		o.fail(&sqlstate.Error{Code: sqlstate.ProgramLimitExceeded,
			Message: "the RETURNING rows of an INSERT over several shards exceed --max-merge-memory",
			Detail:  "The proxy holds them until every shard has answered, to return them in the order of the VALUES rows; the INSERT is rolled back.",
			Hint:    "Insert fewer rows at a time, return fewer columns, or raise --max-merge-memory."})
		return
	}
	o.byRow[o.rows[o.seq[o.cur]][o.n]] = copyRow(values)
	o.n++
}

// partDone moves on to the next part.
func (o *returnOrder) partDone() { o.cur, o.n = o.cur+1, 0 }

func (o *returnOrder) fail(e *sqlstate.Error) { o.err, o.byRow = e, nil }

// flush sends the rows held, in VALUES order.
func (o *returnOrder) flush(send func(pgproto3.BackendMessage)) {
	for _, r := range o.byRow {
		if r != nil {
			send(&pgproto3.DataRow{Values: r})
		}
	}
	o.byRow = nil
}
