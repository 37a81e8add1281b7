// Package integration holds the end-to-end tests: real PostgreSQL nodes, a
// real redis-server and the lattice binary (built with the race detector
// for the tests where it serves concurrent work: binary_test.go).
//
// TestMain starts 3 PostgreSQL 15 nodes and one redis-server under a temp dir
// for the whole package run. Set LATTICE_TEST_KEEP=1 to keep that dir (data
// directories, server logs, the binary) for debugging.
package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/lattice-db/lattice/localnode"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/sqlstate"
)

// numNodes is how many PostgreSQL nodes TestMain starts.
const numNodes = 3

var harness struct {
	dir   string
	nodes []*localnode.Postgres
	redis *localnode.Redis

	plain, race latticeBuild // the proxy under test (binary_test.go)

	proxySeq atomic.Int64
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) (code int) {
	if os.Getenv(externalProxyEnv) != "" {
		// The tests of a running proxy need no servers of their own.
		return m.Run()
	}
	// Progress of the servers goes to stderr, which go test shows.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	if err := localnode.EnsureTools(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	removeStaleDirs()
	dir, err := os.MkdirTemp("", tempPrefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	// PostgreSQL runs as the unprivileged postgres user when we are root: it
	// must be able to enter the dir.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	harness.dir = dir
	// Marks the dir as this process's, so that a later run can remove it if
	// this one dies without cleaning up (go test -timeout, SIGKILL).
	_ = os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
	keep := os.Getenv("LATTICE_TEST_KEEP") == "1"
	defer func() {
		teardown()
		if keep {
			os.Remove(filepath.Join(dir, ownerFile))
			fmt.Fprintf(os.Stderr, "integration: LATTICE_TEST_KEEP=1: kept %s\n", dir)
		} else {
			os.RemoveAll(dir)
		}
	}()

	// Ctrl-C or a SIGTERM to the test binary: stop the servers and remove the
	// dir before dying. (A SIGKILL is covered by the servers' Pdeathsig.)
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigc)
	go func() {
		sig, ok := <-sigc
		if !ok {
			return
		}
		fmt.Fprintf(os.Stderr, "integration: %v: stopping servers\n", sig)
		teardown()
		if !keep {
			os.RemoveAll(dir)
		}
		os.Exit(2)
	}()

	if err := startServers(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "integration: %d PostgreSQL nodes and redis-server up in %s (dir %s)\n",
		numNodes, time.Since(start).Round(time.Millisecond), dir)
	return m.Run()
}

const (
	tempPrefix = "lattice-it-"
	ownerFile  = "harness.pid"
)

// removeStaleDirs removes the temp dirs of earlier runs whose process is gone
// (their servers died with them through Pdeathsig), unless kept on purpose.
func removeStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // kept (LATTICE_TEST_KEEP removes the mark) or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		slog.Info("integration: removing the temp dir of a dead run", "dir", d, "pid", pid)
		os.RemoveAll(d)
	}
}

func startServers(ctx context.Context) error {
	var err error
	harness.nodes, harness.redis, err = startCluster(ctx, harness.dir, numNodes)
	if err != nil {
		return err
	}
	for _, n := range harness.nodes {
		conn, err := pgx.Connect(ctx, n.DSN(localnode.DefaultDatabase))
		if err != nil {
			return err
		}
		err = provisionTenant(ctx, conn)
		conn.Close(ctx)
		if err != nil {
			return err
		}
	}
	return nil
}

// nodeSettings are the postgresql.conf settings LATTICE_TEST_PG_SETTINGS
// adds to the harness's nodes, as name=value words, to watch the nodes
// through a run: LATTICE_TEST_PG_SETTINGS='log_lock_waits=on
// deadlock_timeout=5ms' logs every lock wait past 5 ms to each node's
// lattice-postgres.log, which LATTICE_TEST_KEEP=1 keeps.
func nodeSettings() (map[string]string, error) {
	words := strings.Fields(os.Getenv("LATTICE_TEST_PG_SETTINGS"))
	if len(words) == 0 {
		return nil, nil
	}
	settings := make(map[string]string, len(words))
	for _, w := range words {
		name, value, ok := strings.Cut(w, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("LATTICE_TEST_PG_SETTINGS: %q is not name=value", w)
		}
		settings[name] = value
	}
	return settings, nil
}

