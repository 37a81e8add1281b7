package migrator

import (
	"log/slog"
	"os"
	"strings"
	"syscall"
	"time"
)

// crashAt names a point of the pipeline at which the process kills itself
// with SIGKILL, for the crash tests only (LATTICE_TEST_CRASH_AT): prepare
// (a move's target table made, phase not recorded), copy
// (before the copy commits), drain, freeze (fence installed, map not
// flipped), flip (map flipped, phase not recorded), release (stream
// dropped, rows not yet deleted), sweep (a split's release has deleted the
// moved rows of its first block range, not of the others), merge_copy (a
// merge's transfer has staged rows on the target node, not upserted them),
// merge_shard_done (a merge recorded a source shard drained, outside any
// transaction), merge_route (a merge read the target's map, and routes rows
// by it next). Never set it in production.
var crashAt = os.Getenv("LATTICE_TEST_CRASH_AT")

// holdAt, "point:path" (LATTICE_TEST_HOLD_AT, tests only; several
// separated by commas), holds every run that reaches point while path
// exists, after creating path.reached: a test acts on the nodes there (the
// verification test corrupts a copied row in the drain) and removes path to
// let the run go on. Point resize is a resize's, drained and not frozen yet
// (it still only forwards its shard); resize_rewrite is a resize
// operation's, its layout recorded and no shard's migration started yet.
var holdAt = os.Getenv("LATTICE_TEST_HOLD_AT")

func crashPoint(point string) {
	if crashAt != "" && crashAt == point {
		slog.Error("LATTICE_TEST_CRASH_AT: killing this process", "point", point)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal ends the process
	}
	for _, hold := range strings.Split(holdAt, ",") {
		if p, path, ok := strings.Cut(hold, ":"); ok && p == point {
			if _, err := os.Stat(path); err == nil {
				slog.Warn("LATTICE_TEST_HOLD_AT: holding the run", "point", point, "while", path)
				_ = os.WriteFile(path+".reached", nil, 0o644)
				for {
					if _, err := os.Stat(path); err != nil {
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
	}
}
