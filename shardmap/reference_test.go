package shardmap

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestReferenceRegistry(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	mustCreate(t, s, "t1", "catalogue")
	c := NewCache(s, time.Hour, nil)
	v0, err := c.View(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}

	r := &Reference{Tenant: "t1", Name: "item", Nodes: []string{"n2", "n1"}}
	steps := []struct {
		name string
		run  func() error
		want error
	}{
		{"create", func() error { return s.PutReference(ctx, r, nil) }, nil},
		{"create again", func() error { return s.PutReference(ctx, &Reference{Tenant: "t1", Name: "item"}, nil) }, ErrConflict},
		{"a tree's name", func() error { return s.PutReference(ctx, &Reference{Tenant: "t1", Name: "catalogue"}, nil) }, ErrIsTree},
		{"stale prev", func() error {
			return s.PutReference(ctx, &Reference{Tenant: "t1", Name: "item", Nodes: []string{"n1"}}, &Reference{Tenant: "t1", Name: "item"})
		}, ErrConflict},
	}
	for _, st := range steps {
		if err := st.run(); !errors.Is(err, st.want) {
			t.Fatalf("%s: got %v, want %v", st.name, err, st.want)
		}
	}
	list, err := s.References(ctx, "t1")
	if err != nil || len(list) != 1 || list[0].Name != "item" || len(list[0].Nodes) != 2 || list[0].Nodes[0] != "n1" {
		t.Fatalf("References = %+v, %v; want item on [n1 n2]", list, err)
	}

	v1, err := c.Refresh(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if v1.Reference("item") == nil || !v1.Reference("item").Holds("n2") || v1.Reference("catalogue") != nil {
		t.Fatalf("view references = %+v", v1.References)
	}
	if v1.TreesVersion == v0.TreesVersion {
		t.Fatal("a new reference table kept the trees version: cached plans would not see it")
	}

	grown := *list[0]
	grown.Nodes = append(grown.Nodes, "n3")
	if err := s.PutReference(ctx, &grown, list[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteReference(ctx, list[0]); !errors.Is(err, ErrConflict) {
		t.Fatalf("delete with a stale entry: %v", err)
	}
	if err := s.DeleteReference(ctx, &grown); err != nil {
		t.Fatal(err)
	}
	v2, err := c.Refresh(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if v2.Reference("item") != nil || v2.TreesVersion == v1.TreesVersion {
		t.Fatalf("after the delete: %+v, version %d (was %d)", v2.References, v2.TreesVersion, v1.TreesVersion)
	}
}
