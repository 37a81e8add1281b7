package shardmap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// NodeStore is the part of a store a NodeWatch reads.
type NodeStore interface {
	Nodes(ctx context.Context) (*Nodes, error)
	SwapNodes(ctx context.Context, n *Nodes, expected uint64) error
	Subscribe(ctx context.Context) (<-chan Event, error)
}

// NodeWatch keeps a proxy's set of nodes equal to the registry: it reads
// the registry at Reload, on every EventNodes and every refresh interval
// (events can be lost), and hands each version it has not applied yet to
// apply. When it finds the registry empty, it writes it first: seed() when
// it was never written, so the registry is seeded from the first proxy's
// --node flags, and the nodes it last applied when Redis lost it, so any
// proxy restores it.
type NodeWatch struct {
	store   NodeStore
	refresh time.Duration
	seed    func() *Nodes
	apply   func(*Nodes) error
	log     *slog.Logger

	mu      sync.Mutex // one read-and-apply at a time, in version order
	applied *Nodes
}

// NewNodeWatch returns a watch; seed may return nil (nothing to seed with).
// log may be nil.
func NewNodeWatch(store NodeStore, refresh time.Duration, seed func() *Nodes, apply func(*Nodes) error, log *slog.Logger) *NodeWatch {
	if refresh <= 0 {
		refresh = DefaultRefresh
	}
	if log == nil {
		log = slog.Default()
	}
	return &NodeWatch{store: store, refresh: refresh, seed: seed, apply: apply, log: log}
}

// Current is the registry as last applied; nil before the first Reload.
func (w *NodeWatch) Current() *Nodes {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.applied == nil {
		return nil
	}
	return w.applied.Clone()
}

// Reload reads the registry and applies it if its version is not the one
// applied. A version lower than the applied one is applied too: the
// registry was lost and written again, and what Redis holds is the truth.
func (w *NodeWatch) Reload(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.store.Nodes(ctx)
	if err != nil {
		return err
	}
	if len(n.Nodes) == 0 {
		// After a loss, what this proxy last applied is the best record
		// of the nodes (it may hold nodes added since the flags).
		var s *Nodes
		if w.applied != nil {
			s = w.applied.Clone()
		} else if w.seed != nil {
			s = w.seed()
		}
		if s != nil && len(s.Nodes) > 0 {
			err := w.store.SwapNodes(ctx, s, n.Version)
			switch {
			case err == nil:
				w.log.InfoContext(ctx, "shardmap: seeded the empty node registry", "nodes", len(s.Nodes), "version", s.Version)
				n = s
			case errors.Is(err, ErrNodesConflict):
				// Another proxy seeded it first: take what it wrote.
				if n, err = w.store.Nodes(ctx); err != nil {
					return err
				}
			default:
				return err
			}
		}
	}
	if len(n.Nodes) == 0 {
		return fmt.Errorf("shardmap: the node registry is empty and there is nothing to seed it with")
	}
	if w.applied != nil && w.applied.Version == n.Version {
		return nil
	}
	if err := w.apply(n); err != nil {
		return fmt.Errorf("shardmap: apply node registry version %d: %w", n.Version, err)
	}
	w.applied = n.Clone()
	return nil
}

// Run keeps the nodes current until ctx ends. It returns an error only if
// it cannot subscribe at the start.
func (w *NodeWatch) Run(ctx context.Context) error {
	reload := func() {
		if err := w.Reload(ctx); err != nil && ctx.Err() == nil {
			w.log.WarnContext(ctx, "shardmap: node registry re-read failed", "err", err)
		}
	}
	return follow(ctx, w.store, w.refresh, "node watch", func(ev Event) {
		if ev.Kind == EventNodes {
			reload()
		}
	}, reload)
}
