//go:build linux

package localnode

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// sysProcAttr puts the child in its own process group, runs it as cred (when
// not nil) and asks the kernel to send it deathSig when this process dies,
// however it dies. Go applies Pdeathsig after changing the credentials, so it
// survives the switch to the unprivileged user.
func sysProcAttr(cred *syscall.Credential, deathSig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Setpgid:    true,
		Credential: cred,
		Pdeathsig:  deathSig,
	}
}

// groupAlive reports whether a process of group pgid is alive. Zombies do
// not count: they hold no socket or shared memory, and where PID 1 does not
// reap orphans they would otherwise look alive for ever.
func groupAlive(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return syscall.Kill(-pgid, 0) == nil
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// After the command, which is in parentheses and may hold spaces:
		// state, ppid, pgrp.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, err := strconv.Atoi(f[2]); err == nil && g == pgid && pid > 0 {
			return true
		}
	}
	return false
}

// procID names a process by pid and start time, so that a pid the kernel
// has handed to another process since is never signalled.
type procID struct {
	pid   int
	start string
}

// procStat reads a process's state, parent and start time from
// /proc/PID/stat.
func procStat(pid int) (state string, ppid int, start string, ok bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, "", false
	}
	// After the command, which is in parentheses and may hold spaces:
	// state (field 3), ppid (4), ..., starttime (22).
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return "", 0, "", false
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 20 {
		return "", 0, "", false
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0], ppid, f[19], err == nil
}

// childrenOf lists the live children of pid.
func childrenOf(pid int) []procID {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []procID
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, ppid, start, ok := procStat(c); ok && ppid == pid && state != "Z" && state != "X" {
			out = append(out, procID{c, start})
		}
	}
	return out
}

// alive reports whether the process still runs (zombies do not count).
func (c procID) alive() bool {
	state, _, start, ok := procStat(c.pid)
	return ok && start == c.start && state != "Z" && state != "X"
}

func (c procID) kill() {
	if c.alive() {
		_ = syscall.Kill(c.pid, syscall.SIGKILL)
	}
}
