package proxy

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// maxStaleRetries bounds how often one statement is routed again after a
// shard answered LT001 (slot moved).
const maxStaleRetries = 5

// flushThreshold is how much result data the proxy buffers for a client
// before writing it out, so large results stream with bounded memory.
const flushThreshold = 256 << 10

// maxPendingSteps bounds the steps of one extended-protocol batch before the
// proxy flushes and drains them, so a long pipeline cannot grow memory.
const maxPendingSteps = 4096

// session serves one client connection.
type session struct {
	srv    *Server
	conn   net.Conn
	client *pgproto3.Backend
	in     *bodyReader // what client reads through; nil without a Budget
	log    *slog.Logger

	user, tenant string
	key          CancelKey
	settings     *settings
	shadow       shadowState // which bare names the session's search_path resolves elsewhere (shadow.go)

	tx struct {
		active bool // BEGIN seen (or an implicit transaction started), whether or not a backend holds it yet
		// failed marks an error no backend records: one before any backend
		// held the transaction, or a participant lost mid-transaction.
		failed bool
		// implicit marks a transaction the proxy started for one statement
		// (or one extended batch) over several nodes; it ends at
		// ReadyForQuery (endImplicit).
		implicit bool
		begin    string   // the BEGIN statement, replayed on every node the transaction touches
		local    []string // SET LOCAL, SET TRANSACTION: replayed on every node that joins
		// savepoints are the transaction's savepoints, oldest first: made
		// again, among the SET LOCALs, on every node that joins.
		savepoints []savepoint
		// conns hold the transaction, one backend per node, in the order
		// the nodes joined.
		conns []*pgshard.Conn
		// setsBefore is the session's SETs before the first SET inside this
		// transaction: a rollback undoes that SET, so they are restored.
		setsBefore []setting
		setInTx    bool
		// wrote are the shards the transaction wrote to before any of
		// their slots froze: it holds their tables' locks, which a
		// freeze's fence waits for (freezepass.go).
		wrote []shardRef
		// lockedRefs are the reference tables whose catalog copy it wrote
		// or locked rows of (refhold.go).
		lockedRefs []string
		// routing is the view of the statement that first took a backend
		// into the transaction, under which its snapshots were taken, and
		// isolation its isolation level once asked (snaprouting.go).
		routing   *shardmap.View
		isolation string
		exported  bool // its snapshot was exported: Server.exports has its routing
	}
	used []*pgshard.Conn // backends taken for the current exchange, outside any transaction
	aux  []*pgshard.Conn // backends that only describe statements, outside any transaction

	x       exchange
	out     outMessages
	stmts   map[string]*clientStmt
	portals map[string]*clientPortal
	// ahead is the client's last Parse while its answer is the proxy's own
	// and the next message may want the backend's (parseahead.go).
	ahead *parseAhead
	// parsedRefs are the reference tables whose catalog copy a Parse of
	// the current exchange locked on a backend outside any transaction,
	// until that backend's Sync (refhold.go).
	parsedRefs []string
	// skipping is set after an error in an extended batch: messages are
	// ignored until Sync, as PostgreSQL does.
	skipping bool
	// simple is set while a Query message is served: the one execute path
	// frames backend work as simple Queries (RowDescription before the
	// rows, ReadyForQuery at the end) instead of Parse/Bind/Execute.
	simple bool
	// simpleRetry allows the current Query's statement to be routed again
	// after LT001 (simpleQuery).
	simpleRetry bool
	// q is the statement of the current Query and its portal, reused from
	// Query to Query.
	q struct {
		stmt   clientStmt
		portal clientPortal
	}

	activeMu sync.Mutex
	active   []*pgshard.Conn // backends running this session's work, for CancelRequest
	// batch numbers the client's batch the session is in, from its first
	// message to its ReadyForQuery (the message's count in served), and is
	// 0 between batches; canceled is the batch a CancelRequest came in
	// (cancelPending). Numbered, a cancel that comes as its batch ends
	// cannot hit the next one.
	batch    atomic.Uint64
	canceled atomic.Uint64
	// cancelSent is the batch whose cancel sendBackends forwarded after
	// sending its statements, which a backend may not have had yet when
	// the request came (it would have ignored it).
	cancelSent uint64
	// waitCtx is the context poolAcquire waits for a backend under, made
	// from waitParent; stopWait ends it, and waiting says a wait is under
	// way. All under activeMu.
	waitCtx    context.Context
	waitParent context.Context
	stopWait   context.CancelCauseFunc
	waiting    bool
	// deadlock is the cycle across nodes that made the detector cancel
	// this session's waiting statement (deadlock.go): the cancel's 57014
	// goes to the client as 40P01. Set under activeMu; cleared at
	// ReadyForQuery.
	deadlock atomic.Pointer[string]

	// serving counts the client's messages, and is 0 while the session
	// waits for the next: the server's look for clients gone in the
	// middle of a statement reads it (clientgone.go).
	serving atomic.Uint64
	served  uint64
	gone    atomic.Bool // the client went away in the middle of a statement

	pendingBytes int
	copyBytes    int // the COPY relay's, while it runs
	// copying is the relay of the client's COPY FROM STDIN to a backend,
	// until the session has taken its last read (copyin.go).
	copying *copyRelay
	// capture takes the rows the merge of a fan-out sends while it fills
	// a portal for batched fetches (fanbatch.go).
	capture *heldRows
	// cursors are the session's cursors over trees, by name (cursor.go);
	// cursorEnd is how the COMMIT or ROLLBACK running ends them.
	cursors   map[string]*treeCursor
	cursorEnd cursorEnd

	listener *listener // the session's LISTEN backend, nil until it runs LISTEN
	pin      pinState  // the catalog-node backend kept for session state (pin.go)
	// stateLost is set when the backend that held the session's own state
	// (its pin, its LISTENs) died: the session ends with it, FATAL, once
	// the client has its current answer, as its PostgreSQL connection
	// would have ended. Going on would leave a client that believes it
	// holds a lock, or listens, when it does not.
	stateLost *sqlstate.Error
	// untracked: a statement of this exchange may leave session state the
	// proxy does not track; the backends it takes are probed (untracked.go).
	untracked bool

	// views are the views this session's statements planned on since the
	// last ReadyForQuery (or Flush), each held from the registration over
	// the whole view once, or narrowed to one slot (narrowView).
	views []viewHold
	// freshView indexes the hold in views that the current statement took
	// for itself, which it may narrow; -1 when it shares an earlier one.
	freshView int
	// extRetry is the statement of the current extended batch that is
	// routed again after LT001, or nil; it points at retryBuf, as a batch
	// has at most one.
	extRetry *extRetry
	retryBuf extRetry
	// keyBuf is where prepareOn builds the key of a backend statement.
	keyBuf []byte
	// heldDesc, heldNames and heldLead hold a prepared simple statement's
	// RowDescription until its rows (simpleprepared.go).
	heldDesc  pgproto3.RowDescription
	heldNames []byte
	heldLead  [1]pgproto3.BackendMessage
	// rt is the routing of the session's point statements (route).
	rt router.Routing

	// qkind is the route kind of the current Query message, and execs the
	// Executes of the current extended batch, for the query metrics.
	qkind router.Kind
	execs []execNote
}

