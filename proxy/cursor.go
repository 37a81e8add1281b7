package proxy

import (
	"context"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Cursors over trees (router/cursor.go). DECLARE runs the cursor's query
// at once, as a statement of the session, and the proxy holds every row it
// returned: like a PostgreSQL cursor, the cursor then answers from what the
// nodes' snapshots held at DECLARE, and no backend keeps state for it, so a
// WITH HOLD cursor outlives its transaction without pinning one. FETCH and
// MOVE move over the held rows as PostgreSQL moves over a cursor's (every
// direction; NO SCROLL refuses going back, as PostgreSQL does). The rows
// count, with the fan-out portals held for batched fetches, against
// --max-merge-memory: a result that does not fit gets 53200 at DECLARE.
// Both protocols serve them: the simple one, in which psycopg2's named
// cursors, Django's iterator() and psql send them, and the extended one,
// in which psycopg 3's server-side cursors DECLARE with parameters,
// describe the cursor as a portal and FETCH, and in which pgx FETCHes with
// binary results (the rows are held as text, and PostgreSQL converts what
// a FETCH asks for in binary: cursorbinary.go).

// treeCursor is a cursor over trees the session holds.
type treeCursor struct {
	rows *heldRows // all of the query's rows and its RowDescription
	// pos is PostgreSQL's cursor position: 0 before the first row,
	// len(rows)+1 after the last, otherwise on row pos.
	pos            int
	hold, noScroll bool
	// pending: declared in the transaction still open, which drops it if
	// it rolls back; depth is how many savepoints that transaction held at
	// DECLARE, so that ROLLBACK TO one of them drops it too.
	pending bool
	depth   int
}

// cursorEnd is how the transaction a COMMIT or ROLLBACK ends went, for the
// session's cursors (settleCursors).
type cursorEnd int

const (
	cursorsKept cursorEnd = iota
	cursorsCommit
	cursorsRollback
)

func duplicateCursor(name string) *sqlstate.Error {
	return sqlstate.New(sqlstate.DuplicateCursor, "cursor \"%s\" already exists", name)
}

func cursorOverMemory(limit int64) *sqlstate.Error {
	e := sqlstate.New(sqlstate.OutOfMemory, "out of memory: a cursor over trees holds its rows in the proxy, and they need more than %d bytes", limit)
	e.Detail = "The rows of the session's cursors over trees and of its portals fetched in batches exceed --max-merge-memory."
	e.Hint = "Read in pages by the key (WHERE key > last ORDER BY key LIMIT n), export with COPY (SELECT ...) TO STDOUT, which streams, or raise --max-merge-memory."
	return e
}

// declare binds DECLARE of a cursor over trees: its query is bound as a
// statement of its own, and its run fills the cursor.
func (s *session) declare(ctx context.Context, v *shardmap.View, portal *clientPortal, c *router.CursorPlan, m *pgproto3.Bind) bool {
	var err *sqlstate.Error
	switch {
	case c.Binary:
		err = sqlstate.New(sqlstate.FeatureNotSupported, "BINARY cursors over trees are not supported")
		err.Hint = "Declare the cursor without BINARY: the proxy holds its rows as text."
	case s.cursors[c.Name] != nil:
		err = duplicateCursor(c.Name)
	case !c.Hold && !s.tx.active:
		err = sqlstate.New(sqlstate.NoActiveSQLTransaction, "DECLARE CURSOR can only be used in transaction blocks")
	}
	if err != nil {
		s.fail(err)
		return false
	}
	plans, perr := s.srv.planner.Plan(c.Query, viewTrees{v}, v.TreesVersion)
	if perr != nil {
		s.fail(perr)
		return false
	}
	if len(plans) != 1 || plans[0].Kind != router.Single && plans[0].Kind != router.FanOut {
		s.fail(sqlstate.New(sqlstate.InternalError, "the query of cursor %q planned as %d statements, not one SELECT over trees", c.Name, len(plans)))
		return false
	}
	// The query takes the DECLARE's parameters ($n stay in the deparsed
	// query) and gives text rows, whatever results the Bind asked for.
	b := *m
	b.ResultFormatCodes = nil
	// Queued before the query's parts are bound: on the catalog node they
	// may share its backend, and the check's unnamed portal would take the
	// place of theirs.
	if err := s.checkCatalogCursor(ctx, c.Name); err != nil {
		s.fail(err)
		return false
	}
	query := &clientPortal{stmt: &clientStmt{sql: c.Query, plan: plans[0], trees: v.TreesVersion, oids: portal.stmt.oids, epoch: portal.stmt.epoch}}
	if !s.execute(ctx, v, query, &b) {
		return false
	}
	// Never retried alone after LT001 (staleext.go): its rows must go into
	// the cursor. (A SELECT meets no fence; the simple protocol runs the
	// whole DECLARE again.)
	query.bind = nil
	cur := &treeCursor{rows: &heldRows{describe: true}, hold: c.Hold, noScroll: c.NoScroll,
		pending: s.tx.active, depth: len(s.tx.savepoints)}
	portal.run = func(ctx context.Context) {
		s.x.add(step{kind: stepSynthetic, then: func(*exchange) {
			cur.rows.room = s.srv.cfg.MaxMergeMemory - s.heldBytes(nil)
			s.capture = cur.rows
		}})
		if !s.simple {
			// An Execute sends no RowDescription: the query's portal is
			// described for the cursor, as a client's would be.
			s.describeBound(ctx, query)
		}
		s.run(ctx, query, 0)
		s.x.add(step{kind: stepSynthetic, then: func(x *exchange) { s.endDeclare(x, c.Name, cur) }})
	}
	return true
}

// checkCatalogCursor queues, on the session's catalog-node backend when it
// holds one (in its transaction, or pinned), a DECLARE and a CLOSE of
// name: a cursor the catalog node already holds by that name, declared
// there by SQL or by a function, fails the DECLARE with PostgreSQL's own
// 42P03, as one namespace of cursors would. A session that holds no such
// backend has no cursor there: one without WITH HOLD ends with its
// transaction, and one with it pins the session (pin.go, untracked.go).
func (s *session) checkCatalogCursor(ctx context.Context, name string) error {
	if s.pin.be == nil && !slices.ContainsFunc(s.tx.conns, func(be *pgshard.Conn) bool { return be.Node == s.srv.catalogNode }) {
		return nil
	}
	be, err := s.backend(ctx, s.srv.catalogNode)
	if err != nil {
		return err
	}
	// WITH HOLD: allowed outside a transaction block too. The CLOSE must
	// not run after a failed DECLARE, where it would close the catalog
	// node's cursor: it shares the DECLARE's Query, or its batch, which an
	// error skips to the Sync.
	declare, closeIt := "DECLARE "+quoteIdent(name)+" CURSOR WITH HOLD FOR SELECT", "CLOSE "+quoteIdent(name)
	if s.simple {
		s.hiddenSQL(be, declare+"; "+closeIt)
		return nil
	}
	s.hiddenSQL(be, declare)
	s.hiddenSQL(be, closeIt)
	return nil
}

// endDeclare keeps the cursor once its query's rows are all in.
func (s *session) endDeclare(x *exchange, name string, cur *treeCursor) {
	s.capture = nil
	switch {
	case x.errored || x.stale != nil:
		return
	case cur.rows.over:
		x.errored = true
		s.send(cursorOverMemory(s.srv.cfg.MaxMergeMemory).Response())
		return
	case cur.rows.desc == nil:
		x.errored = true
		s.send(sqlstate.New(sqlstate.InternalError, "the query of cursor %q described no columns", name).Response())
		return
	}
	if s.cursors == nil {
		s.cursors = map[string]*treeCursor{}
	}
	s.cursors[name] = cur
	s.send(commandComplete("DECLARE CURSOR"))
}

// cursorStatement binds a FETCH, MOVE or CLOSE of a cursor the proxy
// holds, and checks a DECLARE of the catalog node's against the proxy's
// names. It reports whether it bound the statement (ok false: it failed);
// any other goes to the catalog node.
func (s *session) cursorStatement(portal *clientPortal, c *router.CursorPlan) (bound, ok bool) {
	if c.Op == router.CursorDeclare {
		if s.cursors[c.Name] != nil {
			s.fail(duplicateCursor(c.Name))
			return true, false
		}
		return false, false
	}
	if c.Op == router.CursorClose && c.Name == "" {
		// CLOSE ALL: the proxy's cursors, then the catalog node's.
		s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
			if !x.errored {
				clear(s.cursors)
			}
		}})
		return false, false
	}
	cur := s.cursors[c.Name]
	if cur == nil {
		return false, false
	}
	formats := portal.resultFmt
	portal.fetch = func(ctx context.Context, maxRows uint32) {
		s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
			if x.errored {
				return
			}
			switch {
			case c.Op == router.CursorClose:
				delete(s.cursors, c.Name)
				s.send(commandComplete("CLOSE CURSOR"))
			case portal.held != nil:
				// A later Execute of a FETCH handed out in batches.
				s.sendBatch(portal.held, maxRows)
			default:
				if err := s.fetch(ctx, portal, cur, c, formats, maxRows); err != nil {
					x.errored = true
					s.send(sqlstate.As(err).Response())
				}
			}
		}})
	}
	s.bindComplete()
	return true, true
}