// nodeTemplate is where the harness keeps the data directory that every
// node it starts copies (localnode.PostgresOptions.Template).
func nodeTemplate() string { return filepath.Join(harness.dir, "template") }

// startCluster starts n PostgreSQL nodes (n1, n2, ... under dir) and a
// redis-server (dir/redis) in parallel. On error it returns what did start,
// for the caller to stop: the nodes slice has a nil for each that did not.
func startCluster(ctx context.Context, dir string, n int) ([]*localnode.Postgres, *localnode.Redis, error) {
	settings, err := nodeSettings()
	if err != nil {
		return nil, nil, err
	}
	nodes := make([]*localnode.Postgres, n)
	var rd *localnode.Redis
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("n%d", i+1)
			nodes[i], errs[i] = localnode.StartPostgres(ctx, filepath.Join(dir, name), name,
				localnode.PostgresOptions{Fast: true, Settings: settings, Template: nodeTemplate()})
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		rd, errs[n] = localnode.StartRedis(ctx, filepath.Join(dir, "redis"))
	}()
	wg.Wait()
	return nodes, rd, errors.Join(errs...)
}

var teardownOnce sync.Once

func teardown() {
	teardownOnce.Do(func() {
		var wg sync.WaitGroup
		for _, n := range harness.nodes {
			if n == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := n.Stop(); err != nil {
					fmt.Fprintln(os.Stderr, "integration:", err)
				}
			}()
		}
		if harness.redis != nil {
			if err := harness.redis.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "integration:", err)
			}
		}
		wg.Wait()
	})
}

// testNode returns PostgreSQL node i (0-based).
func testNode(t testing.TB, i int) *localnode.Postgres {
	t.Helper()
	if i < 0 || i >= len(harness.nodes) || harness.nodes[i] == nil {
		t.Fatalf("no test node %d (the harness has %d)", i, len(harness.nodes))
	}
	return harness.nodes[i]
}

// testNodeDSN returns the DSN of node i (0-based), database "lattice".
func testNodeDSN(t testing.TB, i int) string {
	t.Helper()
	return testNode(t, i).DSN("lattice")
}

// setNodeSetting sets a reloadable server setting on the first nodes test
// nodes (ALTER SYSTEM, then a reload) until the test ends.
func setNodeSetting(t testing.TB, nodes int, name, value string) {
	t.Helper()
	for n := range nodes {
		c := connect(t, testNodeDSN(t, n))
		mustExec(t, c, fmt.Sprintf("ALTER SYSTEM SET %s = %s", name, quoteLiteral(value)))
		mustExec(t, c, "SELECT pg_reload_conf()")
		t.Cleanup(func() {
			mustExec(t, c, "ALTER SYSTEM RESET "+name)
			mustExec(t, c, "SELECT pg_reload_conf()")
			c.Close(context.Background())
		})
	}
}

// testRedisURL returns redis://127.0.0.1:PORT/0 of the harness's redis.
func testRedisURL(t testing.TB) string {
	t.Helper()
	if harness.redis == nil {
		t.Fatal("no test redis")
	}
	return harness.redis.URL()
}

// testRedis returns the harness's redis-server (Kill, Restart for fault tests).
func testRedis(t testing.TB) *localnode.Redis {
	t.Helper()
	if harness.redis == nil {
		t.Fatal("no test redis")
	}
	return harness.redis
}

