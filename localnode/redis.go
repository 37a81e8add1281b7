package localnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Redis is a running (or stopped) local redis-server.
type Redis struct {
	Addr    string // 127.0.0.1:PORT
	Port    int
	Dir     string // working directory: AOF files and the log
	LogPath string // Dir/redis.log

	bin string
	mu  sync.Mutex
	pr  *proc
}

// StartRedis starts redis-server on a free loopback port with appendonly yes
// (so data survives Kill and Restart), RDB snapshots off, and its files in
// dir, and waits until it answers PING.
func StartRedis(ctx context.Context, dir string) (*Redis, error) {
	start := time.Now()
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	bin := RedisServerPath()
	if bin == "" {
		return nil, fmt.Errorf("localnode: redis-server not found; install it: %s", installHint())
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("localnode: %w", err)
	}
	r := &Redis{Dir: abs, LogPath: filepath.Join(abs, "redis.log"), bin: bin}
	for attempt := 1; ; attempt++ {
		if r.Port, err = FreePort(); err != nil {
			return nil, err
		}
		r.Addr = fmt.Sprintf("127.0.0.1:%d", r.Port)
		err = r.start(ctx)
		if err == nil {
			break
		}
		if attempt >= 5 || !errors.Is(err, errAddrInUse) {
			return nil, err
		}
		slog.Warn("localnode: redis port taken, retrying", "port", r.Port)
	}
	slog.Info("localnode: redis ready", "addr", r.Addr, "dir", abs, "took", time.Since(start).Round(time.Millisecond))
	return r, nil
}

func (r *Redis) args() []string {
	return []string{
		"--port", fmt.Sprint(r.Port),
		"--bind", "127.0.0.1",
		"--dir", r.Dir,
		"--daemonize", "no",
		"--appendonly", "yes",
		"--appendfsync", "everysec",
		"--save", "",
		"--logfile", "",
		"--databases", "16",
	}
}

func (r *Redis) start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pr != nil && !r.pr.exited() {
		return errors.New("localnode: redis is already running")
	}
	logStart := fileSize(r.LogPath)
	pr, err := startProc(r.bin, r.args(), r.Dir, r.LogPath, nil, syscall.SIGKILL)
	if err != nil {
		return err
	}
	if err := waitPing(ctx, pr, r.Addr, 60*time.Second); err != nil {
		_ = pr.stop(syscall.SIGKILL, time.Second)
		if strings.Contains(readFrom(r.LogPath, logStart), "already in use") {
			return fmt.Errorf("%w: port %d: %v", errAddrInUse, r.Port, err)
		}
		return fmt.Errorf("localnode: redis-server (port %d) did not start: %w\n--- log tail (%s) ---\n%s",
			r.Port, err, r.LogPath, fileTail(r.LogPath, 25))
	}
	r.pr = pr
	return nil
}

// waitPing waits until the server at addr answers PING with PONG (a server
// still loading its AOF answers -LOADING and is waited for).
func waitPing(ctx context.Context, pr *proc, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	for {
		if pr.exited() {
			return fmt.Errorf("redis-server exited: %v", pr.err)
		}
		lastErr = ping(ctx, addr)
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w (last error: %v)", ctx.Err(), lastErr)
		case <-pr.done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ping sends one PING in RESP and expects +PONG.
func ping(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// URL returns redis://127.0.0.1:PORT/0.
func (r *Redis) URL() string {
	return fmt.Sprintf("redis://%s/0", r.Addr)
}

// Running reports whether redis-server is running.
func (r *Redis) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pr != nil && !r.pr.exited()
}

// Stop shuts redis-server down with SIGTERM (it flushes the AOF first) and
// waits for it to exit, killing it after 30s. Stopping a stopped server is a
// no-op.
func (r *Redis) Stop() error {
	r.mu.Lock()
	pr := r.pr
	r.pr = nil
	r.mu.Unlock()
	if pr == nil {
		return nil
	}
	if err := pr.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		return fmt.Errorf("localnode: redis-server: %w", err)
	}
	slog.Info("localnode: redis stopped", "addr", r.Addr)
	return nil
}

// Kill crashes redis-server with SIGKILL. Acknowledged writes survive a
// Restart: redis writes the AOF before it replies, and only a crash of the
// machine would lose the last second (appendfsync everysec).
func (r *Redis) Kill() error {
	r.mu.Lock()
	pr := r.pr
	r.pr = nil
	r.mu.Unlock()
	if pr == nil {
		return nil
	}
	pr.killGroup()
	if !pr.wait(30 * time.Second) {
		return fmt.Errorf("localnode: redis-server pid %d did not die after SIGKILL", pr.pid())
	}
	slog.Info("localnode: redis killed", "addr", r.Addr)
	return nil
}

// Restart starts redis-server again on the same port and directory (stopping
// it first if it runs); it reloads the AOF before answering PING.
func (r *Redis) Restart(ctx context.Context) error {
	if err := r.Stop(); err != nil {
		return err
	}
	if err := r.start(ctx); err != nil {
		return err
	}
	slog.Info("localnode: redis restarted", "addr", r.Addr)
	return nil
}
