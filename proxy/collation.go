package proxy

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/sqlstate"
)

// A fan-out that sorts or groups text needs each key's collation
// (router/collation.go). The proxy runs a plan's collation probe on the
// catalog node the first time it needs it and keeps the answer until the
// result epoch moves on: DDL through the proxy (an ALTER COLUMN ... TYPE
// ... COLLATE, a new column) starts a new epoch, and the probe runs again.

// collations is a probe's answer: per key or partial column, the
// collation's name as PostgreSQL writes it ("" for none) and whether it
// orders strings as their bytes.
type collations struct {
	names []string
	bytes []bool
}

type collationEntry struct {
	epoch uint64
	c     *collations
}

// maxCollationEntries bounds the probe answers the server keeps; past it
// the cache starts again empty.
const maxCollationEntries = 4096

type collationCache struct {
	mu sync.Mutex
	m  map[string]collationEntry
}

// collationsOf answers probe in the session's tenant, from the cache or
// from the catalog node.
func (s *session) collationsOf(ctx context.Context, probe string, n int) (*collations, error) {
	cc := &s.srv.colls
	key := s.tenant + "\x00" + probe
	epoch := pgshard.ResultEpoch()
	cc.mu.Lock()
	e, ok := cc.m[key]
	cc.mu.Unlock()
	if ok && e.epoch == epoch && len(e.c.names) == n {
		return e.c, nil
	}
	c, err := s.runProbe(ctx, probe, n)
	if err != nil {
		return nil, err
	}
	cc.mu.Lock()
	if cc.m == nil || len(cc.m) >= maxCollationEntries {
		cc.m = make(map[string]collationEntry)
	}
	cc.m[key] = collationEntry{epoch: epoch, c: c}
	cc.mu.Unlock()
	return c, nil
}

// helperBackend takes a pooled catalog-node backend, outside the client's
// transaction, for a statement the proxy runs itself to answer the
// client's (a collation probe, a sort); a cancel reaches it while it runs.
func (s *session) helperBackend(ctx context.Context) (*pgshard.Conn, func(), error) {
	be, err := s.srv.pools.Acquire(ctx, s.user, s.srv.catalogNode, s.tenant)
	if err != nil {
		return nil, nil, acquireError(s.srv.catalogNode, err)
	}
	s.setActive(be, true)
	return be, func() { s.putBack(be) }, nil
}

// asClient makes be, a helper backend, read and print values as the
// client's session does: it sends the session's settings (prologue) and,
// inside a transaction block, the block's BEGIN and SET LOCALs
// (txContext), since a value in text form parses and prints by DateStyle,
// TimeZone, IntervalStyle and the like (SET DateStyle = German makes
// "02.03.1970" the 2nd of March; a backend left at MDY reads the 3rd of
// February). It returns how many ReadyForQuery messages what it sent
// answers with, and the statement that ends the transaction it began (""
// for none), which the caller sends as a query of its own after its Sync.
func (s *session) asClient(be *pgshard.Conn) (pending int, end string) {
	tx := s.txContext()
	if tx != "" {
		end = "ROLLBACK"
	}
	// Apart: in one query with the prologue's statements, BEGIN ISOLATION
	// LEVEL would come after them and fail.
	for _, q := range []string{s.prologue(be), tx} {
		if q != "" {
			be.Send(&pgproto3.Query{String: q})
			pending++
		}
	}
	return pending, end
}

// helperQuery runs one statement on a helper backend as the client
// (asClient), once for each of binds, and hands each row to row; it
// returns the first error, the statement's or the backend's. A row's
// values are the backend's read buffer: row copies what it keeps. The
// Binds go in rounds of about helperRoundBytes, each read to its
// ReadyForQuery before the next is sent: a pipeline larger than the
// sockets' buffers would leave the backend blocked writing answers the
// proxy does not read yet, while the proxy is blocked writing Binds the
// backend does not read. A failed round ends the work; its helper, left
// inside the transaction asClient began, is closed rather than pooled
// (pgshard's Release).
func (s *session) helperQuery(ctx context.Context, parse *pgproto3.Parse, binds []*pgproto3.Bind, row func([][]byte) error) error {
	be, release, err := s.helperBackend(ctx)
	if err != nil {
		return err
	}
	defer release()
	pending, end := s.asClient(be)
	var failed error
	for first := true; first || len(binds) > 0 && failed == nil; first = false {
		n, size := 0, 0
		for n < len(binds) && (n == 0 || size < helperRoundBytes) {
			for _, p := range binds[n].Parameters {
				size += len(p) + 4
			}
			n++
		}
		round := binds[:n]
		binds = binds[n:]
		stmt := parse
		if !first {
			stmt = nil // the unnamed statement lasts until the next Parse
		}
		e := end
		if len(binds) > 0 {
			e = ""
		}
		if err := sendStatement(be, stmt, round, false, e); err != nil {
			return err
		}
		pending += statementAnswers(e)
		if failed, err = readHelper(be, &pending, row); err != nil {
			return err
		}
	}
	return failed
}

