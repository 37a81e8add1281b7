// Package proxy speaks the PostgreSQL wire protocol to clients: startup,
// authentication, the simple and extended query protocols, COPY and cancel,
// and runs each statement where the router says.
package proxy

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/rawsock"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Config is what a Server needs besides its collaborators.
type Config struct {
	Startup StartupConfig
	// MaxClients bounds client connections, those in startup included; 0
	// means 1000.
	MaxClients int
	// MaxStartups and MaxStartupsPerHost bound the connections in startup,
	// overall and from one source host; 0 means DefaultMaxStartups and
	// DefaultMaxStartupsPerHost.
	MaxStartups, MaxStartupsPerHost int
	// MaxPinned bounds the sessions pinned to a catalog-node backend by
	// session state (pin.go); 0 means DefaultMaxPinned.
	MaxPinned int
	// StatementTimeout is the statement_timeout of sessions that set none
	// at startup; 0 leaves the nodes' own.
	StatementTimeout time.Duration
	// MaxMergeMemory bounds the rows one fan-out statement holds in the
	// proxy; 0 means DefaultMaxMergeMemory.
	MaxMergeMemory int64
	// IdleInTransactionTimeout ends a session idle in a transaction for
	// longer (25P03); 0 means DefaultIdleInTransactionTimeout, negative
	// none.
	IdleInTransactionTimeout time.Duration
	// MaxPreparedStatements and MaxPortals bound a session's named
	// protocol statements and portals; 0 means DefaultMaxPreparedStatements
	// and DefaultMaxPortals.
	MaxPreparedStatements, MaxPortals int
	// MaxMessageMemory bounds the large client message bodies held at once
	// across sessions (inflight.go), unless Startup.Budget is set; 0 means
	// DefaultMaxMessageMemory.
	MaxMessageMemory int64
	// SimpleAsText runs every simple-protocol statement as its text. By
	// default one on one shard runs as a statement prepared once per
	// backend, its constants bound as parameters (simpleprepared.go).
	SimpleAsText bool
	// CatalogNode is the node that holds ordinary tables and tree templates.
	CatalogNode string
	// Aggregates tells which of the named functions are aggregates in a
	// tenant's catalog; a SELECT over several shards that calls one is
	// refused rather than answered with one row per node.
	Aggregates func(ctx context.Context, tenant string, names []string) ([]string, error)
	// TwoPhase commits transactions that span several nodes; without it
	// they are refused at COMMIT.
	TwoPhase *TwoPhase
	// TreeDDL runs DDL on a tree on its template and every shard and
	// records it in the registry; nil refuses DDL on trees.
	TreeDDL func(ctx context.Context, d pgshard.TreeDDL) error
	// IndexTable names the table of index public.<index> on the catalog
	// node ("" when there is none), so that DROP INDEX of a tree's index
	// reaches its shards.
	IndexTable func(ctx context.Context, tenant, index string) (string, error)
	// Registration, when set, is where statements take the views they
	// plan on, so that the proxy acknowledges a map epoch only once no
	// statement planned on an older one runs (the migrator's freeze and
	// release wait for that); nil plans on the cache directly.
	Registration *shardmap.Registration
	// Metrics are the request-path instruments; nil counts into
	// unregistered ones.
	Metrics *Metrics
	Log     *slog.Logger
}

// Server accepts client connections and runs a session for each.
type Server struct {
	cfg         Config
	cache       *shardmap.Cache
	planner     *router.Planner
	pools       *pgshard.Pools
	functions   Functions
	catalogNode string
	twoPhase    *TwoPhase
	metrics     *Metrics
	log         *slog.Logger

	aggs     sync.Map // tenant + "\x00" + function name -> aggCheck
	colls    collationCache
	clients  atomic.Int64 // connected clients, those in startup included
	startups *startupSlots
	pinned   atomic.Int64 // sessions pinned to a backend (pin.go)
	exports  snapshotExports
	mu       sync.Mutex
	sessions map[uint32]*session // by the process id handed to the client, for CancelRequest
	wg       sync.WaitGroup
}

