package shardmap

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
)

func TestSwapTree(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "catalogue")
	stored, err := s.Tree(ctx, "app", "catalogue")
	if err != nil {
		t.Fatal(err)
	}
	next := *stored
	next.DDL = append(slices.Clone(stored.DDL), "ALTER TABLE {{table}} ADD COLUMN color text")
	next.Columns = append(slices.Clone(stored.Columns), "color")

	tests := []struct {
		name   string
		t      *Tree
		prev   *Tree
		target error
	}{
		{"from the stored entry", &next, stored, nil},
		{"from an outdated entry", &next, stored, ErrConflict}, // stored is no longer what Redis holds
		{"missing tree", &Tree{Tenant: "app", Name: "gone"}, &Tree{Tenant: "app", Name: "gone"}, ErrNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := s.SwapTree(ctx, tc.t, tc.prev)
			if !errors.Is(err, tc.target) || (tc.target == nil) != (err == nil) {
				t.Fatalf("SwapTree = %v, want %v", err, tc.target)
			}
		})
	}
	got, err := s.Tree(ctx, "app", "catalogue")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.DDL, next.DDL) || !slices.Equal(got.Columns, next.Columns) {
		t.Fatalf("stored tree %+v, want %+v", got, next)
	}
}

// TestSwapTreeConcurrent: of writers that all start from the same entry,
// exactly one wins; the others see ErrConflict.
func TestSwapTreeConcurrent(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustCreate(t, s, "app", "catalogue")
	prev, err := s.Tree(ctx, "app", "catalogue")
	if err != nil {
		t.Fatal(err)
	}
	const writers = 8
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := *prev
			next.DDL = append(slices.Clone(prev.DDL), "ALTER TABLE {{table}} ADD COLUMN c"+string(rune('a'+i))+" int")
			errs[i] = s.SwapTree(ctx, &next, prev)
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ErrConflict):
			t.Fatalf("SwapTree: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d writers won, want 1", won)
	}
}