// clientStmt is a prepared statement as the client named it.
type clientStmt struct {
	sql   string
	oids  []uint32
	plan  *router.Plan // nil for an empty statement
	trees uint64       // trees version the plan was made under
	// epoch is the result epoch at Parse (pgshard.ResultEpoch): parsed
	// after DDL, the statement gets backend statements of its own, whose
	// result columns are the new ones.
	epoch uint64
	// oidBuf and ahead are the parameter types and the pending Parse of a
	// client's Parse (parse, aheadOf), in the statement's own allocation:
	// the extended protocol parses the unnamed statement for every query.
	oidBuf [4]uint32
	ahead  parseAhead
}

// clientPortal is a bound statement: on backends, or answered by the proxy.
type clientPortal struct {
	stmt      *clientStmt
	resultFmt []int16
	// run is what the proxy does itself at Execute, for statements it
	// answers or runs on several backends its own way.
	run func(context.Context)
	// fetch is a FETCH of a cursor over trees, which an Execute with a
	// row limit hands out in batches (cursor.go).
	fetch func(ctx context.Context, maxRows uint32)
	split *splitState
	fan   *fanOut
	// held are a fan-out's rows merged at its first Execute with a row
	// limit, or a cursor FETCH's rows, handed out batch by batch
	// (fanbatch.go).
	held  *heldRows
	parts []portalPart
	bind  *pgproto3.Bind // a Single plan's Bind, kept to route it again after LT001
	// fmtBuf, partBuf and bound hold the result formats, the one part and
	// the copied Bind of a point statement in the portal's own allocation:
	// the extended protocol binds a portal for every query.
	fmtBuf  [1]int16
	partBuf [1]portalPart
	bound   boundCopy
}

