package proxy

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// COPY FROM STDIN into a reference table (docs/DESIGN.md, "Reference
// tables"): the client's data goes unchanged to every copy, as it comes,
// inside the session's transaction across nodes (an implicit one outside
// a block), which two-phase commit ends. The catalog copy's table is
// locked first against every other writer (pgshard.ReferenceCopyLockSQL):
// a writer of a reference table takes the catalog copy before any other,
// so while the COPY holds that lock no other writer is on any copy, and
// the rows can stream to all of them at once without two writers waiting
// for each other on different nodes. The client sees the catalog copy's
// CopyInResponse and count; the counts of the others must be the same.

// refCopyFlush is how many bytes of client data are buffered for the
// copies before they are sent.
const refCopyFlush = 256 << 10

// refCopy is one COPY FROM STDIN into a reference table.
type refCopy struct {
	table string
	sql   []string        // per part: its Query
	parts []*pgshard.Conn // the catalog copy's first
}

// runRefCopy starts the COPY of portal on the current view: an extended
// protocol portal may run in a later batch than its Bind.
func (s *session) runRefCopy(ctx context.Context, portal *clientPortal) {
	v, err := s.view(ctx)
	if err != nil {
		s.fail(err)
		return
	}
	s.startRefCopy(ctx, v, portal.stmt.plan)
}

// startRefCopy queues a COPY FROM STDIN of plan p on every copy of its
// reference table.
func (s *session) startRefCopy(ctx context.Context, v *shardmap.View, p *router.Plan) {
	if s.txStatus() == 'E' {
		s.x.synthetic(errAbortedTx.Response())
		return
	}
	r, err := router.Resolve(v, p, nil)
	if err != nil {
		s.fail(err)
		return
	}
	targets := s.catalogFirst(r.Targets)
	set := pgshard.ReferenceNodesSQL(r.Nodes())
	s.spanNodes(max(2, len(targets)))
	rc := &refCopy{table: p.References[0]}
	for _, t := range targets {
		be, err := s.backend(ctx, t.Node)
		if err != nil {
			s.fail(unreachableCopy(rc.table, t.Node, err))
			return
		}
		q := set + ";\n"
		if t.Node == s.srv.catalogNode {
			q += pgshard.ReferenceCopyLockSQL(rc.table) + ";\n"
		}
		rc.parts = append(rc.parts, be)
		rc.sql = append(rc.sql, q+t.SQL)
	}
	s.x.add(step{kind: stepCopy, refCopy: rc})
}

// catalogFirst orders targets with the catalog node's first: its copy
// answers the client.
func (s *session) catalogFirst(targets []router.Target) []router.Target {
	out := slices.Clone(targets)
	slices.SortStableFunc(out, func(a, b router.Target) int {
		switch {
		case a.Node == s.srv.catalogNode && b.Node != s.srv.catalogNode:
			return -1
		case b.Node == s.srv.catalogNode && a.Node != s.srv.catalogNode:
			return 1
		}
		return 0
	})
	return out
}

// refCopyPart is what one copy answered.
type refCopyPart struct {
	be     *pgshard.Conn
	in     *pgproto3.CopyInResponse // nil until the node is in COPY mode
	rows   int64
	copied bool // its COPY completed
	done   bool // ReadyForQuery read
}

// playRefCopy runs a COPY step of a reference table. Only the client's
// loss is returned; other errors reach the client as an ErrorResponse and
// fail the transaction.
func (s *session) playRefCopy(x *exchange, rc *refCopy) error {
	var first *pgproto3.ErrorResponse
	failWith := func(e *pgproto3.ErrorResponse) {
		if first == nil {
			first = e
		}
	}
	parts := make([]*refCopyPart, len(rc.parts))
	for i, be := range rc.parts {
		parts[i] = &refCopyPart{be: be}
		be.Send(&pgproto3.Query{String: rc.sql[i]})
		if err := be.Flush(); err != nil {
			s.lostCopy(x, parts[i], rc.table, err, failWith)
		}
	}
	// Every copy enters COPY mode (or fails) before any row is sent.
	for _, pt := range parts {
		s.readRefCopy(x, pt, rc.table, true, failWith)
	}
	if first == nil && parts[0].in == nil {
		failWith(sqlstate.New(sqlstate.InternalError, "node %s did not start the COPY into reference table %q", parts[0].be.Node, rc.table).Response())
	}
	if first == nil {
		in := parts[0].in
		s.send(&pgproto3.CopyInResponse{OverallFormat: in.OverallFormat, ColumnFormatCodes: in.ColumnFormatCodes})
		if err := s.flush(); err != nil {
			s.abandonRefCopy(parts)
			return errClientGone
		}
		if err := s.relayRefCopy(x, parts, rc.table, failWith); err != nil {
			return err
		}
	} else {
		// Copies already in COPY mode are taken out of it.
		for _, pt := range parts {
			if pt.in != nil && !pt.done && !pt.be.Broken() {
				pt.be.Send(&pgproto3.CopyFail{Message: "another copy of the reference table failed"})
				if err := pt.be.Flush(); err != nil {
					s.lostCopy(x, pt, rc.table, err, failWith)
				}
			}
		}
	}
	for _, pt := range parts {
		s.readRefCopy(x, pt, rc.table, false, failWith)
	}
	if first == nil {
		for _, pt := range parts[1:] {
			if pt.rows != parts[0].rows {
				failWith(sqlstate.New(sqlstate.InternalError, "COPY into reference table %q loaded %d rows on node %s and %d on node %s",
					rc.table, parts[0].rows, parts[0].be.Node, pt.rows, pt.be.Node).Response())
				break
			}
		}
	}
	if first != nil {
		// The copies must not differ: the whole transaction fails, as an
		// error in COPY fails it in PostgreSQL.
		s.tx.failed = true
		if !x.errored {
			x.errored = true
			s.send(first)
		}
		return nil
	}
	s.send(commandComplete("COPY " + strconv.FormatInt(parts[0].rows, 10)))
	return nil
}

