package localnode

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// handedOut remembers the ports FreePort returned, so that two servers started
// at the same time by this process never get the same one.
var (
	portMu    sync.Mutex
	handedOut = map[int]bool{}
)

// FreePort returns a TCP port on 127.0.0.1 that was free when asked and that
// this process has not handed out before. Another process may still take it
// before it is bound; the Start functions retry with a new port when the bind
// fails.
func FreePort() (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	for i := 0; i < 50; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("localnode: find a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handedOut[port] {
			handedOut[port] = true
			return port, nil
		}
	}
	return 0, errors.New("localnode: find a free port: no unused port after 50 tries")
}

// proc is one started server process, the leader of its own process group.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and was reaped
	err  error         // Wait's result, valid after done

	mu   sync.Mutex
	kids []procID // the leader's children seen by killGroup
}

// childEnv is the environment of a server process: ours without the libpq
// variables that could redirect a tool, with a fixed locale for stable
// messages.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C", "LANG=C")
}

// startProc starts path with args in its own process group, stdout and stderr
// appended to logPath, as cred when not nil. The kernel sends deathSig to the
// process when this process dies (Linux).
func startProc(path string, args []string, dir, logPath string, cred *syscall.Credential, deathSig syscall.Signal) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("localnode: open log: %w", err)
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	cmd.Env = childEnv()
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr(cred, deathSig)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("localnode: start %s: %w", filepath.Base(path), err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process (not its group).
func (p *proc) signal(sig syscall.Signal) {
	if !p.exited() {
		_ = syscall.Kill(p.pid(), sig)
	}
}

// killGroup sends SIGKILL to every process of the group and to every
// child of the leader. PostgreSQL's children each call setsid(), leaving
// the group, and a backend outlives a killed postmaster until it next
// looks: the leader is stopped first, so that it forks no child between
// the listing and the kill.
func (p *proc) killGroup() {
	pid := p.pid()
	if !p.exited() {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	p.mu.Lock()
	for _, c := range childrenOf(pid) {
		if !slices.Contains(p.kids, c) {
			p.kids = append(p.kids, c)
		}
	}
	kids := slices.Clone(p.kids)
	p.mu.Unlock()
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	for _, c := range kids {
		c.kill()
	}
}

// remaining reports whether a live process of the group, or a child of the
// leader that killGroup saw, is left.
func (p *proc) remaining() bool {
	if groupAlive(p.pid()) {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.kids {
		if c.alive() {
			return true
		}
	}
	return false
}

// wait waits up to d for the process to exit.
func (p *proc) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// waitGroupGone kills the group again and again until no live process of
// it (or child of its leader) is left, or d passes. Repeating the kill catches a child forked while
// the first signal was being delivered, which would otherwise keep serving
// (a backend still answering its client, shared memory still in use).
func (p *proc) waitGroupGone(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for p.remaining() {
		if time.Now().After(deadline) {
			return false
		}
		p.killGroup()
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// stop sends sig, waits up to grace for the process to exit, then kills the
// whole group and waits for the leader to be reaped. It never leaves the
// leader running; it reports whether the graceful stop worked.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) error {
	p.signal(sig)
	graceful := p.wait(grace)
	p.killGroup() // leftovers of the group, if any
	if !graceful {
		p.wait(30 * time.Second)
	}
	p.waitGroupGone(5 * time.Second)
	if !graceful {
		return fmt.Errorf("did not exit within %s of %s; killed", grace, sig)
	}
	return nil
}

// serverCredential returns the credential the servers run as: nil when this
// process is not root, otherwise the "postgres" user, or "nobody".
func serverCredential() (*syscall.Credential, string, error) {
	if os.Geteuid() != 0 {
		name := strconv.Itoa(os.Geteuid())
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
		return nil, name, nil
	}
	var lastErr error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			lastErr = err
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			lastErr = fmt.Errorf("user %s has a non-numeric uid/gid", name)
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, name, nil
	}
	return nil, "", fmt.Errorf("localnode: running as root but neither user postgres nor nobody exists (%v); PostgreSQL refuses to run as root", lastErr)
}

// chownTree gives dir and everything below it to cred.
func chownTree(dir string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	return filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(cred.Uid), int(cred.Gid))
	})
}

// ServerCanEnter returns an error when the user PostgreSQL would run as
// cannot reach dir: some ancestor of it is closed to that user (a root-owned
// 0700 home such as /root, typically).
func ServerCanEnter(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	cred, name, err := serverCredential()
	if err != nil {
		return err
	}
	return checkSearchable(abs, cred, name)
}

// checkSearchable returns an error when some ancestor of dir cannot be
// traversed by cred's user (a root-owned 0700 temp dir or /root, typically).
func checkSearchable(dir string, cred *syscall.Credential, userName string) error {
	if cred == nil {
		return nil
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return err
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		mode := st.Mode().Perm()
		ok = ok && (mode&0o001 != 0 ||
			(sys.Uid == cred.Uid && mode&0o100 != 0) ||
			(sys.Gid == cred.Gid && mode&0o010 != 0))
		if !ok {
			return fmt.Errorf("localnode: %s (mode %v) cannot be entered by user %s, which PostgreSQL runs as when started by root; "+
				"use a directory under one that others may enter (such as /tmp) or run chmod o+x %s", d, mode, userName, d)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}