// splitState accumulates the parts of a statement split across shards: a
// multi-row INSERT, or an UPDATE or DELETE on every shard.
type splitState struct {
	rowDescSent bool
	count       int64
	prefix      string // the command tag without its count: "UPDATE ", "INSERT 0 "
	// order, for an INSERT whose RETURNING rows go back in VALUES order,
	// holds them until the tag.
	order *returnOrder
}

func (s *session) send(m pgproto3.BackendMessage) {
	if pd, ok := m.(*pgproto3.ParameterDescription); ok && len(pd.ParameterOIDs) > maxWireCount {
		m = (*wideParameterDescription)(pd)
	}
	if e, ok := m.(*pgproto3.ErrorResponse); ok {
		if d := s.deadlock.Load(); d != nil && e.Code == sqlstate.QueryCanceled {
			e = deadlockError(e, *d)
		}
		m = withTreeSchema(e)
	}
	if _, ok := m.(*pgproto3.ReadyForQuery); ok {
		s.deadlock.Store(nil)
	}
	if s.capture != nil && s.capture.take(m) {
		return
	}
	s.client.Send(m)
	switch m := m.(type) {
	case *pgproto3.DataRow:
		for _, v := range m.Values {
			s.pendingBytes += len(v) + 4
		}
		if s.pendingBytes > flushThreshold {
			_ = s.flush()
		}
	case *pgproto3.ErrorResponse:
		s.srv.metrics.errorSent(m.Code)
	}
}

func (s *session) flush() error {
	s.pendingBytes = 0
	if err := s.client.Flush(); err != nil {
		return errClientGone
	}
	return nil
}

// cachedView is the tenant's current trees and maps, from the proxy's cache.
func (s *session) cachedView(ctx context.Context) (*shardmap.View, error) {
	if s.srv.cfg.Registration != nil {
		return s.acquireView(ctx)
	}
	v, err := s.srv.cache.View(ctx, s.tenant)
	if err != nil {
		return nil, sqlstate.New(sqlstate.SystemError, "shard map unavailable: %v", err)
	}
	return v, nil
}

type viewTrees struct{ v *shardmap.View }

func (t viewTrees) Tree(name string) (*shardmap.Tree, bool) {
	tr, ok := t.v.Trees[name]
	return tr, ok
}

// Group lets the router plan joins of a colocation group's trees.
func (t viewTrees) Group(tr *shardmap.Tree) string { return tr.Group }

func (s *session) plan(ctx context.Context, sql string) ([]*router.Plan, *shardmap.View, error) {
	v, err := s.view(ctx)
	if err != nil {
		return nil, nil, err
	}
	plans, err := s.srv.planner.Plan(sql, viewTrees{v}, v.TreesVersion)
	if err != nil {
		return nil, v, err
	}
	return plans, v, nil
}

