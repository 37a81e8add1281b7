package proxy

import (
	"strconv"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// Batched fetches of a SELECT over several shards: an Execute with a row
// limit on a fan-out portal, as JDBC sends for setFetchSize and pg-cursor
// and psycopg's server-side cursors for their batches. The merge runs once,
// at the portal's first Execute, and its rows go into the portal; each
// Execute hands out the next batch, with PortalSuspended while rows are
// left, as PostgreSQL does. Like a PostgreSQL portal, the portal answers
// from what its nodes' snapshots held at that first Execute. The rows held
// so count, all portals of the session together, against
// --max-merge-memory: a result that does not fit gets 53200 with a hint,
// never a part of its rows.

// heldRows are a fan-out portal's merged rows not handed out yet.
type heldRows struct {
	rows  [][][]byte
	bytes int64
	// room is what the portal may hold: --max-merge-memory less what
	// the session's other portals held when this one began to fill.
	room int64
	over bool // the rows passed the memory bound
	// describe takes the RowDescription too, into desc (a cursor's query,
	// run in the simple protocol: cursor.go).
	describe bool
	desc     *pgproto3.RowDescription
	// tag is each batch's command tag before its count: SELECT for a
	// fan-out's rows, FETCH for a cursor's FETCH.
	tag string
}

// holdRows gives portal the store its first Execute fills.
func (s *session) holdRows(portal *clientPortal) *heldRows {
	h := &heldRows{room: s.srv.cfg.MaxMergeMemory - s.heldBytes(portal.held), tag: "SELECT"}
	portal.held = h
	return h
}

// take keeps a message the merge sends while h is filled: its rows (copied,
// as the merge reuses their buffers) and its CommandComplete, whose count
// each batch gives anew, and for a cursor the RowDescription. Anything else
// goes on to the client.
func (h *heldRows) take(m pgproto3.BackendMessage) bool {
	switch m := m.(type) {
	case *pgproto3.DataRow:
		if h.over {
			return true
		}
		row := copyRow(m.Values)
		h.rows = append(h.rows, row)
		h.bytes += rowSize(row)
		if h.bytes > h.room {
			h.over = true
			h.rows, h.bytes = nil, 0
		}
		return true
	case *pgproto3.CommandComplete:
		return true
	case *pgproto3.RowDescription:
		if h.describe {
			h.desc = &pgproto3.RowDescription{Fields: copyFields(m.Fields)}
		}
		return h.describe
	}
	return false
}

func batchOverMemory(limit int64) *sqlstate.Error {
	e := sqlstate.New(sqlstate.OutOfMemory, "out of memory: fetching a SELECT over several shards in batches holds its rows in the proxy, and they need more than %d bytes", limit)
	e.Detail = "The merged rows of the session's portals fetched with a row limit exceed --max-merge-memory."
	e.Hint = "Fix the shard key in WHERE to read one shard, which streams, select fewer rows or columns, or raise --max-merge-memory."
	return e
}

// endHold ends the filling of portal's rows and hands out the first batch.
func (s *session) endHold(x *exchange, portal *clientPortal, maxRows uint32) {
	s.capture = nil
	h := portal.held
	if x.errored {
		portal.held = nil
		return
	}
	if h.over {
		x.errored = true
		portal.held = nil
		s.send(batchOverMemory(s.srv.cfg.MaxMergeMemory).Response())
		return
	}
	s.sendBatch(h, maxRows)
}

// sendBatch hands out up to maxRows of h's rows (0: all of them), then
// PortalSuspended after a full batch, or the CommandComplete of this
// batch, as PostgreSQL counts it.
func (s *session) sendBatch(h *heldRows, maxRows uint32) {
	n := len(h.rows)
	if maxRows > 0 && int(maxRows) < n {
		n = int(maxRows)
	}
	for _, row := range h.rows[:n] {
		s.send(&pgproto3.DataRow{Values: row})
		h.bytes -= rowSize(row)
	}
	clear(h.rows[:n])
	h.rows = h.rows[n:]
	if maxRows > 0 && n == int(maxRows) {
		// A full batch: PostgreSQL does not look ahead for more rows.
		s.send(&pgproto3.PortalSuspended{})
		return
	}
	s.send(commandComplete(h.tag + " " + strconv.Itoa(n)))
}
