// Package localnode starts throwaway local PostgreSQL and Redis servers for
// `lattice demo` and the integration tests.
//
// Every server runs on a free loopback port, in its own process group, and
// receives a signal from the kernel if the process that started it dies
// (Pdeathsig), so a crashed test binary leaves no server behind. PostgreSQL
// refuses to run as root: when this process is root, initdb and postgres run
// as the unprivileged "postgres" user (or "nobody" if that user is absent).
package localnode

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// DefaultPGBinDir is where Debian's postgresql-15 package installs the server
// binaries.
const DefaultPGBinDir = "/usr/lib/postgresql/15/bin"

// PGBinDirEnv overrides DefaultPGBinDir (a directory holding postgres and
// initdb of PostgreSQL 15 or newer).
const PGBinDirEnv = "LATTICE_PG_BINDIR"

// AptPackages are the Debian packages EnsureTools installs.
var AptPackages = []string{"postgresql-15", "redis-server"}

// PGBinDir returns the directory holding the PostgreSQL server binaries.
func PGBinDir() string {
	if d := os.Getenv(PGBinDirEnv); d != "" {
		return d
	}
	return DefaultPGBinDir
}

// RedisServerPath returns the path of redis-server, or "" when not found.
func RedisServerPath() string {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server"} {
		if isExecutable(p) {
			return p
		}
	}
	return ""
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode().Perm()&0o111 != 0
}

// toolEnv is what ensureTools needs from the machine, injectable for tests.
type toolEnv struct {
	pgBinDir   string
	redisPath  func() string
	euid       int
	aptInstall func(ctx context.Context, pkgs []string) error
}

var ensureMu sync.Mutex

// EnsureTools finds the PostgreSQL 15 server binaries (postgres, initdb) and
// redis-server. When some are missing and the process runs as root it runs
// `apt-get update` and `apt-get install -y postgresql-15 redis-server`
// (DEBIAN_FRONTEND=noninteractive); otherwise it returns an error that names
// exactly what is missing and what to install.
func EnsureTools(ctx context.Context) error {
	ensureMu.Lock()
	defer ensureMu.Unlock()
	return ensureTools(ctx, toolEnv{
		pgBinDir:   PGBinDir(),
		redisPath:  RedisServerPath,
		euid:       os.Geteuid(),
		aptInstall: aptInstall,
	})
}

func missingTools(env toolEnv) []string {
	var missing []string
	for _, b := range []string{"postgres", "initdb"} {
		if p := filepath.Join(env.pgBinDir, b); !isExecutable(p) {
			missing = append(missing, p)
		}
	}
	if env.redisPath() == "" {
		missing = append(missing, "redis-server")
	}
	return missing
}

func installHint() string {
	return "sudo apt-get update && sudo apt-get install -y " + strings.Join(AptPackages, " ")
}

func ensureTools(ctx context.Context, env toolEnv) error {
	missing := missingTools(env)
	if len(missing) == 0 {
		return nil
	}
	if env.euid != 0 {
		return fmt.Errorf("localnode: missing %s; install the Debian packages %s as root: %s",
			strings.Join(missing, ", "), strings.Join(AptPackages, " and "), installHint())
	}
	slog.Info("localnode: installing missing tools with apt-get", "missing", missing, "packages", AptPackages)
	if err := env.aptInstall(ctx, AptPackages); err != nil {
		return fmt.Errorf("localnode: missing %s and apt-get install failed: %w", strings.Join(missing, ", "), err)
	}
	if still := missingTools(env); len(still) > 0 {
		return fmt.Errorf("localnode: still missing %s after apt-get install %s",
			strings.Join(still, ", "), strings.Join(AptPackages, " "))
	}
	slog.Info("localnode: tools installed")
	return nil
}

func aptInstall(ctx context.Context, pkgs []string) error {
	run := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = &out
		cmd.Stdin = nil
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, tail(out.Bytes(), 30))
		}
		return nil
	}
	// Wait for a concurrent apt/dpkg run rather than failing on its lock.
	lock := []string{"-o", "DPkg::Lock::Timeout=600"}
	if err := run(append(lock, "update")...); err != nil {
		return err
	}
	return run(append(append(lock, "install", "-y", "--no-install-recommends"), pkgs...)...)
}

// tail returns the last n lines of b.
func tail(b []byte, n int) string {
	b = bytes.TrimRight(b, "\n")
	lines := bytes.Split(b, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// fileTail returns the last n lines of the file at path (reading at most its
// last 64 KiB).
func fileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const max = 64 << 10
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	off := int64(0)
	if st.Size() > max {
		off = st.Size() - max
	}
	buf := make([]byte, st.Size()-off)
	k, _ := f.ReadAt(buf, off)
	return tail(buf[:k], n)
}
