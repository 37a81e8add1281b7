// Command lattice is the Lattice proxy: `serve` runs it, `demo` starts a
// local cluster with it, `passwd` makes a users-file line, `status`,
// `shards`, `reshard`, `nodes` and `node` ask a running proxy's admin API,
// and `recover-map` rebuilds lost shard maps from the nodes.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lattice-db/lattice/admin"
	"github.com/lattice-db/lattice/migrator"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/procs"
	"github.com/lattice-db/lattice/proxy"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/secret"
	"github.com/lattice-db/lattice/shardmap"
)

const usage = `lattice: a PostgreSQL proxy that shards tables and reshards them online.

Usage:
  lattice serve  --node NAME=DSN [--node NAME=DSN ...] [flags]   run the proxy
  lattice demo   [--data DIR]                                    local cluster with sample data
  lattice passwd USER [TENANTS]                                  print a users-file line (reads the password from stdin)
  lattice status  [--admin URL] [--tenant T]                     proxies, trees and running reshards
  lattice shards  TREE [--admin URL] [--tenant T]                a tree's shards with size estimates
  lattice reshard TREE N [--wait] [--admin URL] [--tenant T]     reshard a tree to N shards; --wait shows progress until done
  lattice nodes  [--admin URL] [--tenant T]                      the registered nodes, with the tenant's shards, slots and size on each
  lattice node add NAME DSN [--admin URL]                        check a PostgreSQL server and add it (the DSN without password)
  lattice node remove NAME [--admin URL]                         remove a node that holds no shard
  lattice recover-map --redis URL --node NAME=DSN [...]          rebuild the shard maps Redis lost, from the nodes

--admin defaults to $LATTICE_ADMIN, else http://127.0.0.1:9090. A proxy with an
admin token wants it in --admin-token-file FILE or $LATTICE_ADMIN_TOKEN.

Run 'lattice serve -h' for the flags. Every flag can also be set as an
environment variable: --users-file is LATTICE_USERS_FILE.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "serve":
		err = serveCmd(ctx, os.Args[2:])
	case "demo":
		err = demoCmd(ctx, os.Args[2:])
	case "passwd":
		err = passwdCmd(os.Args[2:], os.Stdin, os.Stdout)
	case "status":
		err = newCLI().statusCmd(ctx, os.Args[2:])
	case "shards":
		err = newCLI().shardsCmd(ctx, os.Args[2:])
	case "reshard":
		err = newCLI().reshardCmd(ctx, os.Args[2:])
	case "nodes":
		err = newCLI().nodesCmd(ctx, os.Args[2:])
	case "node":
		err = newCLI().nodeCmd(ctx, os.Args[2:])
	case "recover-map":
		err = recoverMapCmd(ctx, os.Args[2:], os.Stdout)
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "lattice: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lattice:", err)
		os.Exit(1)
	}
}

// nodeFlags collects repeated --node NAME=DSN values.
type nodeFlags []pgshard.Node

func (n *nodeFlags) String() string {
	parts := make([]string, len(*n))
	for i, x := range *n {
		parts[i] = x.Name
	}
	return strings.Join(parts, ",")
}

func (n *nodeFlags) Set(v string) error {
	for _, item := range strings.Fields(v) {
		name, dsn, ok := strings.Cut(item, "=")
		if !ok || name == "" || dsn == "" {
			return fmt.Errorf("node %q: want NAME=DSN", secret.Redact(item))
		}
		*n = append(*n, pgshard.Node{Name: name, DSN: dsn})
	}
	return nil
}

// serveConfig is everything `serve` takes.
type serveConfig struct {
	Listen, Admin, Redis, UsersFile, LogLevel string
	RedisURLFile, NodesFile                   string
	AdminTokenFile, AdminAllowedHosts         string
	AdminTLSCert, AdminTLSKey                 string
	PgPass                                    string
	AllowExtensions                           string
	TLSCert, TLSKey                           string
	TLSRequired                               bool
	Nodes                                     nodeFlags
	MaxClients, PoolSize, MaxListeners        int
	MaxPinned                                 int
	PrepareSimple                             bool
	MaxNodeBackends, MaxUserBackends          int
	PoolAcquireTimeout                        time.Duration
	MaxStartups, MaxStartupsPerHost           int
	MaxPreparedStatements, MaxPortals         int
	MaxMessageMemory                          byteSize
	IdleInTransactionTimeout                  time.Duration
	StartupTimeout, StatementTimeout          time.Duration
	MaxMergeMemory                            byteSize
	TxRecoverEvery, TxAbortAfter              time.Duration

	Coordinator bool
	Reshard     migrator.CoordinatorOptions
	Autonomic   migrator.AutonomicOptions
	Migration   migrator.Options
	ProxyLease  time.Duration
	LoadStats   bool
	LoadPublish time.Duration
}

func (c *serveConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:6432", "address for PostgreSQL clients")
	fs.StringVar(&c.Admin, "admin", "127.0.0.1:9090", "address of the admin HTTP endpoint (/healthz, /readyz, /metrics, the JSON API under /api/ and the page at /); the API can start reshards, so an address other than loopback needs an admin token")
	fs.StringVar(&c.AdminTokenFile, "admin-token-file", "", "file holding the admin token (also $"+adminTokenEnv+"), required for every admin path but /healthz, /readyz and /metrics: as 'Authorization: Bearer TOKEN', or through the page's sign-in form; without a token the admin endpoint must be on loopback and pprof is off")
	fs.StringVar(&c.AdminAllowedHosts, "admin-allowed-hosts", "", "comma-separated Host header values the admin endpoint accepts besides the listen address, localhost, 127.0.0.1 and [::1] with its port (NAME for any port, NAME:PORT for one); stops DNS-rebinding pages")
	fs.StringVar(&c.AdminTLSCert, "admin-tls-cert", "", "PEM certificate (chain): serve the admin endpoint over HTTPS")
	fs.StringVar(&c.AdminTLSKey, "admin-tls-key", "", "PEM private key of --admin-tls-cert")
	fs.StringVar(&c.Redis, "redis", "", "Redis URL for the shard map (redis://host:port/db or redis-sentinel://h1:p,h2:p/master); empty runs an embedded in-process server whose state is lost on exit. Any local user can read argv in /proc: give a URL with a password through --redis-url-file or $"+redisURLEnv+" instead")
	fs.StringVar(&c.RedisURLFile, "redis-url-file", "", "file holding the Redis URL (instead of --redis; also $"+redisURLEnv+")")
	fs.Var(&c.Nodes, "node", "a PostgreSQL node as NAME=DSN, repeatable; the first is the catalog node. Seeds the node registry in Redis only when it is empty; after that the registry (lattice_add_node, lattice_remove_node) is the node set. A password in the DSN stays in this process and never goes to Redis, but argv is readable in /proc: keep passwords out of it (--pgpass, --nodes-file or $LATTICE_NODE)")
	fs.StringVar(&c.NodesFile, "nodes-file", "", "file of NAME=DSN lines, one node a line, read after the --node flags")
	fs.StringVar(&c.PgPass, "pgpass", "", "pgpass file (PostgreSQL's format, host:port:database:user:password) with the passwords of the nodes, whose registered DSNs carry none; without it PGPASSWORD, PGPASSFILE and ~/.pgpass apply")
	fs.StringVar(&c.AllowExtensions, "allow-extensions", strings.Join(router.DefaultExtensions, ","), "comma-separated extensions a client may CREATE EXTENSION; any other is refused with SQLSTATE 42501 (the default is PostgreSQL 15's trusted extensions, none of which reads files or connects out)")
	fs.StringVar(&c.UsersFile, "users-file", "", "SCRAM-SHA-256 users file; without it every user is trusted, which is allowed only on a loopback listener")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "PEM certificate (chain) offered to clients that ask for TLS; without it SSLRequest is declined")
	fs.StringVar(&c.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.BoolVar(&c.TLSRequired, "tls-required", false, "refuse clients that do not use TLS (SQLSTATE 28000); needs --tls-cert")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&c.MaxClients, "max-clients", 1000, "most client connections at once, those still in startup included")
	fs.IntVar(&c.MaxStartups, "max-startups", proxy.DefaultMaxStartups, "most client connections in startup (before authentication completes) at once; more are refused with SQLSTATE 53300 at once, so silent sockets cannot use up file descriptors")
	fs.IntVar(&c.MaxStartupsPerHost, "max-startups-per-host", proxy.DefaultMaxStartupsPerHost, "most client connections in startup at once from one source address")
	fs.IntVar(&c.PoolSize, "pool-size", 32, "most backend connections per node and tenant")
	fs.IntVar(&c.MaxNodeBackends, "max-node-backends", pgshard.DefaultMaxNodeConns, "most backend connections this proxy opens on one node, idle or in use, across every tenant; an idle one of another tenant is closed to make room, else a statement waits, then fails with SQLSTATE 53300. Keep it, times the number of proxies, below the node's max_connections less what the control role needs")
	fs.IntVar(&c.MaxUserBackends, "max-user-backends", 0, "most backend connections one user's sessions use at once, across nodes and tenants; past it a statement waits, then fails with SQLSTATE 53300 (default: the larger of --pool-size and --max-node-backends)")
	fs.DurationVar(&c.PoolAcquireTimeout, "pool-acquire-timeout", 10*time.Second, "how long a statement waits for a backend (a free one of --pool-size, room on the node, the user's share) before it fails with SQLSTATE 53300")
	fs.IntVar(&c.MaxListeners, "max-listeners", 0, "most sessions per tenant that hold a catalog-node backend for LISTEN, counted within --pool-size; 0 means half of --pool-size")
	fs.BoolVar(&c.PrepareSimple, "prepare-simple", true, "run a simple-protocol statement on one shard as a statement prepared once per backend, its constants bound as parameters of the literals' own types, so that PostgreSQL does not parse and plan it for every query (docs/DESIGN.md, the request path); false runs every statement as its text")
	fs.IntVar(&c.MaxPinned, "max-pinned", 0, "most sessions at once that keep a catalog-node backend for session state the proxy cannot replay (temp tables, session advisory locks, PREPARE, WITH HOLD cursors, set_config(..., false)), counted within --pool-size; more are refused with SQLSTATE 53300 (default: half of --pool-size, so pinned sessions never take every catalog-node backend)")
	fs.DurationVar(&c.StartupTimeout, "startup-timeout", 10*time.Second, "a client must finish startup and authentication within this")
	fs.DurationVar(&c.IdleInTransactionTimeout, "idle-in-transaction-timeout", proxy.DefaultIdleInTransactionTimeout, "end a session that waits inside a transaction for longer than this (SQLSTATE 25P03), rolling back and returning its backends; no client setting lifts it; 0 turns it off")
	fs.DurationVar(&c.StatementTimeout, "statement-timeout", 0, "statement_timeout of sessions that set none at startup; a client's SET overrides it; 0 leaves the nodes' own")
	c.MaxMergeMemory = proxy.DefaultMaxMergeMemory
	fs.Var(&c.MaxMergeMemory, "max-merge-memory", "most row data one statement over several shards holds in the proxy while merging (bytes, or with kB, MB, GB); more fails with SQLSTATE 53200")
	c.MaxMessageMemory = proxy.DefaultMaxMessageMemory
	fs.Var(&c.MaxMessageMemory, "max-message-memory", "most bytes of large client messages (over 64kB) held at once across all sessions while they arrive; a session whose message does not fit ends with SQLSTATE 53200")
	fs.IntVar(&c.MaxPreparedStatements, "max-prepared-statements", proxy.DefaultMaxPreparedStatements, "most named protocol-level prepared statements per session; more fail with SQLSTATE 54000")
	fs.IntVar(&c.MaxPortals, "max-portals", proxy.DefaultMaxPortals, "most named portals open per session; more fail with SQLSTATE 54000")
	fs.DurationVar(&c.TxRecoverEvery, "tx-recover-interval", 10*time.Second, "how often to look for prepared transactions across nodes that a crashed proxy left behind")
	fs.DurationVar(&c.TxAbortAfter, "tx-abort-after", time.Minute, "roll back a prepared transaction across nodes that has no commit decision after this long, even if the transaction that would decide it is still open; should exceed any prepare phase")
	fs.BoolVar(&c.Coordinator, "coordinator", true, "run reshard coordinators in this proxy (at least one proxy must)")
	fs.IntVar(&c.Reshard.MaxConcurrentMigrations, "max-concurrent-migrations", 4, "splits or folds one reshard keeps in flight")
	fs.DurationVar(&c.Reshard.Tick, "reshard-tick", 2*time.Second, "how often a reshard coordinator plans; an intent stored in any proxy, or a migration ended in this one, starts a plan at once")
	fs.DurationVar(&c.Reshard.LeaseTTL, "reshard-lease", time.Minute, "a coordinator's lease; another proxy takes over a reshard this long after its coordinator died")
	fs.DurationVar(&c.Reshard.EmptyTreeProbeBudget, "empty-probe-budget", 10*time.Second, "ceiling on the emptiness probe of lattice_reshard")
	fs.BoolVar(&c.Autonomic.Split, "autosplit", true, "run the hot-shard split monitor: a shard hot for --autosplit-window is split at the slot that halves its load (a tree can turn it off with lattice_set_tree_option(tree, 'autosplit', false)); needs --coordinator")
	fs.BoolVar(&c.Autonomic.Heal, "autoheal", true, "run over-split healing: a tree quiet and uniform for --autoheal-window folds adjacent cold pairs, never below the shard count of its creation or last reshard (lattice_set_tree_option(tree, 'autoheal', false) turns it off for a tree); needs --coordinator")
	fs.IntVar(&c.Autonomic.Policy.MaxShards, "max-physical-shards-per-tree", 256, "the split monitor grows no tree past this many shards; a reshard may, and such a tree stops splitting autonomically")
	fs.Float64Var(&c.Autonomic.Policy.SplitWrites, "autosplit-rows-per-second", 1000, "a shard writing more rows a second than this is hot; healing folds only pairs writing under a tenth of it together")
	fs.Float64Var(&c.Autonomic.Policy.SplitMeanMultiple, "autosplit-mean-multiple", 4, "a shard writing more than this multiple of its tree's mean per shard (and a tenth of --autosplit-rows-per-second) is hot")
	fs.DurationVar(&c.Autonomic.Policy.SplitWindow, "autosplit-window", time.Minute, "how long a shard stays hot before the monitor splits it, and the pause after a split before the next")
	fs.DurationVar(&c.Autonomic.Policy.HealWindow, "autoheal-window", 10*time.Minute, "how long a tree stays quiet and uniform, counted again after each split, before healing folds")
	fs.DurationVar(&c.Autonomic.Tick, "autonomic-interval", 5*time.Second, "how often the split monitor and healing pass over the trees")
	fs.DurationVar(&c.Migration.FreezeBudget, "freeze-budget", 2*time.Second, "longest write pause of one freeze; a freeze that does not fit is rolled back and retried")
	fs.Int64Var(&c.Migration.FreezeLag, "freeze-lag", 256<<10, "replication lag in bytes under which a migration freezes")
	fs.IntVar(&c.Migration.CopyWorkers, "copy-workers", 1, "connection pairs (one to each node, 1 to 16) a move's or a resize's copy uses at once, each copying a page range of the shard; more go faster only where the nodes have idle cores (on 2 cores shared by both nodes one was fastest), and each holds a connection more on each node")
	fs.IntVar(&c.Migration.ReleaseBatch, "release-batch", 10000, "about how many rows of a split's source one release transaction scans for moved rows to delete")
	fs.BoolFunc("verify-moves", "compare each move's slots on source and target, under snapshots taken in the freeze, before its source is released (true or false; default true)", func(v string) error {
		on, err := strconv.ParseBool(v)
		c.Migration.SkipVerify = !on
		return err
	})
	fs.DurationVar(&c.Migration.VerifyTimeout, "verify-timeout", time.Minute, "statement_timeout of each statement of a move's verification")
	fs.BoolVar(&c.LoadStats, "load-stats", true, "count statements and rows written per slot of each tree and publish them to Redis, for the load rates of lattice_shards, /metrics, the admin API and the page")
	fs.DurationVar(&c.LoadPublish, "load-publish-interval", shardmap.DefaultLoadPublish, "how often this proxy adds its load counts into Redis")
	fs.DurationVar(&c.ProxyLease, "proxy-lease", shardmap.DefaultLeaseTTL, "a proxy that cannot renew its registration in Redis for this long serves on from its cached maps only while it holds its sessions on every node (reshards wait for it), and otherwise refuses until it has re-read the maps")
}

// idleTimeout maps --idle-in-transaction-timeout 0 (off) to the proxy's
// "none".
func idleTimeout(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// planner is the proxy's statement planner, with the extensions clients
// may create.
func planner(cfg serveConfig) *router.Planner {
	var allow []string
	for _, e := range strings.Split(cfg.AllowExtensions, ",") {
		if e = strings.TrimSpace(e); e != "" {
			allow = append(allow, e)
		}
	}
	router.AllowExtensions(allow)
	return router.NewPlanner(10000)
}

// crashHookEnv names the test-only hook that makes the proxy kill itself at
// a point of every two-phase commit (after-prepare, after-decision), or
// stall there (stall-after-prepare); the crash-recovery integration tests
// set it. Read once at start.
const crashHookEnv = "LATTICE_TEST_CRASH_2PC"

// maxCopyWorkers bounds --copy-workers: each pair is a connection more on
// both nodes, times --max-concurrent-migrations.
const maxCopyWorkers = 16

// parseFlags parses args, then fills every flag not given on the command line
// from its LATTICE_* environment variable.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := "LATTICE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s: %w", env, e)
			}
		}
	})
	return err
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

func serveCmd(ctx context.Context, args []string) error {
	var cfg serveConfig
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.flags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if cfg.NodesFile != "" {
		if err := nodesFile(cfg.NodesFile, &cfg.Nodes); err != nil {
			return err
		}
	}
	log, err := newLogger(cfg.LogLevel)
	if err != nil {
		return err
	}
	return serve(ctx, cfg, log, nil)
}

// serve runs the proxy and the admin endpoint until ctx ends. ready, when
// set, receives the listening addresses.
func serve(ctx context.Context, cfg serveConfig, log *slog.Logger, ready func(pgAddr, adminAddr string)) error {
	// 0 takes the migrator's default of one pair (the demo sets no options).
	if n := cfg.Migration.CopyWorkers; n < 0 || n > maxCopyWorkers {
		return fmt.Errorf("--copy-workers %d: give 1 to %d connection pairs per copy", n, maxCopyWorkers)
	}
	var users *proxy.Users
	if cfg.UsersFile != "" {
		u, err := proxy.LoadUsers(cfg.UsersFile)
		if err != nil {
			return err
		}
		users = u
	} else if !loopback(cfg.Listen) {
		return fmt.Errorf("listening on %s without --users-file would trust every user: give a users file, or listen on a loopback address", cfg.Listen)
	}

	tlsConfig, err := clientTLS(cfg.TLSCert, cfg.TLSKey, cfg.TLSRequired)
	if err != nil {
		return err
	}
	access, adminTLS, err := adminAccess(cfg)
	if err != nil {
		return err
	}

	redisURL, err := loadRedisURL(cfg.Redis, cfg.RedisURLFile)
	if err != nil {
		return err
	}
	embedded := redisURL == ""
	if embedded {
		url, stopRedis, err := shardmap.StartEmbedded()
		if err != nil {
			return fmt.Errorf("embedded redis: %w", err)
		}
		defer stopRedis()
		redisURL = url
		log.Warn("no --redis given: running an embedded in-process Redis; the shard maps live in this process only, and are rebuilt from the nodes at its next start")
	}
	store, err := shardmap.OpenRedis(ctx, redisURL)
	if err != nil {
		return err
	}
	defer store.Close()

	cluster, err := openCluster(ctx, cfg, store, log)
	if err != nil {
		return err
	}
	defer cluster.Close()
	if embedded {
		// The embedded Redis starts empty on every run, while the nodes
		// keep the trees of the last one (make demo, run again): their
		// maps are rebuilt as recover-map rebuilds them.
		if err := rebuildMaps(ctx, cluster, store, migrator.RecoverOptions{}, log, logLines{log: log, msg: "shard maps rebuilt from the nodes for the embedded Redis"}); err != nil {
			return fmt.Errorf("rebuild the shard maps from the nodes for the embedded Redis: %w", err)
		}
	}

	cache := shardmap.NewCache(store, time.Second, log)
	cache.CheckNodes(cluster)
	if cfg.LoadStats {
		cache.CountLoad()
	}
	cacheCtx, stopCache := context.WithCancel(ctx)
	defer stopCache()
	go func() {
		if err := cache.Run(cacheCtx); err != nil && cacheCtx.Err() == nil {
			log.Error("shard map cache stopped", "err", err)
		}
	}()
	if cfg.LoadStats {
		go shardmap.NewLoadPublisher(cache, store, cfg.LoadPublish, log).Run(cacheCtx)
	}

	// Clients reach the nodes as their tenant's role, made on first use
	// through the control role of the node DSNs.
	cluster.SetVerifier(proxy.NewVerifier)
	pools := pgshard.NewPools(pgshard.PoolConfig{MaxConns: cfg.PoolSize, MaxHeld: cfg.MaxListeners,
		MaxNodeConns: cfg.MaxNodeBackends, MaxUserConns: cfg.MaxUserBackends, AcquireTimeout: cfg.PoolAcquireTimeout,
		Prepare: cluster.EnsureRole, CheckParam: checkReported}, cluster.ClientDSN)
	defer pools.Close()
	go reapIdle(ctx, pools)
	procs.Run(ctx, log)

	nodeWatch := shardmap.NewNodeWatch(store, time.Second, cluster.Seed, func(n *shardmap.Nodes) error {
		gone, err := cluster.ApplyRegistry(n)
		for _, node := range gone {
			pools.Forget(node)
		}
		return err
	}, log)
	if err := nodeWatch.Reload(ctx); err != nil {
		return err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		if err := nodeWatch.Run(watchCtx); err != nil && watchCtx.Err() == nil {
			log.Error("node registry watch stopped", "err", err)
		}
	}()

	twoPhase := proxy.NewTwoPhase(proxy.TwoPhaseConfig{
		Cluster:      cluster,
		RecoverEvery: cfg.TxRecoverEvery,
		AbortAfter:   cfg.TxAbortAfter,
		CrashAt:      os.Getenv(crashHookEnv),
		Log:          log,
	})
	recoverCtx, stopRecover := context.WithCancel(ctx)
	defer stopRecover()
	go twoPhase.RunRecoverer(recoverCtx)
	adm := admin.New(log)
	adm.TLS = adminTLS
	proxyID := newProxyID()
	metrics := migrator.NewMetrics(adm.Registry)
	runner := migrator.NewRunner(cluster, store, cfg.Migration, metrics, log)
	coord := migrator.NewCoordinator(proxyID, runner, cfg.Reshard, migrator.TreeOpInterlocks{Store: store, Log: log})
	treeOps := migrator.NewTreeOpRunner(proxyID, store, cfg.Reshard, log)
	reg := shardmap.NewRegistration(proxyID, store, cache, cfg.ProxyLease, 0, log)
	deployment, err := store.ClusterID(ctx)
	if err != nil {
		return err
	}
	if users != nil {
		secret, err := store.DeploymentSecret(ctx, "scram-mock-salt")
		if err != nil {
			return err
		}
		users.SetMockSecret(secret)
	}
	presence := pgshard.NewPresence(cluster, pgshard.PresenceName(deployment, proxyID), log)
	reg.ServeThroughLapses(presence)
	bgCtx, stopBackground := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer func() {
		stopBackground()
		bg.Wait()
	}()
	bg.Go(func() { presence.Run(bgCtx) })
	bg.Add(1)
	go func() {
		defer bg.Done()
		reg.Run(bgCtx)
	}()
	if cfg.Coordinator {
		// With the proxies counting load (--load-stats, the load signal's
		// flag), a window without a count is a quiet tree; without it,
		// no data. Set before the coordinator runs, which reads it.
		load := migrator.NewLoadSource(store, store, cfg.LoadStats)
		coord.SetLoad(load)
		bg.Add(1)
		go func() {
			defer bg.Done()
			coord.Run(bgCtx)
		}()
		bg.Go(func() { treeOps.Run(bgCtx) })
		if cfg.Autonomic.Split || cfg.Autonomic.Heal {
			opts := cfg.Autonomic
			opts.Tenants, opts.Statuses = store.TenantsWithTrees, store
			auto := migrator.NewAutonomic(coord, load, opts, adm.Registry)
			bg.Go(func() { auto.Run(bgCtx) })
		}
	}

	fns := migrator.NewFunctions(cluster, store, cache, coord, router.PerNodeValue)
	fns.SetTreeOps(treeOps)
	fns.SetSnapshotter(migrator.NewSnapshotter(runner, cluster, migrator.NewSnapshotMetrics(adm.Registry)))
	// A node gets the reference tables before its first shard; a change of
	// a table's copies waits for the proxies to hold its writes first.
	cluster.SetReferences(store, runner.SettleReference)
	fns.SetMerger(migrator.NewMerger(cluster, store, treeOps, migrator.NewMergeMetrics(adm.Registry), log))
	fns.SetNodeAdmin(migrator.NodeAdmin{Registry: store, Watch: nodeWatch, Requirements: pgshard.NodeRequirements{
		FreeSlots:            max(1, cfg.Reshard.MaxConcurrentMigrations),
		PreparedTransactions: 1,
	}})
	adm.API = newAdminAPI(cfg, proxyID, store, cache, reg, cluster, fns, log)
	adm.API.Nodes = adminNoder{fns}
	srv := proxy.NewServer(proxy.Config{
		Startup: proxy.StartupConfig{Users: users, StartupTimeout: cfg.StartupTimeout,
			TLS: tlsConfig, TLSRequired: cfg.TLSRequired},
		MaxClients:               cfg.MaxClients,
		MaxStartups:              cfg.MaxStartups,
		MaxStartupsPerHost:       cfg.MaxStartupsPerHost,
		MaxPreparedStatements:    cfg.MaxPreparedStatements,
		MaxPortals:               cfg.MaxPortals,
		MaxMessageMemory:         int64(cfg.MaxMessageMemory),
		IdleInTransactionTimeout: idleTimeout(cfg.IdleInTransactionTimeout),
		MaxPinned:                maxPinned(cfg.MaxPinned, cfg.PoolSize),
		SimpleAsText:             !cfg.PrepareSimple,
		StatementTimeout:         cfg.StatementTimeout,
		MaxMergeMemory:           int64(cfg.MaxMergeMemory),
		CatalogNode:              cluster.Catalog().Name,
		Aggregates:               cluster.Aggregates,
		TwoPhase:                 twoPhase,
		TreeDDL: func(ctx context.Context, d pgshard.TreeDDL) error {
			return cluster.RunTreeDDL(ctx, store, d, twoPhase.CommitTxs)
		},
		IndexTable:   cluster.IndexTable,
		Registration: reg,
		Metrics:      proxy.NewMetrics(adm.Registry),
		Log:          log,
	}, cache, planner(cfg), pools, fns)

	registerProxyMetrics(adm, srv, pools, reg)
	adm.Registry.MustRegister(&loadCollector{cache: cache, load: store, log: log})
	adm.Ready = func(ctx context.Context) error {
		// Ready while it serves, from its cache too: a balancer must not
		// drop every proxy at once when Redis goes away.
		if reg.Live() || reg.Cached() {
			return nil
		}
		_, err := store.Trees(ctx, cluster.DefaultTenant())
		return err
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	aln, err := net.Listen("tcp", cfg.Admin)
	if err != nil {
		ln.Close()
		return err
	}
	access.Hosts = append(access.Hosts, admin.DefaultHosts(cfg.Admin)...)
	access.Hosts = append(access.Hosts, admin.DefaultHosts(aln.Addr().String())...)
	adm.Access = access
	log.Info("lattice serving", "listen", ln.Addr().String(), "admin", aln.Addr().String(), "nodes", len(cluster.Nodes()), "catalog", cluster.Catalog().Name)
	if ready != nil {
		ready(ln.Addr().String(), aln.Addr().String())
	}
	errc := make(chan error, 2)
	go func() { errc <- adm.Serve(ctx, aln) }()
	go func() { errc <- srv.Serve(ctx, ln) }()
	bg.Go(func() {
		srv.RunDeadlockDetector(bgCtx, proxy.DeadlockConfig{
			LockWaits: cluster.LockWaits,
			ProxyID:   proxyID,
			Share: func(ctx context.Context, mine []byte) ([][]byte, error) {
				return store.ShareLockHolders(ctx, proxyID, mine, 3*proxy.DefaultDeadlockTimeout)
			},
		})
	})
	err = <-errc
	if err == nil {
		err = <-errc
	}
	return err
}

// openCluster makes the node set this proxy starts with: the --node flags
// (their passwords split off, kept here) when given, else the node
// registry. The registry, once read, replaces the flags (NodeWatch).
func openCluster(ctx context.Context, cfg serveConfig, store *shardmap.RedisStore, log *slog.Logger) (*pgshard.Cluster, error) {
	nodes, err := pgshard.SplitNodes(cfg.Nodes)
	if err != nil {
		return nil, err
	}
	if len(nodes) == 0 {
		reg, err := store.Nodes(ctx)
		if err != nil {
			return nil, err
		}
		if len(reg.Nodes) == 0 {
			return nil, errors.New("no nodes: the node registry is empty; give at least one --node NAME=DSN to seed it")
		}
		for _, e := range reg.Nodes {
			nodes = append(nodes, pgshard.Node{Name: e.Name, DSN: e.DSN})
		}
	}
	cluster, err := pgshard.NewCluster(nodes, log)
	if err != nil {
		return nil, err
	}
	if cfg.PgPass != "" {
		if err := checkPgPass(cfg.PgPass, log); err != nil {
			cluster.Close()
			return nil, err
		}
		cluster.SetPassfile(cfg.PgPass)
	}
	return cluster, nil
}

// checkPgPass fails early on a pgpass file that cannot be read: pgconn
// would ignore it silently and every node would refuse the login.
func checkPgPass(path string, log *slog.Logger) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--pgpass: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("--pgpass: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		// libpq ignores such a file; pgconn reads it. Say so, as psql would.
		log.Warn("--pgpass file has group or world access; chmod 0600 it", "path", path, "mode", st.Mode().Perm().String())
	}
	return nil
}

// newProxyID names this process in the proxy registry and in leases.
func newProxyID() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%x", host, os.Getpid(), b)
}

func reapIdle(ctx context.Context, pools *pgshard.Pools) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pools.ReapIdle()
		}
	}
}

func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func passwdCmd(args []string, in io.Reader, out io.Writer) error {
	if len(args) < 1 || len(args) > 2 {
		return errors.New("usage: lattice passwd USER [TENANTS] < password")
	}
	tenants := "*"
	if len(args) == 2 {
		tenants = args[1]
	}
	raw, err := io.ReadAll(io.LimitReader(in, 4096))
	if err != nil {
		return err
	}
	password := strings.TrimRight(string(raw), "\r\n")
	if password == "" {
		return errors.New("empty password on standard input")
	}
	v, err := proxy.NewVerifier(password)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s %s %s\n", args[0], v, tenants)
	return err
}

// maxPinned is --max-pinned, or half of --pool-size when it is not given:
// each pinned session holds one of the catalog node's pooled backends, and
// the unpinned sessions must keep some.
func maxPinned(flagValue, poolSize int) int {
	if flagValue > 0 {
		return flagValue
	}
	return max(1, poolSize/2)
}

// checkReported is router.CheckReported as an error, nil when it has none.
func checkReported(name, value string) error {
	if e := router.CheckReported(name, value); e != nil {
		return e
	}
	return nil
}