// repoRoot is the module root: the parent of this package's directory.
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	root := filepath.Dir(wd)
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return "", fmt.Errorf("no go.mod in %s: %w", root, err)
	}
	return root, nil
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// syncBuffer is a bytes.Buffer safe for the process's writer and the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proxyProc is one running `lattice serve`.
type proxyProc struct {
	Addr      string // 127.0.0.1:PORT, PostgreSQL wire protocol
	AdminAddr string // 127.0.0.1:PORT, HTTP admin endpoint
	// AdminToken is the admin endpoint's token, which startProxy gives
	// every proxy through --admin-token-file ("" when the test chose its own).
	AdminToken string
	Args       []string

	cmd     *exec.Cmd
	log     *syncBuffer
	logPath string
	done    chan struct{} // closed once the process exited
	waitErr error
	killed  atomic.Bool // stopped on purpose (Kill or cleanup)
}

// startProxy starts `lattice serve` over the first `nodes` harness nodes and
// the harness redis, waits until it accepts connections and /healthz answers
// 200, and stops it in t.Cleanup (SIGTERM, SIGKILL after 10s). When the test
// fails, the proxy's log is dumped with t.Log. A proxy that dies on its own, or
// whose log has a race report, fails the test.
func startProxy(t testing.TB, nodes int, extraArgs ...string) *proxyProc {
	t.Helper()
	return startProxyEnv(t, nodes, nil, extraArgs...)
}

// startProxyEnv is startProxy with extra environment variables (NAME=VALUE)
// for the proxy process, such as test-only hooks.
func startProxyEnv(t testing.TB, nodes int, env []string, extraArgs ...string) *proxyProc {
	t.Helper()
	if nodes < 1 || nodes > len(harness.nodes) {
		t.Fatalf("startProxy: %d nodes requested, the harness has %d", nodes, len(harness.nodes))
	}
	dsns := make([]string, nodes)
	for i := range dsns {
		dsns[i] = testNodeDSN(t, i)
	}
	return startProxyOn(t, testRedisURL(t), dsns, env, extraArgs...)
}

// startProxyOn is startProxyEnv over the given redis and nodes (named n1,
// n2, ... in order), for tests that run their own servers.
func startProxyOn(t testing.TB, redisURL string, nodeDSNs []string, env []string, extraArgs ...string) *proxyProc {
	t.Helper()
	return startProxyAt(t, "127.0.0.1", nil, redisURL, nodeDSNs, env, extraArgs...)
}

// startProxyAt is startProxyOn listening on host, the command run under
// wrap (e.g. "ip netns exec NS", for the partition tests).
//
// The ports are free when chosen, but the proxy binds them a moment later,
// and meanwhile another test process or any outgoing connection (whose
// local port the kernel takes from the same range) may have taken one: a
// proxy that exits on "address already in use" before it is ready is
// started again on other ports.
func startProxyAt(t testing.TB, host string, wrap []string, redisURL string, nodeDSNs []string, env []string, extraArgs ...string) *proxyProc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p := launchProxy(t, host, wrap, redisURL, nodeDSNs, env, extraArgs...)
		err := p.waitReady(60 * time.Second)
		if err != nil && attempt < 3 && p.exited() && portTaken(p.log.String()) {
			t.Logf("lattice serve could not bind %s or %s; starting it again on other ports", p.Addr, p.AdminAddr)
			continue
		}
		t.Cleanup(func() { p.cleanup(t) })
		if err != nil {
			t.Fatalf("lattice serve did not become ready: %v\nargs: %q\n--- log ---\n%s", err, p.Args, p.log.String())
		}
		return p
	}
}

// portTaken reports whether a proxy's output says that it could not bind
// a port.
func portTaken(out string) bool { return strings.Contains(out, "address already in use") }