// txStatus is the transaction status the client sees in ReadyForQuery.
func (s *session) txStatus() byte {
	if !s.tx.active && len(s.tx.conns) == 0 {
		return 'I'
	}
	if s.tx.failed {
		return 'E'
	}
	for _, be := range s.tx.conns {
		if be.TxStatus == 'E' {
			return 'E'
		}
	}
	return 'T'
}

// backend returns the connection that runs work for node in this exchange:
// the transaction's own for that node, one already taken, or a new one from
// the pool brought to the session's settings. Inside a transaction a new
// backend joins it: the client's BEGIN is replayed there first.
func (s *session) backend(ctx context.Context, node string) (*pgshard.Conn, error) {
	for _, be := range s.tx.conns {
		if be.Node == node {
			return be, nil
		}
	}
	for _, be := range s.tx.conns {
		// A failed transaction answers 25P02 to anything, wherever it points.
		if be.TxStatus == 'E' {
			return be, nil
		}
	}
	for _, be := range s.used {
		if be.Node == node {
			return be, nil
		}
	}
	if s.tx.active && node != s.srv.catalogNode && s.importedSnapshot() {
		// Exported on the catalog node (the only node a client reaches
		// with pg_export_snapshot), it would be unknown on this one.
		e := sqlstate.New(sqlstate.FeatureNotSupported, "this transaction imported a snapshot with SET TRANSACTION SNAPSHOT, which exists only on the catalog node, and now reads node %s", node)
		e.Hint = "Read trees on several nodes without an imported snapshot: pg_dump without --jobs, or dump a lattice_snapshot copy of the tree."
		return nil, e
	}
	be, err := s.acquire(ctx, node)
	if err != nil {
		return nil, err
	}
	if !s.tx.active {
		s.used = append(s.used, be)
		return be, nil
	}
	s.tx.conns = append(s.tx.conns, be)
	be.Wrote = false
	be.Send(&pgproto3.Query{String: s.txPrologue()})
	s.x.add(step{kind: stepHiddenQuery, be: be})
	return be, nil
}

// inTx reports whether be holds part of the session's transaction.
func (s *session) inTx(be *pgshard.Conn) bool {
	for _, c := range s.tx.conns {
		if c == be {
			return true
		}
	}
	return false
}

// acquire takes a backend from the pool and queues what brings it to the
// session's settings.
func (s *session) acquire(ctx context.Context, node string) (*pgshard.Conn, error) {
	be := s.pinnedBackend(node)
	if be == nil {
		var err error
		if be, err = s.poolAcquire(ctx, node); err != nil {
			return nil, acquireError(node, err)
		}
	}
	s.setActive(be, true)
	if q := s.prologue(be); q != "" {
		be.Send(&pgproto3.Query{String: q})
		s.x.add(step{kind: stepHiddenQuery, be: be})
	}
	return be, nil
}

// prologue is the Query that brings a backend fresh from the pool to the
// session's settings, or "".
func (s *session) prologue(be *pgshard.Conn) string {
	var prologue []string
	for _, n := range be.TakeEvicted() {
		prologue = append(prologue, "DEALLOCATE "+n)
	}
	if q := s.settings.replay(be.Settings); q != "" {
		prologue = append(prologue, q)
		be.Settings = s.settings.fp
	}
	return strings.Join(prologue, "; ")
}

// describeBackend is where statements are described: against the tree's
// template on the catalog node, which has the tree's exact columns. A
// transaction that is not on the catalog node is left alone, so that
// describing a statement never decides which node holds the transaction.
func (s *session) describeBackend(ctx context.Context) (*pgshard.Conn, error) {
	node := s.srv.catalogNode
	for _, be := range s.tx.conns {
		if be.Node == node {
			return be, nil
		}
	}
	for _, be := range s.used {
		if be.Node == node {
			return be, nil
		}
	}
	for _, be := range s.aux {
		if be.Node == node {
			return be, nil
		}
	}
	be, err := s.acquire(ctx, node)
	if err != nil {
		return nil, err
	}
	s.aux = append(s.aux, be)
	return be, nil
}

