package shardmap

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestSwapNodes(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	events, err := s.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	empty, err := s.Nodes(ctx)
	if err != nil || empty.Version != 0 || len(empty.Nodes) != 0 {
		t.Fatalf("Nodes of an empty registry = %+v, %v", empty, err)
	}
	seed := &Nodes{Nodes: []NodeEntry{{Name: "n1", DSN: "postgres://u@h1/db", State: NodeActive}}}
	if err := s.SwapNodes(ctx, seed, 0); err != nil || seed.Version != 1 {
		t.Fatalf("seed: %v, version %d", err, seed.Version)
	}
	select {
	case ev := <-events:
		if ev.Kind != EventNodes || ev.Epoch != 1 {
			t.Fatalf("event %+v, want nodes at version 1", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event for the write")
	}
	// A second seeder, and a writer that read version 0, both lose.
	other := &Nodes{Nodes: []NodeEntry{{Name: "x", DSN: "postgres://u@x/db"}}}
	if err := s.SwapNodes(ctx, other, 0); !errors.Is(err, ErrNodesConflict) {
		t.Fatalf("second seed: %v, want ErrNodesConflict", err)
	}
	got, err := UpdateNodes(ctx, s, func(n *Nodes) error {
		n.Nodes = append(n.Nodes, NodeEntry{Name: "n2", DSN: "postgres://u@h2/db", State: NodeActive})
		return nil
	})
	if err != nil || got.Version != 2 {
		t.Fatalf("UpdateNodes: %+v, %v", got, err)
	}
	back, err := s.Nodes(ctx)
	if err != nil || back.Version != 2 || back.Catalog() != "n1" || len(back.Nodes) != 2 {
		t.Fatalf("read back %+v, %v", back, err)
	}
	refuse := errors.New("no")
	if _, err := UpdateNodes(ctx, s, func(*Nodes) error { return refuse }); !errors.Is(err, refuse) {
		t.Fatalf("a refused change: %v", err)
	}
	if back, _ := s.Nodes(ctx); back.Version != 2 {
		t.Fatalf("a refused change wrote version %d", back.Version)
	}
}

func TestTenantsWithTrees(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	for _, tenant := range []string{"app", "odd}{%tenant", "b"} {
		mustCreate(t, s, tenant, "catalogue")
	}
	got, err := s.TenantsWithTrees(ctx)
	if err != nil || strings.Join(got, "|") != "app|b|odd}{%tenant" {
		t.Fatalf("TenantsWithTrees = %q, %v", got, err)
	}
}

func TestNodeWatchSeedsAndApplies(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	var applied []uint64
	seed := func() *Nodes {
		return &Nodes{Nodes: []NodeEntry{{Name: "n1", DSN: "postgres://u@h1/db", State: NodeActive}}}
	}
	w := NewNodeWatch(s, time.Second, seed, func(n *Nodes) error {
		applied = append(applied, n.Version)
		return nil
	}, nil)
	if err := w.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(ctx); err != nil { // the same version: nothing to apply
		t.Fatal(err)
	}
	if _, err := UpdateNodes(ctx, s, func(n *Nodes) error {
		n.Nodes = append(n.Nodes, NodeEntry{Name: "n2", DSN: "postgres://u@h2/db"})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if len(applied) != 2 || applied[0] != 1 || applied[1] != 2 {
		t.Fatalf("applied versions %v, want [1 2]", applied)
	}
	if cur := w.Current(); cur == nil || len(cur.Nodes) != 2 {
		t.Fatalf("Current = %+v", cur)
	}

	// Redis lost the registry: the watch writes its seed again.
	if err := s.client.Del(ctx, s.nodesKey()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if back, _ := s.Nodes(ctx); back.Version != 1 || back.Catalog() != "n1" {
		t.Fatalf("after a loss the registry is %+v", back)
	}
	if applied[len(applied)-1] != 1 {
		t.Fatalf("applied %v: the rewritten registry was not applied", applied)
	}

	// Without anything to seed with, an empty registry is an error.
	s.client.Del(ctx, s.nodesKey())
	bare := NewNodeWatch(s, time.Second, nil, func(*Nodes) error { return nil }, nil)
	if err := bare.Reload(ctx); err == nil {
		t.Fatal("an empty registry without a seed was accepted")
	}
}
