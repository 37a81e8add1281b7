package localnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/sqlstate"
)

// Superuser is the superuser role initdb creates; DefaultDatabase is the
// database StartPostgres makes sure exists.
const (
	Superuser       = "lattice"
	DefaultDatabase = "lattice"
)

// PostgresOptions tune StartPostgres.
type PostgresOptions struct {
	// Fast turns fsync off: data survives a crash of PostgreSQL (Kill) but
	// not of the machine. For tests and the demo.
	Fast bool
	// Settings are extra postgresql.conf settings (name -> value, written as
	// name = 'value'); they override the defaults below.
	Settings map[string]string
	// StartTimeout bounds each wait for the server to accept connections
	// (default 90s); a context deadline that comes first wins.
	StartTimeout time.Duration
	// TLSCert and TLSKey (PEM), when set, turn ssl on with this certificate.
	TLSCert, TLSKey []byte
	// Template, when set, is a directory that keeps a data directory made
	// as initdb makes a node's (on first use): a node without data copies
	// it rather than running initdb. initdb costs about a second of CPU,
	// and the integration tests start dozens of nodes.
	Template string
}

// Postgres is a running (or stopped) local PostgreSQL server.
type Postgres struct {
	Name    string // label for logs, e.g. "n1"
	Dir     string // data directory (absolute); also holds the unix socket
	Port    int    // TCP port on 127.0.0.1
	BinDir  string // where postgres and initdb were found
	LogPath string // server log: Dir/lattice-postgres.log

	opts     PostgresOptions
	cred     *syscall.Credential
	userName string

	mu   sync.Mutex
	proc *proc
}

// settings returns the postgresql.conf settings StartPostgres writes.
func (p *Postgres) settings() map[string]string {
	s := map[string]string{
		"listen_addresses":          "127.0.0.1",
		"port":                      fmt.Sprint(p.Port),
		"wal_level":                 "logical",
		"max_replication_slots":     "64",
		"max_wal_senders":           "64",
		"max_prepared_transactions": "64",
		"max_connections":           "300",
		"unix_socket_directories":   p.socketDir(),
		"logging_collector":         "off",
		"log_line_prefix":           "%m [%p] %q%u@%d ",
	}
	if p.opts.Fast {
		s["fsync"] = "off"
	}
	if p.opts.TLSCert != nil {
		s["ssl"] = "on"
		s["ssl_cert_file"] = filepath.Join(p.Dir, "lattice-server.crt")
		s["ssl_key_file"] = filepath.Join(p.Dir, "lattice-server.key")
	}
	for k, v := range p.opts.Settings {
		s[k] = v
	}
	return s
}

// socketDir is Dir when the socket path fits the 107-byte limit of a unix
// socket address; otherwise unix sockets are off (clients use TCP).
func (p *Postgres) socketDir() string {
	if len(p.Dir)+len("/.s.PGSQL.65535") < 100 {
		return p.Dir
	}
	return ""
}

// StartPostgres initdb's dir if it is empty or missing (trust authentication
// for 127.0.0.1 and the unix socket only, superuser role "lattice", database
// "lattice"), and starts postgres on a free loopback port with
// wal_level=logical, max_replication_slots=64, max_wal_senders=64,
// max_prepared_transactions=64, max_connections=300 and, when opts.Fast,
// fsync=off. The unix socket lives in dir. A dir that already holds a data
// directory is reused (the port may change).
//
// When the process runs as root, dir is chowned to the unprivileged postgres
// user (or nobody) and initdb and postgres run as that user; every ancestor
// of dir must then be enterable by that user.
func StartPostgres(ctx context.Context, dir, name string, opts PostgresOptions) (*Postgres, error) {
	start := time.Now()
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	p := &Postgres{Name: name, Dir: abs, BinDir: PGBinDir(), opts: opts,
		LogPath: filepath.Join(abs, "lattice-postgres.log")}
	for _, b := range []string{"postgres", "initdb"} {
		if !isExecutable(filepath.Join(p.BinDir, b)) {
			return nil, fmt.Errorf("localnode: %s not found; install PostgreSQL 15: %s", filepath.Join(p.BinDir, b), installHint())
		}
	}
	if p.cred, p.userName, err = serverCredential(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("localnode: %w", err)
	}
	if err := checkSearchable(abs, p.cred, p.userName); err != nil {
		return nil, err
	}
	initialized := isFile(filepath.Join(abs, "PG_VERSION"))
	if !initialized {
		ents, err := os.ReadDir(abs)
		if err != nil {
			return nil, fmt.Errorf("localnode: %w", err)
		}
		if len(ents) > 0 {
			return nil, fmt.Errorf("localnode: %s is neither empty nor a PostgreSQL data directory", abs)
		}
	}
	if err := os.Chmod(abs, 0o700); err != nil {
		return nil, fmt.Errorf("localnode: %w", err)
	}
	if err := chownTree(abs, p.cred); err != nil {
		return nil, fmt.Errorf("localnode: chown %s to %s: %w", abs, p.userName, err)
	}
	if !initialized {
		if err := p.initialize(ctx); err != nil {
			return nil, err
		}
	}
	// A port taken between FreePort and the bind is retried with another.
	for attempt := 1; ; attempt++ {
		if p.Port, err = FreePort(); err != nil {
			return nil, err
		}
		if err = p.writeConf(); err != nil {
			return nil, err
		}
		err = p.start(ctx)
		if err == nil {
			break
		}
		if attempt >= 5 || !errors.Is(err, errAddrInUse) {
			return nil, err
		}
		slog.Warn("localnode: postgres port taken, retrying", "name", name, "port", p.Port)
	}
	if err := p.CreateDatabase(ctx, DefaultDatabase); err != nil {
		_ = p.Stop()
		return nil, err
	}
	slog.Info("localnode: postgres ready", "name", name, "port", p.Port, "dir", abs, "took", time.Since(start).Round(time.Millisecond))
	return p, nil
}

func isFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// initialize makes p.Dir a data directory: by initdb, or as a copy of
// opts.Template.
func (p *Postgres) initialize(ctx context.Context) error {
	if p.opts.Template == "" {
		return p.initdb(ctx)
	}
	if err := p.ensureTemplate(ctx); err != nil {
		return err
	}
	if err := copyTree(p.opts.Template, p.Dir); err != nil {
		return fmt.Errorf("localnode: copy %s to %s: %w", p.opts.Template, p.Dir, err)
	}
	return chownTree(p.Dir, p.cred)
}

// templateMu keeps two nodes of this process from making one template at
// once.
var templateMu sync.Mutex

// ensureTemplate runs initdb into opts.Template unless it holds a data
// directory already.
func (p *Postgres) ensureTemplate(ctx context.Context) error {
	templateMu.Lock()
	defer templateMu.Unlock()
	dir, err := filepath.Abs(p.opts.Template)
	if err != nil {
		return err
	}
	if isFile(filepath.Join(dir, "PG_VERSION")) {
		return nil
	}
	// What an interrupted initdb left is not a data directory.
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("localnode: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("localnode: %w", err)
	}
	if err := chownTree(dir, p.cred); err != nil {
		return fmt.Errorf("localnode: chown %s to %s: %w", dir, p.userName, err)
	}
	t := &Postgres{Name: "template", Dir: dir, BinDir: p.BinDir, opts: p.opts, cred: p.cred, userName: p.userName}
	return t.initdb(ctx)
}

func (p *Postgres) initdb(ctx context.Context) error {
	slog.Info("localnode: initdb", "name", p.Name, "dir", p.Dir, "user", p.userName)
	args := []string{"-D", p.Dir, "-U", Superuser, "--auth=trust", "--encoding=UTF8", "--no-locale"}
	if p.opts.Fast {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(p.BinDir, "initdb"), args...)
	cmd.Dir = p.Dir
	cmd.Env = childEnv()
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.SysProcAttr = sysProcAttr(p.cred, syscall.SIGKILL)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("localnode: initdb %s: %w\n%s", p.Dir, err, tail(out.Bytes(), 30))
	}
	hba := strings.Join([]string{
		"# written by lattice localnode: trust on loopback and the socket only",
		"local   all          all                 trust",
		"host    all          all   127.0.0.1/32  trust",
		"local   replication  all                 trust",
		"host    replication  all   127.0.0.1/32  trust",
		"",
	}, "\n")
	if err := p.writeOwned(filepath.Join(p.Dir, "pg_hba.conf"), hba); err != nil {
		return err
	}
	conf := filepath.Join(p.Dir, "postgresql.conf")
	f, err := os.OpenFile(conf, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("localnode: %w", err)
	}
	_, err = f.WriteString("\n# lattice localnode settings (rewritten at each start)\ninclude_if_exists = 'lattice.conf'\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("localnode: %w", err)
	}
	return nil
}

// writeConf writes Dir/lattice.conf, which postgresql.conf includes last.
func (p *Postgres) writeConf() error {
	s := p.settings()
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if p.opts.TLSCert != nil {
		// PostgreSQL wants the key owned by the server's user, mode 0600.
		if err := p.writeOwned(s["ssl_cert_file"], string(p.opts.TLSCert)); err != nil {
			return err
		}
		if err := p.writeOwned(s["ssl_key_file"], string(p.opts.TLSKey)); err != nil {
			return err
		}
	}
	var b strings.Builder
	b.WriteString("# written by lattice localnode\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(s[k], "'", "''"))
	}
	return p.writeOwned(filepath.Join(p.Dir, "lattice.conf"), b.String())
}

func (p *Postgres) writeOwned(path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return fmt.Errorf("localnode: %w", err)
	}
	if p.cred != nil {
		if err := os.Chown(path, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			return fmt.Errorf("localnode: %w", err)
		}
	}
	return nil
}

var errAddrInUse = errors.New("address already in use")