// parseBackend is where a Parse of p goes ahead of its Bind, or for its
// Describe: describeBackend's, except for a statement that locks a
// reference table's catalog copy (locksReferences). PostgreSQL takes that
// lock at the Parse and keeps it to the end of the backend's transaction,
// and the session counts it as its own (parseLock), so the Parse goes to
// the backend the statement runs on: in a transaction, the transaction's
// own on the catalog node, which joins it now; outside one, the exchange's,
// which its Bind takes. On an auxiliary backend the lock was another
// transaction's: the Bind ran elsewhere, past a change of the copies that
// it did not wait for, or queued behind one that waited for the lock.
func (s *session) parseBackend(ctx context.Context, p *router.Plan) (*pgshard.Conn, error) {
	if locksReferences(p) {
		return s.backend(ctx, s.srv.catalogNode)
	}
	return s.describeBackend(ctx)
}

// catalogTarget is the node for a Catalog plan: the catalog node, except
// that a read naming no relation follows the session's open transaction.
func (s *session) catalogTarget(p *router.Plan) string {
	if p.Anywhere && len(s.tx.conns) > 0 {
		return s.tx.conns[0].Node
	}
	return s.srv.catalogNode
}

func (s *session) setActive(be *pgshard.Conn, on bool) {
	s.activeMu.Lock()
	defer s.activeMu.Unlock()
	if on {
		s.active = append(s.active, be)
		if s.untracked {
			be.Untracked = true
		}
		return
	}
	for i, c := range s.active {
		if c == be {
			s.active = append(s.active[:i], s.active[i+1:]...)
			return
		}
	}
}

// cancelTimeout bounds the forwarding of one CancelRequest, during which
// the session cannot release its backends.
const cancelTimeout = 5 * time.Second

// cancel forwards a CancelRequest to every backend running this session's work.
// It holds activeMu until the nodes have handled the requests, so that no
// backend goes back to the pool (setActive(be, false) comes first) while a
// cancel meant for this session could still reach another session's
// statement on it; a backend found idle ignores the cancel.
func (s *session) cancel(ctx context.Context) {
	ctx, done := context.WithTimeout(ctx, cancelTimeout)
	defer done()
	s.activeMu.Lock()
	defer s.activeMu.Unlock()
	if b := s.batch.Load(); b != 0 {
		s.canceled.Store(b)
		s.stopWaiting()
	}
	s.cancelActive(ctx)
}

// cancelPending reports a CancelRequest that came in the client's current
// batch: what of the batch has not gone out yet ends with 57014 (poolAcquire,
// extendedMsg), and sendBackends forwards it after what has.
func (s *session) cancelPending() bool {
	b := s.batch.Load()
	return b != 0 && s.canceled.Load() == b
}

// cancelActive sends a CancelRequest to each active backend; activeMu held.
func (s *session) cancelActive(ctx context.Context) {
	for _, be := range s.active {
		if err := be.Cancel(ctx); err != nil {
			s.log.Warn("cancel request failed", "node", be.Node, "err", err)
		}
	}
}

// interrupt makes every read and write the session's backends are blocked
// in return at once, with an error that breaks them: shutdown's last resort
// for a session whose backend never answers. It returns how many it cut.
func (s *session) interrupt() int {
	s.activeMu.Lock()
	defer s.activeMu.Unlock()
	for _, be := range s.active {
		_ = be.SetDeadline(time.Now())
	}
	return len(s.active)
}

// sendBackends writes out what was queued for each backend of the exchange.
func (s *session) sendBackends() {
	for _, list := range s.backendLists() {
		for _, be := range list {
			if err := be.Flush(); err != nil {
				be.MarkBroken()
			}
		}
	}
	if s.cancelPending() && s.cancelSent != s.batch.Load() {
		// The client cancelled what it sent before the backends had it.
		s.cancelSent = s.batch.Load()
		ctx, done := context.WithTimeout(context.Background(), cancelTimeout)
		defer done()
		s.activeMu.Lock()
		defer s.activeMu.Unlock()
		s.cancelActive(ctx)
	}
}

