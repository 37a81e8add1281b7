//go:build !unix

package procs

import "time"

func cpuTime() (time.Duration, bool) { return 0, false }
