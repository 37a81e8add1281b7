package migrator

import (
	"context"
	"sync"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// pauses are the write pauses (freeze to flip, or to the rollback) in
// flight in this process, counted by the nodes each touches: the source,
// whose fence and walsender do the pause's work, and the target, which
// applies the final drain. On a node of a pause, the other migrations of
// the process hold their bulk steps (a shadow copy, a comparison, a
// release, a freeze's preparation) and their own pauses until it ends: in
// the point-select run of make bench, four migrations in flight on the
// 2-core machine made the fence of the one paused wait for the CPU, up to
// 350 ms for a transaction of 20 ms (docs/DESIGN.md section 5, step 3).
// Every wait is bounded, as a pause is, so nothing starves.
type pauses struct {
	mu    sync.Mutex
	nodes map[string]int // pauses in flight on each node
	// ended is closed, and replaced, whenever a pause ends.
	ended chan struct{}
}

// hold waits until no pause in flight touches any of nodes, or at most
// limit, or until ctx ends (its error is returned).
func (p *pauses) hold(ctx context.Context, nodes []string, limit time.Duration) error {
	_, _, err := p.wait(ctx, nodes, limit, false)
	return err
}

// enter is hold, then counts a pause on nodes (even after limit passed: it
// then overlaps another), and returns the function that ends it and whether
// it waited.
func (p *pauses) enter(ctx context.Context, nodes []string, limit time.Duration) (func(), bool, error) {
	return p.wait(ctx, nodes, limit, true)
}

func (p *pauses) wait(ctx context.Context, nodes []string, limit time.Duration, count bool) (func(), bool, error) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	waited, late := false, false
	for {
		p.mu.Lock()
		busy, ended := p.on(nodes)
		if !busy || late {
			var leave func()
			if count {
				leave = p.count(nodes)
			}
			p.mu.Unlock()
			return leave, waited, nil
		}
		p.mu.Unlock()
		waited = true
		select {
		case <-ctx.Done():
			return nil, waited, ctx.Err()
		case <-ended:
		case <-timer.C:
			late = true // one more pass, which goes ahead
		}
	}
}

// on reports whether a pause in flight touches one of nodes, and returns
// the channel closed when the next pause ends. Called with mu held.
func (p *pauses) on(nodes []string) (bool, <-chan struct{}) {
	if p.ended == nil {
		p.ended = make(chan struct{})
	}
	for _, n := range nodes {
		if p.nodes[n] > 0 {
			return true, p.ended
		}
	}
	return false, p.ended
}

// count adds a pause on nodes and returns its end, which may be called
// more than once. Called with mu held.
func (p *pauses) count(nodes []string) func() {
	if p.nodes == nil {
		p.nodes = make(map[string]int)
	}
	for _, n := range nodes {
		p.nodes[n]++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			for _, n := range nodes {
				if p.nodes[n]--; p.nodes[n] == 0 {
					delete(p.nodes, n)
				}
			}
			close(p.ended)
			p.ended = make(chan struct{})
		})
	}
}

// pauseNodes are the nodes mig's pause touches: its source and target.
func pauseNodes(mig *shardmap.Migration) []string {
	if mig.SourceNode == mig.TargetNode {
		return []string{mig.SourceNode}
	}
	return []string{mig.SourceNode, mig.TargetNode}
}
