package migrator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// A shadow copy's replication slot can stop being able to serve it: the
// source invalidated it (max_slot_wal_keep_size; wal_status "lost"), or it
// is gone, or the source's walsender fails to decode the slot's WAL with an
// internal error (class XX, such as "could not map filenode ... to
// relation OID"), which decoding the same WAL again repeats. A run that
// resumed from such a slot would fail the same way at every tick. Before
// the flip the target serves nothing of the moving slots, so the copy
// starts again instead (docs/DESIGN.md 5.1, step 6): the stream that met
// the decoding error drops its slot, and a run that finds the slot gone or
// lost deletes the progress row and copies under a new slot, which first
// empties the target's moving slots.

// errSlotUndecodable marks a stream the source ended with an internal error
// while decoding the slot's WAL.
var errSlotUndecodable = errors.New("the source cannot decode this slot's WAL")

// streamError is the error for an ErrorResponse on the replication stream.
func streamError(e *pgconn.PgError) error {
	if strings.HasPrefix(e.Code, "XX") {
		return fmt.Errorf("migrator: replication stream: %w: %w", errSlotUndecodable, e)
	}
	return fmt.Errorf("migrator: replication stream: %w", e)
}

// slotReplaceTimeout bounds dropping an undecodable slot on the stream's
// connection, which may be broken.
const slotReplaceTimeout = 5 * time.Second

// dropUndecodableSlot drops the slot over the stream's connection, which
// the walsender's error returned to command mode with the slot released.
// If it fails, the next run resumes, meets the error again and retries.
func (sh *Shadow) dropUndecodableSlot(cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), slotReplaceTimeout)
	defer cancel()
	err := pglogrepl.DropReplicationSlot(ctx, sh.repl, sh.spec.Name(), pglogrepl.DropReplicationSlotOptions{})
	sh.log.Warn("the source cannot decode the shadow copy's slot; dropped it, and the next run copies the moving rows again under a new slot",
		"cause", cause, "drop_err", err)
}

// slotTrouble says why the shadow copy's slot cannot serve a resumed
// stream ("" if it can), asked over the replication connection.
func slotTrouble(ctx context.Context, repl *pgconn.PgConn, name string) (string, error) {
	res, err := repl.Exec(ctx, "SELECT coalesce(wal_status, '') FROM pg_catalog.pg_replication_slots WHERE slot_name = "+quoteLiteral(name)).ReadAll()
	if err != nil {
		return "", fmt.Errorf("migrator: look up the replication slot: %w", err)
	}
	switch {
	case len(res) != 1 || len(res[0].Rows) == 0:
		return "the slot is gone", nil
	case string(res[0].Rows[0][0]) == "lost":
		return "the source removed WAL the slot needs (wal_status lost; max_slot_wal_keep_size)", nil
	}
	return "", nil
}
