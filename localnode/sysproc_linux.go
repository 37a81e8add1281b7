//go:build linux

package localnode

import "syscall"

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