// NewServer wires a proxy server.
func NewServer(cfg Config, cache *shardmap.Cache, planner *router.Planner, pools *pgshard.Pools, functions Functions) *Server {
	if cfg.MaxClients <= 0 {
		cfg.MaxClients = 1000
	}
	if cfg.MaxPinned <= 0 {
		cfg.MaxPinned = DefaultMaxPinned
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.MaxMergeMemory <= 0 {
		cfg.MaxMergeMemory = DefaultMaxMergeMemory
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.IdleInTransactionTimeout == 0 {
		cfg.IdleInTransactionTimeout = DefaultIdleInTransactionTimeout
	}
	if cfg.MaxPreparedStatements <= 0 {
		cfg.MaxPreparedStatements = DefaultMaxPreparedStatements
	}
	if cfg.MaxPortals <= 0 {
		cfg.MaxPortals = DefaultMaxPortals
	}
	if cfg.Startup.Budget == nil {
		cfg.Startup.Budget = NewBudget(cfg.MaxMessageMemory)
	}
	return &Server{
		cfg: cfg, cache: cache, planner: planner, pools: pools, functions: functions,
		catalogNode: cfg.CatalogNode, twoPhase: cfg.TwoPhase, metrics: cfg.Metrics, log: cfg.Log, sessions: make(map[uint32]*session),
		startups: newStartupSlots(cfg.MaxStartups, cfg.MaxStartupsPerHost),
	}
}

// Clients is the number of connected clients.
func (s *Server) Clients() int64 { return s.clients.Load() }

// Serve accepts connections on ln until ctx ends, then closes ln and waits
// for sessions to finish.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	go func() {
		<-ctx.Done()
		ln.Close()
		s.closeSessions()
	}()
	go s.watchClients(ctx)
	err := acceptLoop(ctx, ln, func(err error, delay time.Duration) {
		s.log.Warn("accepting a client connection failed; retrying", "err", err, "retry_in", delay)
	}, func(conn net.Conn) {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(ctx, conn)
		}()
	})
	if err == nil {
		s.wg.Wait()
	}
	return err
}

func (s *Server) serveConn(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	conn = rawsock.Wrap(conn)
	release, err := s.startups.take(conn.RemoteAddr())
	if err != nil {
		s.metrics.conn(connTooMany)
		refuseConn(conn, err)
		return
	}
	// A connection in startup holds a descriptor and a goroutine as a
	// session does: it counts toward --max-clients from its accept.
	n := s.clients.Add(1)
	counted := true
	uncount := func() {
		if counted {
			counted = false
			s.clients.Add(-1)
		}
	}
	defer uncount()
	st, err := Handshake(ctx, conn, s.cfg.Startup)
	release()
	if err != nil {
		s.log.Debug("startup failed", "remote", conn.RemoteAddr().String(), "err", err)
		s.startupFailed(err)
		return
	}
	defer st.Close()
	if st.Cancel != nil {
		uncount()
		s.metrics.conn(connCancel)
		s.cancel(ctx, st.Cancel)
		return
	}
	if n > int64(s.cfg.MaxClients) {
		s.metrics.conn(connTooMany)
		s.metrics.errorSent(sqlstate.TooManyConnections)
		st.Backend.Send(sqlstate.New(sqlstate.TooManyConnections, "sorry, too many clients already").Response())
		_ = st.Backend.Flush()
		return
	}

	sess := s.newSession(conn, st)
	if err := s.greet(ctx, sess, st); err != nil {
		s.metrics.conn(connRejected)
		sess.send(sqlstate.As(err).Response())
		_ = sess.client.Flush()
		return
	}
	s.metrics.conn(connAccepted)
	s.register(sess)
	defer s.unregister(sess)
	defer sess.release()
	defer s.recoverSession(sess)
	sess.loop(ctx)
}

// newSession is the session of a client that completed startup.
func (s *Server) newSession(conn net.Conn, st *Startup) *session {
	sess := &session{
		srv: s, conn: st.Conn, client: st.Backend, in: st.reader,
		user: st.User, tenant: st.Database,
		stmts: map[string]*clientStmt{}, portals: map[string]*clientPortal{},
	}
	sess.x.failed = map[*pgshard.Conn]bool{}
	sess.x.sentSinceSync = map[*pgshard.Conn]bool{}
	sess.log = s.log.With("user", st.User, "tenant", st.Database, "remote", conn.RemoteAddr().String())
	return sess
}

