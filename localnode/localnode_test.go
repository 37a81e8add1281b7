package localnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestFreePortIsFreeAndUnique(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 20; i++ {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if p <= 0 || p > 65535 {
			t.Fatalf("port %d out of range", p)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		l.Close()
	}
}

func TestEnsureToolsNotRootNamesWhatToInstall(t *testing.T) {
	called := false
	env := toolEnv{
		pgBinDir:  filepath.Join(t.TempDir(), "nope"),
		redisPath: func() string { return "" },
		euid:      1000,
		aptInstall: func(context.Context, []string) error {
			called = true
			return nil
		},
	}
	err := ensureTools(context.Background(), env)
	if err == nil {
		t.Fatal("expected an error when tools are missing and not root")
	}
	if called {
		t.Fatal("apt-get must not run when not root")
	}
	msg := err.Error()
	for _, want := range []string{
		filepath.Join(env.pgBinDir, "postgres"),
		filepath.Join(env.pgBinDir, "initdb"),
		"redis-server",
		"apt-get install -y postgresql-15 redis-server",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
}

func TestEnsureToolsRootInstallsOnlyWhenMissing(t *testing.T) {
	bin := t.TempDir()
	installed := false
	env := toolEnv{
		pgBinDir:  bin,
		redisPath: func() string { return "/usr/bin/redis-server" },
		euid:      0,
		aptInstall: func(_ context.Context, pkgs []string) error {
			if strings.Join(pkgs, " ") != "postgresql-15 redis-server" {
				t.Errorf("apt-get install %v", pkgs)
			}
			installed = true
			for _, b := range []string{"postgres", "initdb"} {
				if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
					return err
				}
			}
			return nil
		},
	}
	if err := ensureTools(context.Background(), env); err != nil {
		t.Fatal(err)
	}
	if !installed {
		t.Fatal("apt-get install not run as root with tools missing")
	}
	installed = false
	if err := ensureTools(context.Background(), env); err != nil || installed {
		t.Fatalf("second call: err=%v installed=%v, want no install", err, installed)
	}
	env.aptInstall = func(context.Context, []string) error { return errors.New("no network") }
	env.pgBinDir = filepath.Join(bin, "missing")
	if err := ensureTools(context.Background(), env); err == nil || !strings.Contains(err.Error(), "no network") {
		t.Fatalf("apt failure not surfaced: %v", err)
	}
}

func TestTail(t *testing.T) {
	if got := tail([]byte("a\nb\nc\nd\n"), 2); got != "c\nd" {
		t.Fatalf("tail = %q", got)
	}
}

// serverTempDir returns a temp dir that the unprivileged server user can
// enter when the test runs as root (t.TempDir's parents are 0700).
func serverTempDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "localnode-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func requireTools(t *testing.T) {
	t.Helper()
	if len(missingTools(toolEnv{pgBinDir: PGBinDir(), redisPath: RedisServerPath})) > 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("PostgreSQL 15 or redis-server missing in CI; make test runs scripts/ensure-tools.sh first")
		}
		t.Skip("PostgreSQL 15 or redis-server not installed: " + installHint())
	}
}

func groupGone(pid int) bool {
	return errors.Is(syscall.Kill(-pid, 0), syscall.ESRCH)
}

