package pgshard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// A proxy's presence: one idle session per node, named after the proxy,
// held for as long as the proxy runs. PostgreSQL ends it when the proxy's
// process dies (its socket closes) or its host goes silent (the keepalives
// below), so a coordinator that cannot find a proxy live in Redis but finds
// its presence on the nodes knows the proxy is cut off from Redis, not
// dead, and may still be serving from its cached maps: it waits for it.

// presenceRetry is the pause between attempts to open a presence session.
const presenceRetry = time.Second

// presenceNodeTimeout makes the node end a presence session whose proxy
// host went silent within about 30 to 40 s, rather than the system's two
// hours, and no sooner than 23 s after the partition began: the node
// counts from the last packet it took for a sign of life, which can be its
// own last probe's answer, up to 7 s before the partition
// (presenceParams' keepalives).
const presenceNodeTimeout = 30 * time.Second

// presenceParams are the presence session's settings on the node.
var presenceParams = map[string]string{
	"tcp_keepalives_idle":     "5",
	"tcp_keepalives_interval": "2",
	"tcp_keepalives_count":    "3",
	"tcp_user_timeout":        strconv.FormatInt(presenceNodeTimeout.Milliseconds(), 10),
}

// presenceUserTimeout is how long the proxy's side of a presence session
// waits for the node to answer its keepalive probes before the socket fails
// and the proxy stops serving from its cached maps: with a probe each
// second, at most about 4 s after the partition began, where the node ends
// the session no sooner than 23 s after it (presenceNodeTimeout). The
// proxy must stop first: a coordinator that sees the session gone counts
// the proxy as not serving.
const presenceUserTimeout = 3 * time.Second

// presencePrefix starts the application_name of every presence session.
const presencePrefix = "lattice proxy "

// PresenceName is the application_name of the presence sessions of proxy
// id of the deployment cluster (shardmap.Coordination.ClusterID). The id
// is hashed: application_name is cut at 63 bytes, and a cut could make two
// proxies one.
func PresenceName(cluster, id string) string {
	sum := sha256.Sum256([]byte(id))
	return presencePrefix + cluster + "/" + hex.EncodeToString(sum[:8])
}

// Presence holds a proxy's presence sessions on every node, following the
// cluster's node set as it changes.
type Presence struct {
	cluster *Cluster
	name    string
	log     *slog.Logger

	mu   sync.Mutex
	held map[string]heldSession // by node; absent while none is open
}

type heldSession struct {
	since time.Time // when it was opened
	net   net.Conn
}

// presenceCheck is how often an idle presence session is looked at, to open
// it again once it ended. HeldSince looks for itself.
const presenceCheck = 500 * time.Millisecond

// NewPresence returns the presence of the proxy named name (PresenceName)
// on the nodes of c. It holds nothing until Run.
func NewPresence(c *Cluster, name string, log *slog.Logger) *Presence {
	if log == nil {
		log = slog.Default()
	}
	return &Presence{cluster: c, name: name, log: log, held: map[string]heldSession{}}
}

// Run holds a session on every node until ctx ends, opening it again
// whenever it ends. A node that joins the cluster gets one; a node that
// leaves it, or whose DSN changes, has its session closed (and opened
// again over the new DSN).
func (p *Presence) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	running := map[string]presenceHold{}
	for {
		changed := p.cluster.Changed()
		want := map[string]Node{}
		for _, n := range p.cluster.Nodes() {
			want[n.Name] = n
		}
		for name, h := range running {
			if n, ok := want[name]; !ok || n != h.node {
				h.stop()
				delete(running, name)
			}
		}
		for name, n := range want {
			if _, ok := running[name]; ok {
				continue
			}
			hctx, stop := context.WithCancel(ctx)
			running[name] = presenceHold{node: n, stop: stop}
			wg.Go(func() { p.hold(hctx, n) })
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// presenceHold is one node's running hold.
type presenceHold struct {
	node Node
	stop context.CancelFunc
}

// HeldSince reports whether the session on every node was opened at or
// before t and is still open. It looks at each session's socket itself
// rather than trusting what a watching goroutine last saw: a node ends a
// session by writing to it (the FATAL before it closes), so a session with
// anything to read has ended, even if this process was stopped meanwhile
// and its goroutines have not run since.
func (p *Presence) HeldSince(t time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.cluster.Nodes() {
		h, ok := p.held[n.Name]
		if !ok || h.since.After(t) || (h.net != nil && !quiet(h.net)) {
			return false
		}
	}
	return true
}

// mark records node's session as opened at since over nc, or, with a zero
// since, as ended. A hold ends only its own session: when a node's entry
// changes (a drain sets Draining), Run starts a new hold for it before the
// old one has stopped, and the old one must not end the new one's.
func (p *Presence) mark(node string, since time.Time, nc net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !since.IsZero() {
		p.held[node] = heldSession{since: since, net: nc}
	} else if h, ok := p.held[node]; ok && h.net == nc {
		delete(p.held, node)
	}
}

// open reports whether node's session over nc is still open, under the
// lock that HeldSince takes, so that no two peeks at one socket run at
// once. It peeks only at nc, the caller's own socket: peeking at another
// hold's socket while that hold closed it waited for the socket's read
// lock with the lock held, and hung a proxy's shutdown after a drain.
func (p *Presence) open(node string, nc net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.held[node]
	return ok && h.net == nc && (nc == nil || quiet(nc))
}

func (p *Presence) hold(ctx context.Context, n Node) {
	failing := false
	for ctx.Err() == nil {
		conn, err := p.connect(ctx, n)
		if err == nil {
			// Marked once open, a little after the node shows it: early
			// enough for HeldSince, which must never answer true too soon.
			nc := conn.PgConn().Conn()
			p.mark(n.Name, time.Now(), nc)
			if failing {
				p.log.Info("pgshard: presence session open again", "node", n.Name)
			}
			failing = false
			for ctx.Err() == nil && p.open(n.Name, nc) {
				select {
				case <-ctx.Done():
				case <-time.After(presenceCheck):
				}
			}
			p.mark(n.Name, time.Time{}, nc)
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			cancel()
			err = errors.New("the node ended the session")
		}
		if ctx.Err() != nil {
			return
		}
		if !failing {
			p.log.Warn("pgshard: presence session on node lost; a proxy cut off from Redis now refuses statements", "node", n.Name, "err", err)
			failing = true
		}
		select {
		case <-ctx.Done():
		case <-time.After(presenceRetry):
		}
	}
}

func (p *Presence) connect(ctx context.Context, n Node) (*pgx.Conn, error) {
	dsn, err := p.cluster.connString(n, "")
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: %w", n.Name, err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: %w", n.Name, err)
	}
	cfg.RuntimeParams["application_name"] = p.name
	for k, v := range presenceParams {
		cfg.RuntimeParams[k] = v
	}
	// The proxy's side gives up on a silent node well before the node gives
	// up on it: probes every second, and the socket fails once one has gone
	// unanswered for presenceUserTimeout (docs/DESIGN.md section 12).
	d := withUserTimeout(&net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 3}}, presenceUserTimeout)
	cfg.DialFunc = d.DialContext
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgshard: presence session on node %s: %w", n.Name, err)
	}
	return conn, nil
}

