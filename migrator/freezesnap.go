package migrator

import (
	"context"
	"fmt"
)

// freezeSnapshots takes a move's snapshots (5.5) inside its freeze without
// a round trip of their own on the pause's path:
//
//   - The target's is exported beside the fence. Before the flip only the
//     stream writes the moving slots there, so if the stream committed
//     nothing on the target from before that export until the final drain
//     ended (Stream.Commits), the snapshot holds what the target holds once
//     it has applied past the fence. Otherwise it is exported again after
//     the flip, out of the pause: clients may have written the target by
//     then, but each such write is in the target's write log in the same
//     transaction, and the comparison reads the target's rows as of the
//     flip through that log (flipImage) under the snapshot.
//   - The source's is exported once the fence is armed, beside the final
//     drain and the flip: from the fence until the release, nothing but the
//     release writes the source's moving rows, so any snapshot in between
//     sees the same rows. The flip does not wait for it; a failed export
//     leaves the move without a source snapshot, and its comparison cannot
//     run (verify_failed), as when a node is out of reach after the flip.
//
// A nil *freezeSnapshots (verification off) does nothing.
type freezeSnapshots struct {
	snaps   Snapshots
	sh      Stream
	commits uint64     // Stream.Commits before the target's export
	tgt     chan error // the target's export beside the fence
	src     chan error // the source's export after the fence
	again   bool       // the target's snapshot was exported again
}

func newFreezeSnapshots(snaps Snapshots, sh Stream) *freezeSnapshots {
	if snaps == nil {
		return nil
	}
	return &freezeSnapshots{snaps: snaps, sh: sh}
}

// besideFence starts the target's export; call it as the fence starts.
func (f *freezeSnapshots) besideFence(ctx context.Context) {
	if f == nil {
		return
	}
	f.commits = f.sh.Commits()
	f.tgt = make(chan error, 1)
	go func() { f.tgt <- f.snaps.TakeTarget(ctx) }()
}

// fenced starts the source's export; call it once the fence is armed.
func (f *freezeSnapshots) fenced(ctx context.Context) {
	if f == nil {
		return
	}
	f.src = make(chan error, 1)
	go func() { f.src <- f.snaps.TakeSource(ctx) }()
}

// drained notes, once the target has applied past the fence, whether the
// stream may have committed after the target's export began: that export
// is then taken again after the flip. It waits for nothing.
func (f *freezeSnapshots) drained() {
	if f == nil || f.tgt == nil {
		return
	}
	c := f.sh.Commits()
	f.again = c != f.commits || c%2 == 1
}

// flipped waits for the exports, after the flip, and exports the target's
// again if the first may miss some of the stream's writes or failed.
func (f *freezeSnapshots) flipped(ctx context.Context) error {
	if f == nil {
		return nil
	}
	if f.tgt != nil {
		err := <-f.tgt
		f.tgt = nil
		if err != nil || f.again {
			f.again = true
			if err := f.snaps.TakeTarget(ctx); err != nil {
				return fmt.Errorf("migrator: target snapshot: %w", err)
			}
		}
	}
	if f.src == nil {
		return nil
	}
	err := <-f.src
	f.src = nil
	if err != nil {
		return fmt.Errorf("migrator: source snapshot: %w", err)
	}
	return nil
}

// wait waits for the exports still running, so that the snapshots can be
// closed (a freeze that rolls back).
func (f *freezeSnapshots) wait() {
	if f == nil {
		return
	}
	for _, c := range []chan error{f.tgt, f.src} {
		if c != nil {
			<-c
		}
	}
	f.tgt, f.src = nil, nil
}

// retaken reports whether the target's snapshot was exported again after
// the flip, for the freeze's log line.
func (f *freezeSnapshots) retaken() bool { return f != nil && f.again }

// Commits implements Stream.
func (sh *Shadow) Commits() uint64 { return sh.commits.Load() }