// backendLists are the lists backends() joins, for loops on every
// statement's path that must not allocate and change no list.
func (s *session) backendLists() [3][]*pgshard.Conn {
	return [3][]*pgshard.Conn{s.tx.conns, s.used, s.aux}
}

func (s *session) backends() []*pgshard.Conn {
	out := make([]*pgshard.Conn, 0, len(s.tx.conns)+len(s.used)+len(s.aux))
	return append(append(append(out, s.tx.conns...), s.used...), s.aux...)
}

// dropBackend forgets a broken backend; the pool closes it.
func (s *session) dropBackend(be *pgshard.Conn) {
	if s.inTx(be) {
		// The participant's work is gone: only ROLLBACK ends this.
		s.tx.active, s.tx.failed = true, true
	}
	for _, list := range []*[]*pgshard.Conn{&s.tx.conns, &s.used, &s.aux} {
		for i, c := range *list {
			if c == be {
				*list = append((*list)[:i], (*list)[i+1:]...)
				s.putBack(be)
				return
			}
		}
	}
}

// finish ends an exchange: backends that are idle go back to the pool; one
// left inside a transaction (a BEGIN sent within a multi-statement query)
// holds the session's transaction from now on. A transaction whose backends
// all ended it (COMMIT or ROLLBACK forwarded) is over.
func (s *session) finish() {
	defer func() {
		s.untracked = false
		s.settlePin()
	}()
	for _, be := range s.used {
		if be.TxStatus != 'I' && !be.Broken() && len(s.tx.conns) == 0 {
			s.tx.conns = append(s.tx.conns, be)
			s.tx.active = true
			continue
		}
		s.putBack(be)
	}
	s.used = s.used[:0]
	for _, be := range s.aux {
		if be.TxStatus != 'I' {
			be.MarkBroken()
		}
		s.putBack(be)
	}
	s.aux = s.aux[:0]
	s.parsedRefs = s.parsedRefs[:0]
	if len(s.tx.conns) == 0 {
		return
	}
	kept := s.tx.conns[:0]
	for _, be := range s.tx.conns {
		if be.TxStatus == 'I' || be.Broken() {
			s.putBack(be)
			continue
		}
		kept = append(kept, be)
	}
	ended := len(kept) < len(s.tx.conns)
	clear(s.tx.conns[len(kept):])
	s.tx.conns = kept
	switch {
	case len(kept) == 0 && !s.tx.implicit:
		s.resetTx()
	case ended:
		// One participant left the transaction on its own: the others
		// must not commit without it.
		s.tx.failed = true
	default:
		s.tx.active = true
	}
}

// resetTx forgets a transaction that ended on every backend.
func (s *session) resetTx() {
	s.tx.active, s.tx.failed, s.tx.implicit = false, false, false
	s.tx.savepoints, s.tx.local, s.tx.begin = nil, nil, ""
	s.tx.wrote, s.tx.lockedRefs = s.tx.wrote[:0], s.tx.lockedRefs[:0]
	s.tx.routing, s.tx.isolation = nil, ""
	s.forgetExport()
}

// release returns everything at session end; a transaction left open is
// rolled back by closing its backend.
func (s *session) release() {
	s.releaseViews()
	if s.copying != nil {
		// A COPY relay still reading the client must not write to its
		// backend once that goes back to the pool.
		s.copyOver(s.copying.be)
	}
	if s.listener != nil {
		// The reader may be writing a notification to the client: closing
		// the socket ends that write.
		s.conn.Close()
		s.dropListener()
	}
	for _, be := range s.tx.conns {
		be.MarkBroken()
	}
	for _, be := range append(append(s.tx.conns, s.used...), s.aux...) {
		if be.TxStatus != 'I' {
			be.MarkBroken()
		}
		s.putBack(be)
	}
	s.tx.conns, s.used, s.aux = nil, nil, nil
	s.forgetExport()
	s.releasePin()
	s.endWaits()
}

