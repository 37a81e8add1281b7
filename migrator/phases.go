package migrator

import (
	"fmt"

	"github.com/lattice-db/lattice/shardmap"
)

// phase is one row of the pipeline's phase table: what the phase does,
// where a run that finds it recorded resumes, and the phases it may be
// followed by. setPhase refuses any other transition, so the table is
// the pipeline's, not a comment about it.
type phase struct {
	// does: the work done while the record holds the phase.
	does string
	// resume: what a run that finds the phase recorded (after a crash) does.
	resume string
	next   []shardmap.MigrationPhase
	// flipped: the map already routes the slots to the target.
	flipped bool
	// operator: the migration waits for lattice_repair_migration; no run
	// starts it, and the reshard does not go on.
	operator bool
}

// phases is the pipeline of docs/DESIGN.md section 5.
var phases = map[shardmap.MigrationPhase]phase{
	shardmap.PhasePrepare: {
		does:   "split: create the target table; fold: mark the survivor mixed and wait for the acknowledgements",
		resume: "prepare again (both steps can run again)",
		next:   []shardmap.MigrationPhase{shardmap.PhaseCopy},
	},
	shardmap.PhaseCopy: {
		does:   "publication, slot and the copy under the slot's exported snapshot",
		resume: "a copy that did not commit starts over; a committed one resumes its stream",
		next:   []shardmap.MigrationPhase{shardmap.PhaseDrain},
	},
	shardmap.PhaseDrain: {
		does:   "stream until the lag is under FreezeLag and no bulk write hits the source node",
		resume: "resume the stream from applied_lsn and drain",
		next:   []shardmap.MigrationPhase{shardmap.PhaseFreeze},
	},
	shardmap.PhaseFreeze: {
		does:   "freeze, acknowledgements, fence, final drain, snapshots, flip",
		resume: "flipped already: on to flip; else drop the fence, thaw and drain again",
		// drain: a freeze that did not fit its budget, or one a crash cut.
		next: []shardmap.MigrationPhase{shardmap.PhaseFlip, shardmap.PhaseDrain},
	},
	shardmap.PhaseFlip: {
		does:    "compare the moving slots on source and target as of the flip",
		resume:  "the snapshots died with the run: compare the source's fenced rows with the target's as of the flip, rebuilt from its write log",
		next:    []shardmap.MigrationPhase{shardmap.PhaseRelease, shardmap.PhaseVerifyFailed},
		flipped: true,
	},
	shardmap.PhaseVerifyFailed: {
		does:     "nothing: the source keeps its rows until lattice_repair_migration",
		resume:   "wait for the operator",
		next:     []shardmap.MigrationPhase{shardmap.PhaseRelease},
		flipped:  true,
		operator: true,
	},
	shardmap.PhaseRelease: {
		does:    "wait for the acknowledgements, drop the target's write log, slot, publication and fence, delete the moved rows or drop the donor",
		resume:  "release again (every step accepts missing pieces)",
		next:    []shardmap.MigrationPhase{shardmap.PhaseDone},
		flipped: true,
	},
	shardmap.PhaseDone: {
		does:    "delete the record",
		resume:  "delete the record",
		flipped: true,
	},
}

// checkTransition refuses a phase change the table does not list.
func checkTransition(mig *shardmap.Migration, to shardmap.MigrationPhase) error {
	from, ok := phases[mig.Phase]
	if !ok {
		return fmt.Errorf("migrator: migration %s has unknown phase %q", mig.ID, mig.Phase)
	}
	for _, n := range from.next {
		if n == to {
			return nil
		}
	}
	return fmt.Errorf("migrator: migration %s cannot go from phase %s to %s", mig.ID, mig.Phase, to)
}

// phaseFlipped reports whether a migration in phase p has flipped.
func phaseFlipped(p shardmap.MigrationPhase) bool { return phases[p].flipped }

// phaseOperator reports whether a migration in phase p waits for an operator.
func phaseOperator(p shardmap.MigrationPhase) bool { return phases[p].operator }