func TestPostgresLifecycle(t *testing.T) {
	requireTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := filepath.Join(serverTempDir(t), "pg")
	p, err := StartPostgres(ctx, dir, "t1", PostgresOptions{Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()

	query := func(db, sql string) string {
		t.Helper()
		conn, err := pgx.Connect(ctx, p.DSN(db))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var s string
		if err := conn.QueryRow(ctx, sql).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	for sql, want := range map[string]string{
		"SHOW wal_level":                 "logical",
		"SHOW max_replication_slots":     "64",
		"SHOW max_wal_senders":           "64",
		"SHOW max_prepared_transactions": "64",
		"SHOW max_connections":           "300",
		"SHOW fsync":                     "off",
		"SELECT current_user":            "lattice",
		"SELECT current_database()":      "lattice",
	} {
		if got := query("lattice", sql); got != want {
			t.Errorf("%s = %q, want %q", sql, got, want)
		}
	}
	if os.Geteuid() == 0 {
		st, _ := os.Stat(filepath.Join(dir, "PG_VERSION"))
		if st.Sys().(*syscall.Stat_t).Uid == 0 {
			t.Error("data dir owned by root")
		}
	}
	if err := p.CreateDatabase(ctx, "tenant-a"); err != nil {
		t.Fatal(err)
	}
	if err := p.CreateDatabase(ctx, "tenant-a"); err != nil {
		t.Fatalf("CreateDatabase is not idempotent: %v", err)
	}
	if got := query("tenant-a", "SELECT current_database()"); got != "tenant-a" {
		t.Fatalf("current_database = %q", got)
	}

	// Data survives a crash and a restart on the same port.
	conn, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t(k int primary key); INSERT INTO t VALUES (1),(2),(3)"); err != nil {
		t.Fatal(err)
	}
	port := p.Port
	pid := p.proc.pid()
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("connection still works after Kill")
	}
	conn.Close(ctx)
	if !groupGone(pid) {
		t.Error("processes left after Kill")
	}
	if err := p.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Port != port {
		t.Fatalf("port changed on restart: %d -> %d", port, p.Port)
	}
	if got := query("lattice", "SELECT count(*)::text FROM t"); got != "3" {
		t.Fatalf("rows after crash = %s", got)
	}
	pid = p.proc.pid()
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if !groupGone(pid) {
		t.Error("processes left after Stop")
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	// A second StartPostgres reuses the initialized data directory.
	p2, err := StartPostgres(ctx, dir, "t1", PostgresOptions{Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Stop()
	p = p2
	if got := query("lattice", "SELECT count(*)::text FROM t"); got != "3" {
		t.Fatalf("rows after reuse = %s", got)
	}
}

func TestStartPostgresRefusesForeignDir(t *testing.T) {
	requireTools(t)
	dir := serverTempDir(t)
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := StartPostgres(context.Background(), dir, "x", PostgresOptions{})
	if err == nil || !strings.Contains(err.Error(), "neither empty") {
		t.Fatalf("err = %v", err)
	}
}

func redisCmd(t *testing.T, addr string, args ...string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(c, "$%d\r\n%s\r\n", len(a), a)
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	line = strings.TrimSpace(line)
	if strings.HasPrefix(line, "$") {
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			return "(nil)"
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			t.Fatal(err)
		}
		return string(buf[:n])
	}
	return line
}

func TestRedisLifecycle(t *testing.T) {
	requireTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := StartRedis(ctx, filepath.Join(serverTempDir(t), "redis"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	if !strings.HasPrefix(r.URL(), "redis://127.0.0.1:") || !strings.HasSuffix(r.URL(), "/0") {
		t.Fatalf("URL = %s", r.URL())
	}
	if got := redisCmd(t, r.Addr, "SET", "k", "v"); got != "+OK" {
		t.Fatalf("SET = %s", got)
	}
	pid := r.pr.pid()
	if err := r.Kill(); err != nil {
		t.Fatal(err)
	}
	if !groupGone(pid) {
		t.Error("redis left after Kill")
	}
	if err := r.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if got := redisCmd(t, r.Addr, "GET", "k"); got != "v" {
		t.Fatalf("GET after crash = %s (appendonly lost it)", got)
	}
	pid = r.pr.pid()
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if !groupGone(pid) {
		t.Error("redis left after Stop")
	}
}

// TestServersDieWithParent starts a helper process (this test binary) that
// starts redis-server and PostgreSQL and is then killed with SIGKILL: both
// servers must go with it.
func TestServersDieWithParent(t *testing.T) {
	if os.Getenv("LOCALNODE_HELPER_DIR") != "" {
		t.Skip("helper")
	}
	requireTools(t)
	dir := serverTempDir(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperStartServers$", "-test.v")
	cmd.Env = append(os.Environ(), "LOCALNODE_HELPER_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pids []int
	sc := bufio.NewScanner(out)
	for len(pids) < 2 && sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "SERVERPID "); ok {
			pid, _ := strconv.Atoi(rest)
			pids = append(pids, pid)
		}
	}
	if len(pids) != 2 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper did not report two server pids: %v", pids)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	deadline := time.Now().Add(15 * time.Second)
	for _, pid := range pids {
		for !groupGone(pid) {
			if time.Now().After(deadline) {
				syscall.Kill(-pid, syscall.SIGKILL)
				t.Fatalf("server process group %d outlived its killed parent", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func TestHelperStartServers(t *testing.T) {
	dir := os.Getenv("LOCALNODE_HELPER_DIR")
	if dir == "" {
		t.Skip("only run as a helper of TestServersDieWithParent")
	}
	ctx := context.Background()
	r, err := StartRedis(ctx, filepath.Join(dir, "redis"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("SERVERPID %d\n", r.pr.pid())
	p, err := StartPostgres(ctx, filepath.Join(dir, "pg"), "h", PostgresOptions{Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("SERVERPID %d\n", p.proc.pid())
	time.Sleep(time.Minute) // killed by the parent test
}

// TestStartPostgresFromTemplate: nodes with a Template copy one initdb's
// data directory (a half-made template is made again), and each is a
// server of its own.
func TestStartPostgresFromTemplate(t *testing.T) {
	requireTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := serverTempDir(t)
	tmpl := filepath.Join(base, "template")
	if err := os.MkdirAll(tmpl, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmpl, "left-by-a-killed-initdb"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var nodes []*Postgres
	for _, name := range []string{"a", "b"} {
		p, err := StartPostgres(ctx, filepath.Join(base, name), name, PostgresOptions{Fast: true, Template: tmpl})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Stop()
		nodes = append(nodes, p)
	}
	if _, err := os.Stat(filepath.Join(tmpl, "left-by-a-killed-initdb")); !os.IsNotExist(err) {
		t.Errorf("the half-made template was kept: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tmpl, "postmaster.pid")); !os.IsNotExist(err) {
		t.Errorf("the template was started: %v", err)
	}
	for _, p := range nodes {
		for path, want := range map[string]os.FileMode{p.Dir: 0o700, filepath.Join(p.Dir, "PG_VERSION"): 0o600} {
			if st, err := os.Stat(path); err != nil || st.Mode().Perm() != want {
				t.Errorf("%s: mode %v, %v; want %v", path, st.Mode().Perm(), err, want)
			}
		}
	}
	a, err := pgx.Connect(ctx, nodes[0].DSN(DefaultDatabase))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	if _, err := a.Exec(ctx, "CREATE TABLE only_on_a (k int)"); err != nil {
		t.Fatal(err)
	}
	b, err := pgx.Connect(ctx, nodes[1].DSN(DefaultDatabase))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = 'only_on_a'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("node b sees node a's table: %d, %v", n, err)
	}
}

// TestWaitReadyWantsItsOwnServer: a server starting on a port another
// server holds (two processes handed the same free port) is not ready
// while its process lives, though the port answers; once its process
// exits, as PostgreSQL does when its bind fails, the start fails.
func TestWaitReadyWantsItsOwnServer(t *testing.T) {
	requireTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := serverTempDir(t)
	other, err := StartPostgres(ctx, filepath.Join(base, "other"), "other", PostgresOptions{Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Stop()
	p := &Postgres{Name: "late", Dir: filepath.Join(base, "late"), Port: other.Port, opts: PostgresOptions{StartTimeout: 10 * time.Second}}
	pr, err := startProc("/bin/sleep", []string{"1"}, base, filepath.Join(base, "sleep.log"), nil, syscall.SIGKILL)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.stop(syscall.SIGKILL, time.Second)
	if err := p.waitReady(ctx, pr); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("waitReady on another server's port: %v, want the process's exit", err)
	}
}