// greet finishes startup: it checks that the tenant's database answers on
// the catalog node, and reports that server's parameters as PostgreSQL would.
func (s *Server) greet(ctx context.Context, sess *session, st *Startup) error {
	params, err := startupSettings(st.Params)
	if err != nil {
		return err
	}
	withStatementTimeout(params, s.cfg.StatementTimeout)
	if err := tenantName(sess.tenant); err != nil {
		return err
	}
	be, err := s.pools.Acquire(ctx, sess.user, s.catalogNode, sess.tenant)
	if err != nil {
		return sqlstate.As(unwrapPg(err))
	}
	defaults := maps.Clone(be.StartupParams)
	sess.settings = newSettings(params, defaults)
	if err := applyStartup(ctx, be, sess.settings); err != nil {
		s.pools.Release(be)
		return err
	}
	s.pools.Release(be)
	for k, v := range params {
		if _, reported := defaults[k]; reported {
			defaults[k] = v
		}
	}
	for k, v := range defaults {
		sess.client.Send(&pgproto3.ParameterStatus{Name: k, Value: v})
	}
	var buf [8]byte
	_, _ = rand.Read(buf[:])
	sess.key = CancelKey{ProcessID: binary.BigEndian.Uint32(buf[:4]) &^ (1 << 31), SecretKey: binary.BigEndian.Uint32(buf[4:])}
	secret := make([]byte, 4)
	binary.BigEndian.PutUint32(secret, sess.key.SecretKey)
	sess.client.Send(&pgproto3.BackendKeyData{ProcessID: sess.key.ProcessID, SecretKey: secret})
	sess.client.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	return sess.flush()
}

// applyStartup brings be to the session's startup settings, so that a
// parameter PostgreSQL rejects (an unknown name, a bad value) fails the
// connection, as it would at PostgreSQL's own startup, rather than the
// session's first statement. be keeps the settings for that statement.
func applyStartup(ctx context.Context, be *pgshard.Conn, st *settings) error {
	q := st.replay(be.Settings)
	if q == "" {
		return nil
	}
	if err := execAll(ctx, []*pgshard.Conn{be}, q)[0]; err != nil {
		be.Settings = unknownSettings // some of them may have been applied
		e := *sqlstate.As(err)
		e.Severity = sqlstate.SeverityFatal
		return &e
	}
	be.Settings = st.fp
	return nil
}

// tenantName refuses a database no tenant may be: the templates, from
// which every new database is copied.
func tenantName(db string) error {
	if db == "template0" || db == "template1" {
		e := sqlstate.Fatal(sqlstate.InsufficientPrivilege, "database %q is not a tenant: templates cannot be used through the Lattice proxy", db)
		e.Hint = "Connect with your tenant's database name."
		return e
	}
	return nil
}

// unwrapPg keeps a PostgreSQL error (e.g. 3D000 for a missing database)
// found inside a connection error.
func unwrapPg(err error) error {
	var pe *sqlstate.Error
	if errors.As(err, &pe) {
		return pe
	}
	return err
}

func (s *Server) register(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.sessions[sess.key.ProcessID] != nil {
		sess.key.ProcessID++
	}
	s.sessions[sess.key.ProcessID] = sess
}

func (s *Server) unregister(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[sess.key.ProcessID] == sess {
		delete(s.sessions, sess.key.ProcessID)
	}
}

// shutdownGrace is how long a session may take to end at shutdown once its
// backends' work was cancelled and its client closed.
const shutdownGrace = 10 * time.Second

// closeSessions ends every session at shutdown: work running on a backend
// is cancelled, and closing the client socket ends the session's loop. A
// session still waiting after shutdownGrace on a backend that answers
// neither its statement nor the cancel (a stopped node, a lost network)
// has its backends' sockets cut, so that the proxy exits.
func (s *Server) closeSessions() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, sess := range s.liveSessions() {
		sess.cancel(ctx)
		sess.conn.Close()
	}
	for deadline := time.Now().Add(shutdownGrace); ; time.Sleep(50 * time.Millisecond) {
		live := s.liveSessions()
		if len(live) == 0 {
			return
		}
		if time.Now().Before(deadline) {
			continue
		}
		for _, sess := range live {
			if n := sess.interrupt(); n > 0 {
				s.log.Warn("a session did not end at shutdown; cutting its backends", "pid", sess.key.ProcessID, "backends", n, "grace", shutdownGrace)
			}
		}
		deadline = time.Now().Add(time.Second)
	}
}

func (s *Server) liveSessions() []*session {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*session, 0, len(s.sessions))
	for _, sess := range s.sessions {
		out = append(out, sess)
	}
	return out
}

// cancel serves a CancelRequest: the secret must match, as in PostgreSQL.
func (s *Server) cancel(ctx context.Context, key *CancelKey) {
	s.mu.Lock()
	sess := s.sessions[key.ProcessID]
	s.mu.Unlock()
	if sess == nil || sess.key.SecretKey != key.SecretKey {
		return
	}
	sess.cancel(ctx)
}