// fail reports err (ours, not a backend's) to the client and applies
// PostgreSQL's rule that an error aborts the transaction it happens in: the
// backend holding it is made to fail too, so its later statements get 25P02
// from PostgreSQL itself and COMMIT rolls back. In the extended protocol the
// rest of the batch is skipped up to Sync, as PostgreSQL skips it.
func (s *session) fail(err error) {
	s.x.synthetic(sqlstate.As(err).Response())
	if !s.simple {
		s.skipping = true
	}
	for _, be := range s.backends() {
		if !s.simple {
			be.Send(&pgproto3.Parse{Query: "lattice aborts this transaction"})
			s.x.add(step{kind: stepAbort, be: be})
		} else if be.TxStatus != 'I' || s.inTx(be) {
			be.Send(&pgproto3.Query{String: "lattice aborts this transaction"})
			s.x.add(step{kind: stepAbort, be: be, query: true})
		}
	}
	if len(s.tx.conns) == 0 && s.tx.active {
		s.tx.failed = true
	}
}

// route finds the node and the rendered statement of a Single plan,
// reading the key from the plan's literal or from Bind parameters.
// It resolves into the session's one Routing, which nothing keeps.
func (s *session) route(v *shardmap.View, p *router.Plan, bind *pgproto3.Bind, oids []uint32) (router.Target, error) {
	return s.routeAs(v, p, bind, oids, false)
}

// routeAs is route, the target's SQL the plan's prepared statement when
// prepared is set.
func (s *session) routeAs(v *shardmap.View, p *router.Plan, bind *pgproto3.Bind, oids []uint32, prepared bool) (router.Target, error) {
	b := routerBind(bind, oids)
	if b != nil {
		b.AsPrepared = prepared
	}
	if err := router.ResolveTo(&s.rt, v, p, b); err != nil {
		return router.Target{}, err
	}
	return s.rt.Targets[0], nil
}

// routerBind is what the router reads of a Bind; nil when there is none (a
// Query of several statements), which the router reads as no parameters.
func routerBind(bind *pgproto3.Bind, oids []uint32) *router.Bind {
	if bind == nil {
		return nil
	}
	return &router.Bind{Params: bind.Parameters, Formats: bind.ParameterFormatCodes, OIDs: oids}
}

// splitRows groups the VALUES rows of an InsertSplit plan by owning shard, in
// order of first appearance: one INSERT per shard, with its rows only.
func (s *session) splitRows(v *shardmap.View, p *router.Plan, bind *pgproto3.Bind, oids []uint32) ([]router.Target, error) {
	r, err := router.Resolve(v, p, routerBind(bind, oids))
	if err != nil {
		return nil, err
	}
	return r.Targets, nil
}

func commandComplete(tag string) *pgproto3.CommandComplete {
	return &pgproto3.CommandComplete{CommandTag: []byte(tag)}
}

// firstWord is the upper-cased leading keyword of a statement.
func firstWord(sql string) string { return strings.ToUpper(leadingWord(sql)) }

// leadingWord is the first of sqlWords, found without allocating: it is
// read of every catalog statement (isListenPlan).
func leadingWord(sql string) string {
	var buf [1]string
	if w := appendSQLWords(buf[:0], sql, 1); len(w) > 0 {
		return w[0]
	}
	return ""
}

// withTreeSchema names the tree's schema, public, in an error that names a
// shard's (lattice_s0006, a constraint of a shard table): the client's
// table is the tree.
func withTreeSchema(e *pgproto3.ErrorResponse) *pgproto3.ErrorResponse {
	if !shardmap.IsSchemaName(e.SchemaName) {
		return e
	}
	cp := *e
	cp.SchemaName = "public"
	return &cp
}
