//go:build unix

package procs

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time, user and kernel, of every thread of the process.
func cpuTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