func (sess *session) loop(ctx context.Context) {
	// ready: the client got ReadyForQuery for everything it sent, so the
	// session is between queries and notifications may flow.
	ready := true
	for {
		if ready && sess.stateLost != nil {
			sess.send(sess.stateLost.Response())
			_ = sess.client.Flush()
			return
		}
		if ready {
			sess.enterIdle()
		}
		idleTx := sess.idleDeadline(ready)
		sess.sendOnPause(ctx)
		sess.serving.Store(0)
		if ready {
			sess.batch.Store(0) // a cancel now finds nothing of the client's to end
		}
		msg, err := sess.receive()
		sess.served++
		sess.serving.Store(sess.served)
		if ready {
			sess.batch.Store(sess.served)
		}
		if idleTx {
			if err != nil && idleTimedOut(err) {
				sess.endIdleTransaction()
				return
			}
			_ = sess.conn.SetReadDeadline(time.Time{})
		}
		if lerr := sess.leaveIdle(); lerr != nil {
			return
		}
		if err != nil {
			sess.receiveFailed(err)
			return
		}
		switch m := msg.(type) {
		case *pgproto3.Query, *pgproto3.FunctionCall:
			if len(sess.x.steps) > 0 {
				// An extended batch without its Sync: PostgreSQL answers
				// its messages before the Query.
				if err = sess.flushBatch(); err != nil {
					break
				}
			}
			if sess.skipping {
				// After an error in the batch PostgreSQL discards
				// everything up to its Sync, a Query too.
				break
			}
			sess.ahead = nil
			start := time.Now()
			if q, ok := m.(*pgproto3.Query); ok {
				err = sess.simpleQuery(ctx, q.String)
			} else {
				err = sess.functionCall(ctx, m.(*pgproto3.FunctionCall))
			}
			sess.srv.metrics.query(sess.qkind, start)
			ready = true
		case *pgproto3.Parse, *pgproto3.Bind, *pgproto3.Describe, *pgproto3.Execute,
			*pgproto3.Close, *pgproto3.Sync, *pgproto3.Flush:
			err = sess.extendedMsg(ctx, m)
			_, ready = m.(*pgproto3.Sync)
			if _, flush := m.(*pgproto3.Flush); ready || flush {
				sess.observeExecs()
			}
		case *pgproto3.Terminate:
			return
		case *pgproto3.CopyData, *pgproto3.CopyDone, *pgproto3.CopyFail:
			// Left over from a COPY that already failed; PostgreSQL ignores them too.
		default:
			sess.send(sqlstate.Fatal(sqlstate.ProtocolViolation, "unexpected message type %T", m).Response())
			_ = sess.client.Flush()
			return
		}
		if err != nil {
			return
		}
		if ready {
			// The client got ReadyForQuery: its statements are done.
			sess.releaseViews()
		}
	}
}

// discardInput reads and drops up to n bytes, stopping when the client
// pauses for two seconds or after ten seconds in all. Half a second was
// too short on a loaded machine: a client still writing an oversize
// message was cut off and saw a broken pipe, not the error (ci-22).
func discardInput(conn net.Conn, n int64) {
	buf := make([]byte, 64<<10)
	stop := time.Now().Add(10 * time.Second)
	for n > 0 && time.Now().Before(stop) {
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		read, err := conn.Read(buf)
		n -= int64(read)
		if err != nil {
			return
		}
	}
}

// aggCheck is a cached answer of Config.Aggregates. Answers expire so that
// an aggregate created later is noticed.
type aggCheck struct {
	aggregate bool
	at        time.Time
}

const aggCheckTTL = 10 * time.Second

// aggregateIn returns a function of names that is an aggregate in tenant's
// catalog, or "".
func (s *Server) aggregateIn(ctx context.Context, tenant string, names []string) (string, error) {
	if s.cfg.Aggregates == nil || len(names) == 0 {
		return "", nil
	}
	var unknown []string
	for _, n := range names {
		v, ok := s.aggs.Load(tenant + "\x00" + n)
		switch {
		case !ok || time.Since(v.(aggCheck).at) > aggCheckTTL:
			unknown = append(unknown, n)
		case v.(aggCheck).aggregate:
			return n, nil
		}
	}
	if len(unknown) == 0 {
		return "", nil
	}
	aggs, err := s.cfg.Aggregates(ctx, tenant, unknown)
	if err != nil {
		return "", err
	}
	now := time.Now()
	for _, n := range unknown {
		s.aggs.Store(tenant+"\x00"+n, aggCheck{aggregate: slices.Contains(aggs, n), at: now})
	}
	if len(aggs) > 0 {
		return aggs[0], nil
	}
	return "", nil
}