// start runs postgres -D Dir and waits until it accepts connections.
func (p *Postgres) start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil && !p.proc.exited() {
		return fmt.Errorf("localnode: postgres %s is already running", p.Name)
	}
	logStart := fileSize(p.LogPath)
	pr, err := startProc(filepath.Join(p.BinDir, "postgres"), []string{"-D", p.Dir}, p.Dir, p.LogPath, p.cred, syscall.SIGQUIT)
	if err != nil {
		return err
	}
	if err := p.waitReady(ctx, pr); err != nil {
		_ = pr.stop(syscall.SIGQUIT, 5*time.Second)
		newLog := readFrom(p.LogPath, logStart)
		if strings.Contains(newLog, "already in use") || strings.Contains(newLog, "could not bind") {
			return fmt.Errorf("%w: port %d: %v", errAddrInUse, p.Port, err)
		}
		return fmt.Errorf("localnode: postgres %s (port %d) did not start: %w\n--- log tail (%s) ---\n%s",
			p.Name, p.Port, err, p.LogPath, fileTail(p.LogPath, 25))
	}
	p.proc = pr
	return nil
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

func readFrom(path string, off int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < off {
		return ""
	}
	return string(b[off:])
}

func (p *Postgres) startTimeout() time.Duration {
	if p.opts.StartTimeout > 0 {
		return p.opts.StartTimeout
	}
	return 90 * time.Second
}

// waitReady polls with a real connection and query until the server answers,
// the process exits, or the deadline passes. The server must be p's own:
// two processes starting servers at once (make test's parts) can be handed
// the same free port, and the one whose bind failed would otherwise take
// the other's server, until its own exited, for ready (ci-123: both then
// created their database on it).
func (p *Postgres) waitReady(ctx context.Context, pr *proc) error {
	ctx, cancel := context.WithTimeout(ctx, p.startTimeout())
	defer cancel()
	var lastErr error
	for {
		if pr.exited() {
			return fmt.Errorf("postgres exited: %v", pr.err)
		}
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		conn, err := pgx.Connect(cctx, p.DSN("postgres"))
		if err == nil {
			var dir string
			err = conn.QueryRow(cctx, "SELECT current_setting('data_directory')").Scan(&dir)
			conn.Close(context.Background())
			if own, aerr := filepath.Abs(p.Dir); err == nil && aerr == nil && filepath.Clean(dir) != own {
				err = fmt.Errorf("port %d answers for data directory %s, not %s", p.Port, dir, p.Dir)
			}
		}
		ccancel()
		if err == nil {
			return nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w (last error: %v)", ctx.Err(), lastErr)
		case <-pr.done:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// DSN returns postgres://lattice@127.0.0.1:PORT/DATABASE?sslmode=disable.
func (p *Postgres) DSN(database string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", Superuser, p.Port, url.PathEscape(database))
}

// CreateDatabase creates database name; one that already exists is not an
// error.
func (p *Postgres) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, p.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("localnode: connect to %s: %w", p.Name, err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	if sqlstate.Is(err, sqlstate.DuplicateDatabase) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("localnode: create database %q on %s: %w", name, p.Name, err)
	}
	return nil
}

// Running reports whether the postmaster is running.
func (p *Postgres) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc != nil && !p.proc.exited()
}

// Stop shuts the server down (fast shutdown: open transactions are rolled
// back), waits for the postmaster and every backend to exit, and kills
// whatever is left after 60s. Stopping a stopped server is a no-op.
func (p *Postgres) Stop() error {
	p.mu.Lock()
	pr := p.proc
	p.proc = nil
	p.mu.Unlock()
	if pr == nil {
		return nil
	}
	if err := pr.stop(syscall.SIGINT, 60*time.Second); err != nil {
		return fmt.Errorf("localnode: postgres %s: %w", p.Name, err)
	}
	slog.Info("localnode: postgres stopped", "name", p.Name, "port", p.Port)
	return nil
}

// Kill crashes the server: SIGKILL to the postmaster and to every backend
// (its whole process group), as when the machine loses power, though with
// fsync=off only a real power loss loses data. Restart runs crash recovery.
func (p *Postgres) Kill() error {
	p.mu.Lock()
	pr := p.proc
	p.proc = nil
	p.mu.Unlock()
	if pr == nil {
		return nil
	}
	pr.killGroup()
	if !pr.wait(30 * time.Second) {
		return fmt.Errorf("localnode: postgres %s: pid %d did not die after SIGKILL", p.Name, pr.pid())
	}
	if !pr.waitGroupGone(15 * time.Second) {
		return fmt.Errorf("localnode: postgres %s: processes of group %d still alive after SIGKILL", p.Name, pr.pid())
	}
	slog.Info("localnode: postgres killed", "name", p.Name, "port", p.Port)
	return nil
}

// Restart starts the server again on the same port and data directory
// (stopping it first if it runs) and waits until it accepts connections.
func (p *Postgres) Restart(ctx context.Context) error {
	if err := p.Stop(); err != nil {
		return err
	}
	start := time.Now()
	if err := p.start(ctx); err != nil {
		return err
	}
	slog.Info("localnode: postgres restarted", "name", p.Name, "port", p.Port, "took", time.Since(start).Round(time.Millisecond))
	return nil
}