// launchProxy starts `lattice serve` on free ports, as startProxyAt says,
// without waiting for it.
func launchProxy(t testing.TB, host string, wrap []string, redisURL string, nodeDSNs []string, env []string, extraArgs ...string) *proxyProc {
	t.Helper()
	bin := latticeBinary(t)
	port, err := localnode.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	adminPort, err := localnode.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := &proxyProc{
		Addr:      net.JoinHostPort(host, strconv.Itoa(port)),
		AdminAddr: net.JoinHostPort(host, strconv.Itoa(adminPort)),
		log:       &syncBuffer{},
		done:      make(chan struct{}),
	}
	// The split monitor and healing are off unless a test turns them on
	// (a later --autosplit=true wins): the other tests' trees keep the
	// shards they made.
	args := []string{"serve", "--listen", p.Addr, "--admin", p.AdminAddr, "--redis", redisURL, "--autosplit=false", "--autoheal=false"}
	for i, dsn := range nodeDSNs {
		args = append(args, "--node", fmt.Sprintf("n%d=%s", i+1, dsn))
	}
	seq := harness.proxySeq.Add(1)
	if !slices.Contains(extraArgs, "--admin-token-file") {
		p.AdminToken = fmt.Sprintf("test-admin-token-%03d-%s", seq, strconv.FormatInt(time.Now().UnixNano(), 36))
		tokenFile := filepath.Join(harness.dir, fmt.Sprintf("proxy-%03d.admin-token", seq))
		if err := os.WriteFile(tokenFile, []byte(p.AdminToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--admin-token-file", tokenFile)
	}
	p.Args = append(args, extraArgs...)

	// The log goes to a buffer (dumped on failure) and to a file in the
	// harness dir (kept with LATTICE_TEST_KEEP=1).
	p.logPath = filepath.Join(harness.dir, fmt.Sprintf("proxy-%03d-%s.log", seq, sanitize(t.Name())))
	var out io.Writer = p.log
	if f, err := os.Create(p.logPath); err == nil {
		out = io.MultiWriter(p.log, f)
		t.Cleanup(func() { f.Close() })
	}
	argv := append(append(append([]string(nil), wrap...), bin), p.Args...)
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout = out
	p.cmd.Stderr = out
	p.cmd.Env = append(append(os.Environ(), "GORACE=halt_on_error=0"), env...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start lattice: %v", err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	return p
}

func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, name)
}

func (p *proxyProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proxyProc) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: 2 * time.Second}
	var lastErr error
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("exited: %v", p.waitErr)
		}
		lastErr = func() error {
			c, err := net.DialTimeout("tcp", p.Addr, time.Second)
			if err != nil {
				return err
			}
			c.Close()
			resp, err := client.Get("http://" + p.AdminAddr + "/healthz")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("/healthz: %s", resp.Status)
			}
			return nil
		}()
		if lastErr == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("timed out after %s: %v", timeout, lastErr)
}

func (p *proxyProc) cleanup(t testing.TB) {
	diedOnItsOwn := p.exited() && !p.killed.Load()
	var stacks string
	if t.Failed() {
		logNodeActivity(t)
		stacks = p.workStacks()
	}
	if !p.exited() {
		p.killed.Store(true)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		// Generous: a loaded 2-core machine has taken over 10 s to close
		// sessions and pools; a hung shutdown still fails.
		case <-time.After(30 * time.Second):
			t.Errorf("lattice serve did not exit within 30s of SIGTERM; its goroutines are in its log")
			_ = p.cmd.Process.Signal(syscall.SIGQUIT) // the runtime prints every goroutine, then exits
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
			}
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // anything it left in its group
	log := p.log.String()
	if diedOnItsOwn {
		t.Errorf("lattice serve exited on its own during the test: %v", p.waitErr)
	}
	if strings.Contains(log, "WARNING: DATA RACE") {
		t.Errorf("the race detector reported a data race in lattice serve (see its log)")
	}
	if t.Failed() {
		t.Logf("lattice serve %q exit: %v\n--- proxy log (%s) ---\n%s", p.Args, p.waitErr, p.logPath, log)
		if stacks != "" {
			t.Logf("--- the proxy's sessions, migrations and coordinator when the test failed ---\n%s", stacks)
		}
	}
}

