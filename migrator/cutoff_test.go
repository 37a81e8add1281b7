package migrator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lattice-db/lattice/pgshard"
)

// TestCutOffAsksTheCatalogNode: a proxy cut off from Redis holds presence
// sessions only on the nodes it knew of when it was cut off, so a node
// added since then does not list it. A wait for acknowledgements must ask
// the catalog node, which every proxy knows, and wait while that node
// lists the proxy, whatever the tree's other nodes say.
func TestCutOffAsksTheCatalogNode(t *testing.T) {
	r := newRig(t)
	run := r.runner("")
	cluster, err := r.store.ClusterID(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	cut := pgshard.PresenceName(cluster, "cut-off")
	m, err := r.store.Map(r.ctx, r.tree.Tenant, r.tree.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		present map[string]map[string]bool
		waits   bool
	}{
		{"listed on the catalog node only", map[string]map[string]bool{"n1": {cut: true}, "n2": {}}, true},
		{"listed on every node", map[string]map[string]bool{"n1": {cut: true}, "n2": {cut: true}}, true},
		{"listed nowhere", map[string]map[string]bool{"n1": {}, "n2": {}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.nodes.mu.Lock()
			r.nodes.present = tc.present
			r.nodes.mu.Unlock()
			// The wait lasts as long as the outage: a bound shows it waits.
			ctx, cancel := context.WithTimeout(r.ctx, 300*time.Millisecond)
			defer cancel()
			err := run.waitAcks(ctx, r.tree, m)
			switch {
			case tc.waits && !errors.Is(err, context.DeadlineExceeded):
				t.Fatalf("waitAcks: %v, want it to wait while the catalog node lists %s", err, cut)
			case !tc.waits && err != nil:
				t.Fatalf("waitAcks: %v, want nil", err)
			}
		})
	}
}