// helperRoundBytes bounds the parameter bytes of one round of helperQuery.
const helperRoundBytes = 64 << 10

// readHelper reads be's answers until pending ReadyForQuery messages have
// come, hands the rows to row, and returns the first error of a statement
// or of row (failed), or be's (err, which marks it broken).
func readHelper(be *pgshard.Conn, pending *int, row func([][]byte) error) (failed, err error) {
	for *pending > 0 {
		msg, err := be.Receive()
		if err != nil {
			be.MarkBroken()
			return failed, err
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			if err := row(m.Values); err != nil && failed == nil {
				failed = err
			}
		case *pgproto3.ErrorResponse:
			if failed == nil {
				failed = sqlstate.New(m.Code, "%s", m.Message)
			}
		case *pgproto3.ReadyForQuery:
			*pending--
		}
	}
	return failed, nil
}

// sendStatement sends one extended-protocol statement and its Sync to be,
// then end, if any, as a query of its own after the Sync: it runs when the
// statement failed too, and leaves the backend out of any transaction. A
// failed send marks be broken.
func sendStatement(be *pgshard.Conn, parse *pgproto3.Parse, binds []*pgproto3.Bind, describe bool, end string) error {
	if parse != nil {
		be.Send(parse)
	}
	for _, bind := range binds {
		be.Send(bind)
		if describe {
			be.Send(&pgproto3.Describe{ObjectType: 'P'})
		}
		be.Send(&pgproto3.Execute{})
	}
	be.Send(&pgproto3.Sync{})
	if end != "" {
		be.Send(&pgproto3.Query{String: end})
	}
	if err := be.Flush(); err != nil {
		be.MarkBroken()
		return err
	}
	return nil
}

// statementAnswers is how many ReadyForQuery messages what sendStatement
// sent answers with.
func statementAnswers(end string) int {
	if end != "" {
		return 2
	}
	return 1
}

// runProbe runs a collation probe on a pooled catalog-node backend, with
// the session's settings (its search_path names the functions a sort
// expression calls).
func (s *session) runProbe(ctx context.Context, probe string, n int) (*collations, error) {
	be, release, err := s.helperBackend(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	pending := 1
	if q := s.prologue(be); q != "" {
		be.Send(&pgproto3.Query{String: q})
		pending++
	}
	be.Send(&pgproto3.Query{String: probe})
	if err := be.Flush(); err != nil {
		be.MarkBroken()
		return nil, err
	}
	var c *collations
	var failed error
	for pending > 0 {
		msg, err := be.Receive()
		if err != nil {
			be.MarkBroken()
			return nil, err
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			if pending != 1 || len(m.Values) != 2*n {
				continue
			}
			c = &collations{names: make([]string, n), bytes: make([]bool, n)}
			for i := range n {
				name := string(m.Values[2*i])
				if name != "" && !btreeindex.ValidCollation(name) {
					name = ""
				}
				c.names[i], c.bytes[i] = name, string(m.Values[2*i+1]) == "t"
			}
		case *pgproto3.ErrorResponse:
			failed = sqlstate.New(sqlstate.FeatureNotSupported, "the proxy could not find the collation of the sort keys: %s", m.Message)
		case *pgproto3.ReadyForQuery:
			pending--
		}
	}
	if failed == nil && c == nil {
		failed = sqlstate.New(sqlstate.InternalError, "the collation probe returned no row")
	}
	if failed != nil {
		e := failed.(*sqlstate.Error)
		e.Hint = `add COLLATE "C" to each text ORDER BY item, or fix the shard key in WHERE to read one shard`
		return nil, e
	}
	return c, nil
}