// relayRefCopy sends the client's COPY data to every copy until the client
// ends or aborts it.
func (s *session) relayRefCopy(x *exchange, parts []*refCopyPart, table string, failWith func(*pgproto3.ErrorResponse)) error {
	all := func(m pgproto3.FrontendMessage, flush bool) {
		for _, pt := range parts {
			if pt.done || pt.be.Broken() {
				continue // a copy that failed reads no more data
			}
			pt.be.Send(m)
			if flush {
				if err := pt.be.Flush(); err != nil {
					s.lostCopy(x, pt, table, err, failWith)
				}
			}
		}
	}
	buffered := 0
	for {
		msg, err := s.client.Receive()
		if err != nil {
			s.abandonRefCopy(parts)
			s.receiveFailed(err)
			return errClientGone
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			buffered += len(m.Data)
			flush := buffered >= refCopyFlush
			if flush {
				buffered = 0
			}
			all(m, flush)
			continue
		case *pgproto3.CopyDone, *pgproto3.CopyFail:
			all(m, true)
		case *pgproto3.Flush, *pgproto3.Sync:
			continue // ignored during COPY, as PostgreSQL does
		default:
			all(&pgproto3.CopyFail{Message: fmt.Sprintf("unexpected message type 0x%02X during COPY from stdin", messageType(m))}, true)
			failWith(sqlstate.New(sqlstate.ProtocolViolation, "unexpected message type 0x%02X during COPY from stdin", messageType(m)).Response())
		}
		return nil
	}
}

// readRefCopy reads one copy's answers: up to its CopyInResponse when
// start (or its ReadyForQuery, if it failed first), else up to its
// ReadyForQuery.
func (s *session) readRefCopy(x *exchange, pt *refCopyPart, table string, start bool, failWith func(*pgproto3.ErrorResponse)) {
	for !pt.done && !pt.be.Broken() {
		if start && pt.in != nil {
			return
		}
		msg, err := pt.be.Receive()
		if err != nil {
			s.lostCopy(x, pt, table, err, failWith)
			return
		}
		switch m := msg.(type) {
		case *pgproto3.CopyInResponse:
			pt.in = &pgproto3.CopyInResponse{OverallFormat: m.OverallFormat, ColumnFormatCodes: slices.Clone(m.ColumnFormatCodes)}
		case *pgproto3.CommandComplete:
			pt.be.NoteCommand(m.CommandTag)
			if pt.in != nil {
				pt.rows, pt.copied = rowsAffected(m.CommandTag), true
			}
		case *pgproto3.ErrorResponse:
			cp := *m // the message is reused by the next Receive
			failWith(&cp)
		case *pgproto3.NoticeResponse:
			s.send(m)
		case *pgproto3.ReadyForQuery:
			pt.done = true
		}
	}
}

// lostCopy gives up a copy whose connection failed: the write fails whole.
func (s *session) lostCopy(x *exchange, pt *refCopyPart, table string, err error, failWith func(*pgproto3.ErrorResponse)) {
	pt.be.MarkBroken()
	x.failed[pt.be] = true
	s.dropBackend(pt.be)
	failWith(sqlstate.As(unreachableCopy(table, pt.be.Node, err)).Response())
}

// abandonRefCopy closes the copies' backends when the client is gone:
// their transactions are rolled back by closing them.
func (s *session) abandonRefCopy(parts []*refCopyPart) {
	for _, pt := range parts {
		pt.be.MarkBroken()
		s.dropBackend(pt.be)
	}
}