// workStacks is the stacks of the running proxy's goroutines that serve a
// session, run a migration or tick a coordinator, from its pprof endpoint:
// a statement, a migration or a reshard that stalls shows where it waits,
// which its log does not.
func (p *proxyProc) workStacks() string {
	if p.exited() || p.AdminToken == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.AdminAddr+"/debug/pprof/goroutine?debug=2", nil)
	if err != nil {
		return ""
	}
	p.Authorize(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Sprintf("(no goroutine dump: %v)", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("(no goroutine dump: %s %v)", resp.Status, err)
	}
	var work []string
	for _, g := range strings.Split(string(body), "\n\n") {
		if strings.Contains(g, "proxy.(*session)") || strings.Contains(g, "migrator.(*Runner)") || strings.Contains(g, "migrator.(*Coordinator)") {
			work = append(work, g)
		}
	}
	return strings.Join(work, "\n\n")
}

// DSN returns postgres://lattice@ADDR/DATABASE?sslmode=disable.
func (p *proxyProc) DSN(database string) string {
	return fmt.Sprintf("postgres://lattice@%s/%s?sslmode=disable", p.Addr, url.PathEscape(database))
}

// Authorize adds the proxy's admin token to a request to its admin endpoint.
func (p *proxyProc) Authorize(req *http.Request) {
	if p.AdminToken != "" {
		req.Header.Set("Authorization", "Bearer "+p.AdminToken)
	}
}

// RunCLI runs the lattice binary with args against p's admin endpoint
// (its token in the environment) and returns what it printed and its exit
// code; a run that cannot start fails the test.
func (p *proxyProc) RunCLI(t *testing.T, ctx context.Context, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, latticeBinary(t), append(args, "--admin", "http://"+p.AdminAddr)...)
	cmd.Env = append(os.Environ(), "LATTICE_ADMIN_TOKEN="+p.AdminToken)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("lattice %q: %v", args, err)
	}
	return o.String(), e.String(), code
}

// Log returns everything the proxy has logged so far.
func (p *proxyProc) Log() string { return p.log.String() }

