package pgshard

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/rawsock"
)

// maxPreparedPerConn bounds the server-side prepared statements one backend
// keeps for the proxy, so that many distinct statements cannot exhaust a
// backend's memory.
const maxPreparedPerConn = 512

// Conn is one backend connection taken over from pgconn after startup and
// authentication, so that the proxy can forward protocol messages as they are.
// Every message to and from the backend goes through Send and Receive, which
// keep what the proxy knows of the backend (transaction status, parameters,
// prepared statements, open portals) in step with what the backend did.
type Conn struct {
	Node, Tenant string
	fe           *pgproto3.Frontend
	// TxStatus is the status of the last ReadyForQuery the backend sent.
	TxStatus byte
	// Settings is the fingerprint of the session settings last replayed on
	// this backend (see the proxy's session state).
	Settings string
	// Params are the ParameterStatus values the server reported.
	Params map[string]string
	// StartupParams are the values it reported at startup, which RESET ALL
	// returns to: a new client is told these, not what the last session
	// that used the backend set.
	StartupParams map[string]string
	// Wrote is set once a statement of the backend's current transaction
	// reported a command tag that changes data (NoteCommand). A commit
	// across nodes prepares such a participant at once and asks the others
	// whether they wrote; it is cleared when the backend joins a
	// transaction or goes back to the pool.
	Wrote bool
	// Untracked is set while the backend ran a statement that may have
	// left session state the proxy does not track (a function, DO, CALL:
	// router.Hides). The proxy probes it before it goes back to the pool
	// and clears it; Release closes a backend still marked.
	Untracked bool

	net       net.Conn
	pid       uint32
	secretKey []byte
	cancelTo  string
	broken    bool
	held      bool // taken with AcquireHeld
	pinned    bool // kept by its session across transactions (pin.go)
	lastUsed  time.Time
	pool      *pool // the pool it came from; Release gives it back only there
	// node is the per-node budget the backend holds a token of while it is
	// open (caps.go); user, the per-user one it holds while a session uses it.
	node   *nodeCap
	user   *userCap
	closed atomic.Bool
	// checkParam is PoolConfig.CheckParam; refusal, its error that broke
	// the connection.
	checkParam func(name, value string) error
	refusal    error
	// failedText is the text of the Parse or Query the backend's last
	// error answered, "" for another request: the statement an error's
	// position points into.
	failedText string

	prepared map[string]string // statement key -> server-side name
	names    map[string]string // server-side name -> statement key
	prepSeq  uint64
	toClose  []string        // evicted statement names to close with the next batch
	portals  map[string]bool // named portals open on the backend
	// mu guards pending: a LISTEN backend is read by its own goroutine
	// while the session sends to it.
	mu sync.Mutex
	// pending[head:] are the requests sent whose answers change the state
	// above, in the order the backend answers them (push, pop).
	pending []request
	head    int
}

// backendUserTimeout bounds how long a statement's bytes may wait unacknowledged
// for a node before the backend's socket fails: a proxy cut off from Redis
// and from a node stops serving about 4 s after the partition began
// (presenceUserTimeout), and what it sent before then is in the node or
// dropped 8 s later still, well before the node can end its presence
// session (23 s at the soonest) and a coordinator count the proxy as not
// serving. Without it a statement held back by the partition was
// retransmitted once it healed and ran after the flip and the release:
// TestPartitions saw an INSERT reach a fold's dropped source 5 s after the
// partition ended. Not shorter: the kernel also fails a socket whose node
// reads nothing for that long with its buffer full (a large pipeline or
// COPY behind a lock wait), a statement that would otherwise have run.
const backendUserTimeout = 8 * time.Second

func connect(ctx context.Context, node, tenant, dsn string, maxMessage int) (*Conn, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	// pgconn's own dialer, with the user timeout.
	cfg.DialFunc = withUserTimeout(&net.Dialer{KeepAlive: 5 * time.Minute, Timeout: cfg.ConnectTimeout}, backendUserTimeout).DialContext
	return connectConfig(ctx, node, tenant, cfg, maxMessage)
}