// fetch serves FETCH or MOVE over cur's rows, in the result formats of
// the FETCH's Bind. A FETCH that fails leaves the cursor where it was.
// As in PostgreSQL, an Execute with a row limit moves the cursor by the
// whole FETCH, and portal hands the rows out in batches of that limit;
// an Execute after the last row gives none.
func (s *session) fetch(ctx context.Context, portal *clientPortal, cur *treeCursor, c *router.CursorPlan, formats []int16, maxRows uint32) error {
	pos := cur.pos
	from, n, step, err := cur.move(c.Direction, c.Count)
	if err != nil {
		return err
	}
	if c.Op == router.CursorMove {
		s.send(commandComplete("MOVE " + strconv.Itoa(n)))
		return nil
	}
	rows := make([][][]byte, n)
	for i := range rows {
		rows[i] = cur.rows.rows[from+i*step]
	}
	rows, cerr := s.binaryRows(ctx, cur.rows.desc.Fields, formats, rows)
	if cerr != nil {
		cur.pos = pos
		return cerr
	}
	if s.simple {
		// The extended protocol's Describe gives it (describeCursor).
		s.send(cur.rows.desc)
	}
	held := &heldRows{rows: rows, tag: "FETCH"}
	if !s.simple {
		// Counted as a fan-out portal's are; the cursor counts them too.
		// Kept after its last row, so that the portal's next Execute
		// gives none (FETCH 0) rather than FETCH again.
		for _, row := range rows {
			held.bytes += rowSize(row)
		}
		portal.held = held
	}
	s.sendBatch(held, maxRows)
	return nil
}

