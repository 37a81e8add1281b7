package integration

import (
	"context"
	"strings"
	"testing"
)

// TestShadowSlotLost: a split's replication slot stops being able to serve
// while the split's copy is held before its commit, with clients writing
// the moving slots, so the changes after the copy's snapshot are in no WAL
// the slot may read: the source invalidates it (max_slot_wal_keep_size), or
// it is dropped (as the stream drops a slot whose WAL the source fails to
// decode). The run that resumes must not stream from it (PostgreSQL
// refuses a lost slot forever); it copies the moving rows again under a new
// slot, and the split ends with every write in the tree (docs/DESIGN.md
// 5.1, step 6).
func TestShadowSlotLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(t *testing.T, ctx context.Context)
	}{
		{"invalidated", invalidateSlots},
		{"dropped", dropSlots},
	} {
		t.Run(tc.name, func(t *testing.T) { loseSlotMidCopy(t, tc.lose) })
	}
}

func loseSlotMidCopy(t *testing.T, lose func(t *testing.T, ctx context.Context)) {
	resetNodes(t)
	if log := splitWithHeldCopy(t, 2000, lose); !strings.Contains(log, "slot cannot serve; copying the moving rows again") {
		t.Errorf("no run said it copies again under a new slot:\n%s", grepLines(log, "migration run|level=ERROR|level=WARN"))
	}
}

// invalidateSlots writes three segments of WAL past the migrations' slots on
// both nodes, under a max_slot_wal_keep_size of 1MB, then checkpoints: the
// source removes the slots' WAL and marks them lost.
func invalidateSlots(t *testing.T, ctx context.Context) {
	setNodeSetting(t, 2, "max_slot_wal_keep_size", "1MB")
	statuses := ""
	for n := range 2 {
		c := connect(t, testNodeDSN(t, n))
		for range 3 {
			mustExec(t, c, "SELECT pg_logical_emit_message(false, 'lattice-test', repeat('x', 1000))")
			mustExec(t, c, "SELECT pg_switch_wal()")
		}
		mustExec(t, c, "CHECKPOINT")
		var status string
		if err := c.QueryRow(ctx, "SELECT coalesce(string_agg(wal_status, ','), '') FROM pg_replication_slots WHERE slot_name LIKE 'lattice_m_%'").Scan(&status); err != nil {
			t.Fatal(err)
		}
		statuses += status
		c.Close(ctx)
	}
	if statuses != "lost" {
		t.Fatalf("the migrations' slots are %q after the checkpoint, want one lost", statuses)
	}
}

// dropSlots ends the migrations' walsenders and drops their slots on both
// nodes.
func dropSlots(t *testing.T, ctx context.Context) {
	dropped := 0
	for n := range 2 {
		c := connect(t, testNodeDSN(t, n))
		mustExec(t, c, "SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots WHERE slot_name LIKE 'lattice_m_%' AND active")
		var d int
		if err := c.QueryRow(ctx, "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots WHERE slot_name LIKE 'lattice_m_%'").Scan(&d); err != nil {
			t.Fatal(err)
		}
		dropped += d
		c.Close(ctx)
	}
	if dropped != 1 {
		t.Fatalf("%d migration slots dropped, want 1", dropped)
	}
}