// Present returns the application_names of the presence sessions of the
// deployment cluster on node (every database's sessions), read after
// Present was called. The coordinator asks the catalog node: every proxy
// holds a session there, and a proxy cut off from Redis serves from its
// cached maps only while it is present on every node it knows, so the
// catalog node shows every such proxy. A node added since a proxy was cut
// off does not: the proxy never learnt of it.
//
// A node's looks run one at a time on a connection of their own, kept
// open (lookPool), and calls share them (looks): a call waits for the
// node's next look, never one already under way, which would have read
// the sessions before the call.
func (c *Cluster) Present(ctx context.Context, cluster, node string) (map[string]bool, error) {
	l := c.looks.join(lookKey{node: node, cluster: cluster})
	select {
	case <-l.done:
		if l.err != nil {
			return nil, fmt.Errorf("pgshard: presence sessions on %s: %w", node, l.err)
		}
		// A copy: calls share the look, and a caller may change its answer.
		return maps.Clone(l.val), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("pgshard: presence sessions on %s: %w", node, ctx.Err())
	}
}

// lookKey names a node's looks for one deployment's presence sessions.
type lookKey struct{ node, cluster string }

// presentTimeout bounds one look. No caller cancels a look, which others
// may share: a query cancelled midway closes its connection, and the next
// look would open a new one.
const presentTimeout = 10 * time.Second

// look reads k.node's presence sessions, once more on a new connection if
// the kept one turned out broken (the node restarted since the last look).
func (c *Cluster) look(k lookKey) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), presentTimeout)
	defer cancel()
	names, broken, err := c.present(ctx, k.cluster, k.node)
	if err != nil && broken && ctx.Err() == nil {
		names, _, err = c.present(ctx, k.cluster, k.node)
	}
	return names, err
}

// present reads node's presence sessions; broken reports a failure that
// closed the connection.
func (c *Cluster) present(ctx context.Context, cluster, node string) (_ map[string]bool, broken bool, _ error) {
	p, err := c.lookPool(ctx, node)
	if err != nil {
		return nil, false, err
	}
	conn, err := p.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("node %s: %w", node, err)
	}
	defer conn.Release()
	// The proxy refuses the prefix in clients' application_name; the role
	// check keeps sessions of other roles out too (presence and this probe
	// connect as the node's own user).
	rows, err := conn.Query(ctx, `SELECT DISTINCT application_name FROM pg_stat_activity WHERE application_name LIKE $1 AND usename = current_user`,
		presencePrefix+cluster+"/%")
	if err == nil {
		var names []string
		if names, err = pgx.CollectRows(rows, pgx.RowTo[string]); err == nil {
			out := make(map[string]bool, len(names))
			for _, n := range names {
				out[n] = true
			}
			return out, false, nil
		}
	}
	return nil, conn.Conn().IsClosed(), fmt.Errorf("node %s: %w", node, err)
}

// warmTimeout bounds WarmPresence: opening a connection took up to 400 ms
// in make bench's point-select run, and a node that does not answer must
// not hold up a freeze, whose look then reports it.
const warmTimeout = 2 * time.Second

// WarmPresence opens the connection of Present's looks on the catalog node
// if it has none, and looks once on it, so that a freeze's first look
// neither opens a connection inside its write pause nor runs as a new
// backend's first query (prepared, over cold catalog caches): measured,
// those made the first freezes of a reshard the slowest. A node that
// cannot be reached is left to the look to report.
func (c *Cluster) WarmPresence(ctx context.Context, cluster string) {
	ctx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	node := c.Catalog().Name
	p, err := c.lookPool(ctx, node)
	if err != nil {
		return
	}
	if s := p.Stat(); s.IdleConns()+s.AcquiredConns() > 0 {
		return // open; a look may hold it meanwhile
	}
	_, _, _ = c.present(ctx, cluster, node)
}
