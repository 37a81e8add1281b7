package migrator

import (
	"log/slog"
	"os"
	"syscall"
)

// crashAt names a point of the pipeline at which the process kills itself
// with SIGKILL, for the crash tests only (LATTICE_TEST_CRASH_AT): prepare
// (a move's target table made, phase not recorded), copy
// (before the copy commits), drain, freeze (fence installed, map not
// flipped), flip (map flipped, phase not recorded), release (stream
// dropped, rows not yet deleted). Never set it in production.
var crashAt = os.Getenv("LATTICE_TEST_CRASH_AT")

func crashPoint(point string) {
	if crashAt != "" && crashAt == point {
		slog.Error("LATTICE_TEST_CRASH_AT: killing this process", "point", point)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal ends the process
	}
}
