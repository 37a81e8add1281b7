package shardmap

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestTreeOpRecords(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	snap := &TreeOp{ID: "s1", Tenant: "app", Kind: OpSnapshot, Tree: "acct", Target: "acct_copy", Attempt: "a1", Started: base}
	if cur, err := s.StartTreeOp(ctx, snap); err != nil || cur != nil {
		t.Fatalf("first start: %v %v", cur, err)
	}
	if snap.Phase != OpIntent {
		t.Fatalf("phase %q, want the intent first", snap.Phase)
	}
	tests := []struct {
		name     string
		op       *TreeOp
		conflict string // id of the operation it meets, "" when it is stored
	}{
		{"same kind same tree", &TreeOp{ID: "s2", Tenant: "app", Kind: OpSnapshot, Tree: "acct", Target: "other"}, "s1"},
		{"target already a snapshot's target", &TreeOp{ID: "m1", Tenant: "app", Kind: OpMerge, Tree: "x", Target: "acct_copy"}, "s1"},
		{"target is a running operation's tree", &TreeOp{ID: "m2", Tenant: "app", Kind: OpMerge, Tree: "x", Target: "acct"}, "s1"},
		{"resize beside the snapshot", &TreeOp{ID: "r1", Tenant: "app", Kind: OpResize, Tree: "acct", Started: base.Add(time.Second)}, ""},
		{"another tenant", &TreeOp{ID: "s3", Tenant: "other", Kind: OpSnapshot, Tree: "acct", Target: "acct_copy"}, ""},
		// A colocation group's members share its map: two resizes of it
		// would rewrite the same shards.
		{"resize of a group member", &TreeOp{ID: "r2", Tenant: "other", Kind: OpResize, Tree: "orders", Map: "customers"}, ""},
		{"resize of another member", &TreeOp{ID: "r3", Tenant: "other", Kind: OpResize, Tree: "items", Map: "customers"}, "r2"},
		{"resize of the group's named tree", &TreeOp{ID: "r4", Tenant: "other", Kind: OpResize, Tree: "customers"}, "r2"},
	}
	for _, tc := range tests {
		cur, err := s.StartTreeOp(ctx, tc.op)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := ""
		if cur != nil {
			got = cur.ID
		}
		if got != tc.conflict {
			t.Errorf("%s: met %q, want %q", tc.name, got, tc.conflict)
		}
	}
	ops, err := s.TreeOps(ctx, "app", "acct")
	if err != nil || len(ops) != 2 || ops[0].ID != "s1" || ops[1].ID != "r1" {
		t.Fatalf("ops of acct: %v %v, want s1 then r1", ops, err)
	}
	if ops, _ := s.TreeOps(ctx, "app", "acct_copy"); len(ops) != 1 || ops[0].ID != "s1" {
		t.Fatalf("ops touching the new tree: %v, want s1", ops)
	}
	all, err := s.AllTreeOps(ctx)
	if err != nil || len(all) != 4 {
		t.Fatalf("all ops: %d %v, want 4", len(all), err)
	}

	// A resumed run claims the record; the run before can no longer write.
	snap.Phase, snap.RowsDone = "copy", 10
	if err := s.UpdateTreeOp(ctx, snap); err != nil {
		t.Fatal(err)
	}
	resumed := *snap
	resumed.Attempt = "a2"
	if err := s.ClaimTreeOp(ctx, &resumed, "a1"); err != nil {
		t.Fatal(err)
	}
	snap.RowsDone = 20
	if err := s.UpdateTreeOp(ctx, snap); !errors.Is(err, ErrAttempt) {
		t.Fatalf("write of the old attempt: %v, want ErrAttempt", err)
	}
	if err := s.ClaimTreeOp(ctx, snap, "a1"); !errors.Is(err, ErrAttempt) {
		t.Fatalf("second claim from a1: %v, want ErrAttempt", err)
	}
	ops, _ = s.TreeOps(ctx, "app", "acct_copy")
	if ops[0].Attempt != "a2" || ops[0].RowsDone != 10 || ops[0].Phase != "copy" {
		t.Fatalf("stored %+v, want attempt a2 in copy with 10 rows", ops[0])
	}
	if err := s.FinishTreeOp(ctx, "app", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateTreeOp(ctx, &resumed); !errors.Is(err, ErrNotFound) {
		t.Fatalf("write after finish: %v, want ErrNotFound", err)
	}
	if ops, _ := s.TreeOps(ctx, "app", "acct_copy"); len(ops) != 0 {
		t.Fatalf("after finish: %v", ops)
	}
}