var scanForwardOnly = sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "cursor can only scan forward").
	WithHint("Declare it with SCROLL option to enable backward scan.")

// move moves cur as PostgreSQL moves a cursor for FETCH or MOVE dir
// count, and returns the rows passed over: n of them, the first at index
// from of cur's rows, each next one step (1 or -1) further.
func (cur *treeCursor) move(dir router.FetchDirection, count int64) (from, n, step int, err *sqlstate.Error) {
	last, pos := int64(len(cur.rows.rows)), int64(cur.pos)
	if dir == router.FetchForward || dir == router.FetchBackward {
		if count < 0 {
			dir, count = dir^1, -count // FORWARD -n is BACKWARD n, and the other way round
		}
		if count == 0 {
			dir = router.FetchRelative // FORWARD 0 and BACKWARD 0 fetch the current row again
		}
	}
	var target int64 // where ABSOLUTE and RELATIVE land: 0 before the first row, last+1 after the last
	switch dir {
	case router.FetchForward:
		if count > last-pos {
			cur.pos = int(last + 1)
			return int(pos), int(max(last-pos, 0)), 1, nil
		}
		cur.pos = int(pos + count)
		return int(pos), int(count), 1, nil
	case router.FetchBackward:
		if cur.noScroll {
			return 0, 0, 0, scanForwardOnly
		}
		if count >= pos {
			cur.pos = 0
			return int(pos - 2), int(max(pos-1, 0)), -1, nil
		}
		cur.pos = int(pos - count)
		return int(pos - 2), int(count), -1, nil
	case router.FetchAbsolute:
		switch {
		case count > 0:
			target = min(count, last+1)
		case count < 0 && count >= -last:
			target = last + 1 + count
		}
	case router.FetchRelative:
		switch {
		case count > last+1-pos:
			target = last + 1
		case count < -pos:
			target = 0
		default:
			target = pos + count
		}
	}
	onRow := target >= 1 && target <= last
	if cur.noScroll && (target < pos || target == pos && onRow) {
		return 0, 0, 0, scanForwardOnly
	}
	cur.pos = int(target)
	if !onRow {
		return 0, 0, 1, nil
	}
	return int(target - 1), 1, 1, nil
}

