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