// connectConfig opens a backend with pgconn and takes its socket over.
func connectConfig(ctx context.Context, node, tenant string, cfg *pgconn.Config, maxMessage int) (*Conn, error) {
	pc, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	// A write of startup that took pgconn more than 15 ms (a loaded
	// machine deschedules the writer) started pgconn's background reader,
	// which may still sit in a read of the socket: it would take the
	// backend's first answer to the proxy, and the session would wait for
	// it forever. SyncConn waits that reader out.
	if err := pc.SyncConn(ctx); err != nil {
		pc.Close(ctx)
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	hj, err := pc.Hijack()
	if err != nil {
		pc.Close(ctx)
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	// The proxy reads synchronously, so it talks to the socket directly:
	// nothing is left unread and no other reader is left.
	nc := rawsock.Wrap(hj.Conn)
	fe := pgproto3.NewFrontend(nc, nc)
	fe.SetMaxBodyLen(maxMessage)
	c := &Conn{
		Node:      node,
		Tenant:    tenant,
		fe:        fe,
		TxStatus:  hj.TxStatus,
		Params:    hj.ParameterStatuses,
		net:       nc,
		pid:       hj.PID,
		secretKey: hj.SecretKey,
		cancelTo:  hj.Conn.RemoteAddr().String(),
		prepared:  make(map[string]string),
		names:     make(map[string]string),
		portals:   make(map[string]bool),
		lastUsed:  time.Now(),
	}
	c.StartupParams = maps.Clone(hj.ParameterStatuses)
	if cfg.Host != "" && cfg.Host[0] == '/' {
		c.cancelTo = "unix:" + hj.Conn.RemoteAddr().String()
	} else {
		c.cancelTo = net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	}
	return c, nil
}

// NoteCommand records a statement's command tag (Wrote). Tags of
// statements that read are let through: a SELECT may still have written
// through a function, which the commit asks the server about.
func (c *Conn) NoteCommand(tag []byte) {
	if !c.Wrote && !readTag(tag) {
		c.Wrote = true
	}
}

// readTags are the command tags of statements that change no rows.
var readTags = [][]byte{
	[]byte("SELECT"), []byte("SHOW"), []byte("FETCH"), []byte("MOVE"), []byte("BEGIN"), []byte("SET"),
	[]byte("RESET"), []byte("DECLARE CURSOR"), []byte("CLOSE CURSOR"), []byte("SAVEPOINT"),
	[]byte("RELEASE"), []byte("ROLLBACK"), []byte("EXPLAIN"), []byte("DEALLOCATE"), []byte("DISCARD"),
	[]byte("PREPARE"), []byte("LISTEN"), []byte("UNLISTEN"),
}

func readTag(tag []byte) bool {
	for _, r := range readTags {
		if bytes.HasPrefix(tag, r) && (len(tag) == len(r) || tag[len(r)] == ' ') {
			return true
		}
	}
	return false
}

// PID is the backend process id, for logs.
func (c *Conn) PID() uint32 { return c.pid }

// SetDeadline bounds the next reads and writes on the backend socket.
func (c *Conn) SetDeadline(t time.Time) error { return c.net.SetDeadline(t) }

// MarkBroken makes Release close the connection instead of pooling it: its
// protocol state is unknown after an I/O error or an abandoned exchange.
func (c *Conn) MarkBroken() { c.broken = true }

// Broken reports whether the connection must not be reused.
func (c *Conn) Broken() bool { return c.broken }

// Refusal is the error of PoolConfig.CheckParam that broke the connection,
// or nil.
func (c *Conn) Refusal() error { return c.refusal }

// Close closes the socket after a polite Terminate.
func (c *Conn) Close() {
	if c.closed.Swap(true) {
		return
	}
	c.node.give()
	c.fe.Send(&pgproto3.Terminate{})
	_ = c.net.SetWriteDeadline(time.Now().Add(time.Second))
	_ = c.fe.Flush()
	_ = c.net.Close()
}

// Prepared returns the server-side name under which key (a rendered statement
// and its parameter types) is prepared on this backend. The key is a byte
// buffer the caller reuses: the lookup makes no string of it, and every Bind
// of the extended protocol looks one up.
func (c *Conn) Prepared(key []byte) (string, bool) {
	name, ok := c.prepared[string(key)]
	return name, ok
}

// AddPrepared allocates a server-side name for key. The caller sends the Parse
// (Send), and Receive forgets the name again if the backend did not run it.
// When the backend holds too many statements, one is evicted and closed with
// the next batch (TakeEvicted).
func (c *Conn) AddPrepared(key string) string {
	if len(c.prepared) >= maxPreparedPerConn {
		for _, name := range c.prepared {
			c.forgetName(name)
			c.toClose = append(c.toClose, name)
			break
		}
	}
	c.prepSeq++
	name := "lattice_" + strconv.FormatUint(c.prepSeq, 36)
	c.prepared[key] = name
	c.names[name] = key
	return name
}

// forgetName drops the statement the proxy prepared under name.
func (c *Conn) forgetName(name string) {
	if key, ok := c.names[name]; ok {
		delete(c.names, name)
		if c.prepared[key] == name {
			delete(c.prepared, key)
		}
	}
}

// ForgetAllPrepared follows DISCARD ALL or DEALLOCATE ALL run on the backend.
func (c *Conn) ForgetAllPrepared() {
	c.prepared = make(map[string]string)
	c.names = make(map[string]string)
	c.toClose = nil
}

// TakeEvicted returns the statement names to close on the backend.
func (c *Conn) TakeEvicted() []string {
	out := c.toClose
	c.toClose = nil
	return out
}

// PortalOpen reports whether the named portal exists on the backend, or will
// once the requests sent so far are answered: binding that name again needs
// a Close first.
func (c *Conn) PortalOpen(name string) bool {
	if c.portals[name] {
		return true
	}
	for _, r := range c.queued() {
		if r.kind == reqBind && r.name == name {
			return true
		}
	}
	return false
}

// Cancel asks the node to cancel whatever this backend is running, over a new
// connection, as PostgreSQL's CancelRequest works.
func (c *Conn) Cancel(ctx context.Context) error {
	var d net.Dialer
	network, addr := "tcp", c.cancelTo
	if len(addr) > 5 && addr[:5] == "unix:" {
		network, addr = "unix", addr[5:]
	}
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	buf, err := (&pgproto3.CancelRequest{ProcessID: c.pid, SecretKey: c.secretKey}).Encode(nil)
	if err != nil {
		return err
	}
	if _, err := nc.Write(buf); err != nil {
		return err
	}
	// The server closes the connection once it has handled the request.
	_, _ = nc.Read(make([]byte, 1))
	return nil
}
