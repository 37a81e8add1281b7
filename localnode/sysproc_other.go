//go:build unix && !linux

package localnode

import "syscall"

// sysProcAttr puts the child in its own process group and runs it as cred
// (when not nil). Only Linux has a parent-death signal: elsewhere a server
// can outlive a parent that is killed with SIGKILL.
func sysProcAttr(cred *syscall.Credential, _ syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Setpgid:    true,
		Credential: cred,
	}
}

// groupAlive reports whether a process of group pgid exists (zombies
// included: there is no portable way to tell them apart).
func groupAlive(pgid int) bool { return syscall.Kill(-pgid, 0) == nil }

// procID names a child process; only Linux lists children, and there
// PostgreSQL's setsid() children are also what the group kill misses.
type procID struct{ pid int }

func childrenOf(int) []procID { return nil }

func (procID) alive() bool { return false }

func (procID) kill() {}
