package migrator

import (
	"context"
	"fmt"
)

// exportAfterFlip exports a move's snapshots (5.5) once its flip is
// written, out of the write pause, so that the pause runs the same steps
// with the verification on as with it off. Both still show the rows as of
// the flip:
//
//   - From the fence until the release nothing but the release writes the
//     source's moving rows, so any snapshot in between sees the same rows.
//   - Clients may write the target from the flip on, but each such write
//     is in the target's write log, in the write's own transaction, and the
//     comparison reads the target's rows as of the flip through that log
//     (flipImage) under the snapshot. The stream applied every change of
//     the moving slots before the flip (the final drain), and its writes
//     after that touch only its progress row.
//
// When an export fails, the caller drops the snapshots: the move is then
// compared from the target's write log, as after a crash.
func exportAfterFlip(ctx context.Context, snaps Snapshots) error {
	side := func(name string, take func(context.Context) error) func() error {
		return func() error {
			if err := take(ctx); err != nil {
				return fmt.Errorf("migrator: %s snapshot: %w", name, err)
			}
			return nil
		}
	}
	return both(side("target", snaps.TakeTarget), side("source", snaps.TakeSource))
}