// WaitLog waits until the proxy's log holds substr n times.
func (p *proxyProc) WaitLog(t testing.TB, ctx context.Context, substr string, n int) {
	t.Helper()
	for strings.Count(p.Log(), substr) < n {
		select {
		case <-ctx.Done():
			t.Fatalf("the proxy's log holds %q %d times, want %d:\n%s", substr, strings.Count(p.Log(), substr), n, p.Log())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// WaitExit waits up to timeout for a proxy that is expected to end by
// itself (a test hook that crashes it) and reports whether it did.
func (p *proxyProc) WaitExit(timeout time.Duration) bool {
	p.killed.Store(true)
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Kill sends SIGKILL to the proxy (crash tests) and waits for it to exit.
func (p *proxyProc) Kill() {
	p.killed.Store(true)
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// resetNodes makes tests independent: on every node's "lattice" database it
// ends other sessions, rolls back prepared transactions, drops replication
// slots, publications, every lattice_s* schema and every table, view and
// sequence in public; then it runs FLUSHALL on redis.
func resetNodes(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range harness.nodes {
		if err := resetNode(ctx, testNodeDSN(t, i)); err != nil {
			t.Fatalf("reset node %d: %v", i, err)
		}
	}
	rdb, err := redisClient(testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("redis FLUSHALL: %v", err)
	}
}

func redisClient(url string) (*redis.Client, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(opts), nil
}

func resetNode(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	run := func(sql string, args ...any) error {
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
		return nil
	}
	strs := func(sql string) ([]string, error) {
		rows, err := conn.Query(ctx, sql)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sql, err)
		}
		return pgx.CollectRows(rows, pgx.RowTo[string])
	}
	// Leftover sessions (a killed proxy's backends, a leaked transaction)
	// would hold locks that make the drops below wait.
	if err := run(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`); err != nil {
		return err
	}
	gids, err := strs(`SELECT gid FROM pg_prepared_xacts WHERE database = current_database()`)
	if err != nil {
		return err
	}
	for _, gid := range gids {
		if err := run("ROLLBACK PREPARED " + quoteLiteral(gid)); err != nil {
			return err
		}
	}
	if err := run(`SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE database = current_database() AND active_pid IS NOT NULL`); err != nil {
		return err
	}
	slots, err := strs(`SELECT slot_name::text FROM pg_replication_slots WHERE database = current_database()`)
	if err != nil {
		return err
	}
	for _, s := range slots {
		// The walsender may take a moment to exit after being terminated.
		var lastErr error
		for try := 0; try < 50; try++ {
			if _, lastErr = conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", s); lastErr == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if lastErr != nil {
			return fmt.Errorf("drop replication slot %s: %w", s, lastErr)
		}
	}
	if err := run("SET lock_timeout = '20s'"); err != nil {
		return err
	}
	var drops []string
	pubs, err := strs(`SELECT pubname::text FROM pg_publication`)
	if err != nil {
		return err
	}
	for _, p := range pubs {
		drops = append(drops, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{p}.Sanitize())
	}
	schemas, err := strs(`SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'lattice\_s%'`)
	if err != nil {
		return err
	}
	for _, s := range schemas {
		drops = append(drops, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
	}
	rels, err := strs(`SELECT CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
			WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END
			|| ' IF EXISTS public.' || quote_ident(c.relname) || ' CASCADE'
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') AND NOT c.relispartition
		ORDER BY c.relkind = 'S'`)
	if err != nil {
		return err
	}
	for _, r := range rels {
		drops = append(drops, "DROP "+r)
	}
	// The reference tables just dropped from public leave their catalog rows.
	drops = append(drops, `DO $$ BEGIN IF to_regclass('lattice_meta.reference_tables') IS NOT NULL THEN DELETE FROM lattice_meta.reference_tables; END IF; END $$`)
	for _, d := range drops {
		if err := run(d); err != nil {
			return err
		}
	}
	return provisionTenant(ctx, conn)
}

// provisionTenant makes the default tenant's role on a node, as an operator
// who provisions roles would (README, "Security"), and grants it what the
// tests create for it directly on the node as the harness superuser: the
// proxy's clients reach the nodes as that role, not as the superuser.
func provisionTenant(ctx context.Context, conn *pgx.Conn) error {
	role := pgx.Identifier{pgshard.TenantRole(localnode.DefaultDatabase)}.Sanitize()
	for _, sql := range []string{
		`DO $$ BEGIN
			IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = ` + quoteLiteral(pgshard.TenantRole(localnode.DefaultDatabase)) + `) THEN
				CREATE ROLE ` + role + ` LOGIN;
			END IF;
		END $$`,
		`ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO ` + role,
		`ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON SEQUENCES TO ` + role,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil && !sqlstate.Is(err, sqlstate.DuplicateObject) && !sqlstate.Is(err, sqlstate.UniqueViolation) {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// TestHarnessNodesUp checks the harness itself: every node answers with
// wal_level=logical and redis answers PING.
func TestHarnessNodesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if len(harness.nodes) != numNodes {
		t.Fatalf("%d nodes, want %d", len(harness.nodes), numNodes)
	}
	ports := map[int]bool{}
	for i := range harness.nodes {
		conn, err := pgx.Connect(ctx, testNodeDSN(t, i))
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		for setting, want := range map[string]string{
			"wal_level":                 "logical",
			"max_replication_slots":     "64",
			"max_prepared_transactions": "64",
		} {
			var got string
			if err := conn.QueryRow(ctx, "SHOW "+setting).Scan(&got); err != nil {
				t.Fatalf("node %d: SHOW %s: %v", i, setting, err)
			}
			if got != want {
				t.Errorf("node %d: %s = %q, want %q", i, setting, got, want)
			}
		}
		var db string
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != "lattice" {
			t.Errorf("node %d: current_database = %q, %v", i, db, err)
		}
		conn.Close(ctx)
		ports[testNode(t, i).Port] = true
	}
	if len(ports) != numNodes {
		t.Errorf("nodes share ports: %v", ports)
	}
	rdb, err := redisClient(testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if pong, err := rdb.Ping(ctx).Result(); err != nil || pong != "PONG" {
		t.Fatalf("redis PING = %q, %v", pong, err)
	}
	var aof string
	if res, err := rdb.ConfigGet(ctx, "appendonly").Result(); err == nil {
		aof = res["appendonly"]
	}
	if aof != "yes" {
		t.Errorf("redis appendonly = %q, want yes", aof)
	}
}

// TestProxyStartRetriesTakenPort: a proxy whose first start finds a port
// taken is started again, on other ports, and serves. The first start is
// a stand-in that says what lattice says when a bind fails and exits.
func TestProxyStartRetriesTakenPort(t *testing.T) {
	once := filepath.Join(t.TempDir(), "started")
	wrap := []string{"bash", "-c", `if [ ! -e "$0" ]; then touch "$0"; echo "lattice: listen tcp: bind: address already in use"; exit 1; fi; exec "$@"`, once}
	p := startProxyAt(t, "127.0.0.1", wrap, testRedisURL(t), []string{testNodeDSN(t, 0)}, nil)
	c := connect(t, p.DSN("lattice"))
	defer c.Close(context.Background())
	var one int
	if err := c.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("the proxy started again does not serve: %d, %v", one, err)
	}
}

// TestHarnessReset checks resetNodes: it drops shard schemas, public tables
// and publications, and flushes redis.
func TestHarnessReset(t *testing.T) {
	resetNodes(t) // start clean whatever ran before, so the objects below are new
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, testNodeDSN(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{
		"CREATE SCHEMA lattice_s0007",
		"CREATE TABLE lattice_s0007.catalogue (sku text PRIMARY KEY)",
		"CREATE TABLE public.plain (id int PRIMARY KEY)",
		"CREATE VIEW public.v AS SELECT * FROM public.plain",
		"CREATE SEQUENCE public.seq",
		"CREATE PUBLICATION lattice_m1 FOR TABLE lattice_s0007.catalogue",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	rdb, err := redisClient(testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := rdb.Set(ctx, "lattice:test", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	resetNodes(t)

	conn, err = pgx.Connect(ctx, testNodeDSN(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'lattice\_s%')
		+ (SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = 'public')
		+ (SELECT count(*) FROM pg_publication)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d objects left after resetNodes", n)
	}
	if k, err := rdb.DBSize(ctx).Result(); err != nil || k != 0 {
		t.Errorf("redis DBSIZE after reset = %d, %v", k, err)
	}
}

// logNodeActivity logs, for a failed test, what every node's backends are
// doing and who blocks them, before the proxy and its sessions go: a
// session that waits on a backend's answer shows here as running, waiting
// on a lock (with the pids that hold it), or idle (never asked to answer).
func logNodeActivity(t testing.TB) {
	const q = `SELECT a.datname, a.pid, a.state, coalesce(a.wait_event_type || ':' || a.wait_event, ''),
	 pg_blocking_pids(a.pid)::text, round(extract(epoch FROM now() - a.state_change)::numeric, 1)::text,
	 left(regexp_replace(coalesce(a.query, ''), '\s+', ' ', 'g'), 160)
	FROM pg_stat_activity a
	WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid() AND a.state IS DISTINCT FROM 'idle'
	ORDER BY a.state_change`
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, n := range harness.nodes {
		conn, err := pgx.Connect(ctx, n.DSN(localnode.DefaultDatabase))
		if err != nil {
			t.Logf("node %d activity: %v", i+1, err)
			continue
		}
		rows, err := conn.Query(ctx, q)
		if err == nil {
			var b strings.Builder
			for rows.Next() {
				var db, state, wait, blockers, secs, query *string
				var pid int32
				if err = rows.Scan(&db, &pid, &state, &wait, &blockers, &secs, &query); err != nil {
					break
				}
				fmt.Fprintf(&b, "\n  db=%s pid=%d state=%s wait=%s blocked_by=%s for=%ss %s", deref(db), pid, deref(state), deref(wait), deref(blockers), deref(secs), deref(query))
			}
			if err == nil {
				err = rows.Err()
			}
			t.Logf("node %d: backends not idle:%s", i+1, b.String())
		}
		if err != nil {
			t.Logf("node %d activity: %v", i+1, err)
		}
		conn.Close(ctx)
	}
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}