// settleCursors ends the session's cursors with their transaction, as
// PostgreSQL does, once ReadyForQuery follows a COMMIT or ROLLBACK (end)
// or a statement outside a transaction block (ok: it succeeded): a cursor
// WITHOUT HOLD ends with its transaction, one WITH HOLD when its
// transaction rolls back.
func (s *session) settleCursors(ok bool) {
	end := s.cursorEnd
	s.cursorEnd = cursorsKept
	if len(s.cursors) == 0 {
		return
	}
	if end == cursorsCommit && !ok {
		end = cursorsRollback // a COMMIT that failed
	}
	if end == cursorsKept && s.txStatus() == 'I' {
		// The statement's own implicit transaction.
		end = cursorsCommit
		if !ok {
			end = cursorsRollback
		}
	}
	for name, cur := range s.cursors {
		switch {
		case end == cursorsKept:
		case !cur.hold || end == cursorsRollback && cur.pending:
			delete(s.cursors, name)
		default:
			cur.pending = false
		}
	}
}

// noteTxEnd records how a COMMIT or ROLLBACK about to run ends the
// transaction, for settleCursors: COMMIT of a failed transaction rolls it
// back.
func (s *session) noteTxEnd(p *router.Plan) {
	switch {
	case p.Tx == router.Commit && !s.tx.failed && s.txStatus() != 'E':
		s.cursorEnd = cursorsCommit
	case p.Tx == router.Commit || p.Tx == router.Rollback:
		s.cursorEnd = cursorsRollback
	}
}

// savepointCursors applies ROLLBACK TO or RELEASE of the transaction's
// savepoint i to the cursors: as in PostgreSQL, a cursor declared after
// the savepoint ends when it is rolled back to, and belongs to the
// savepoint's parent when it is released.
func (s *session) savepointCursors(tx router.TxKind, i int) {
	for name, cur := range s.cursors {
		if !cur.pending || cur.depth <= i {
			continue
		}
		if tx == router.RollbackTo {
			delete(s.cursors, name)
		} else {
			cur.depth = i
		}
	}
}

// describeCursor answers a Describe of a statement or portal that FETCHes,
// MOVEs or CLOSEs a cursor the session holds, or of the cursor itself as a
// portal (cur alone), as PostgreSQL describes them; formats are a FETCH
// portal's result formats. It reports whether it answered.
func (s *session) describeCursor(c *router.CursorPlan, cur *treeCursor, statement *clientStmt, formats []int16) bool {
	if c != nil {
		if cur = s.cursors[c.Name]; cur == nil || c.Op == router.CursorDeclare {
			return false
		}
	}
	if statement != nil {
		s.x.synthetic(&pgproto3.ParameterDescription{ParameterOIDs: statement.oids})
	}
	if c != nil && c.Op != router.CursorFetch {
		s.x.answer(noDataMsgs)
		return true
	}
	if len(formats) == 0 {
		s.x.synthetic(cur.rows.desc)
		return true
	}
	s.x.synthetic(&pgproto3.RowDescription{Fields: resultFields(cur.rows.desc.Fields, formats)})
	return true
}

// heldBytes is what the session's held rows take but except's: its
// portals filled for batched fetches and its cursors over trees.
func (s *session) heldBytes(except *heldRows) int64 {
	var n int64
	for _, p := range s.portals {
		if p.held != nil && p.held != except {
			n += p.held.bytes
		}
	}
	for _, c := range s.cursors {
		if c.rows != except {
			n += c.rows.bytes
		}
	}
	return n
}
