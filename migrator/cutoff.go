package migrator

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/lattice-db/lattice/pgshard"
)

// cutOffPoll is how often a wait for acknowledgements looks again while a
// proxy cut off from Redis holds it up: that lasts as long as the outage.
const cutOffPoll = 100 * time.Millisecond

// clusterID is the deployment's id, read from the store once.
type clusterID struct {
	mu sync.Mutex
	id string
}

func (c *clusterID) get(ctx context.Context, s Store) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.id == "" {
		id, err := s.ClusterID(ctx)
		if err != nil {
			return "", err
		}
		c.id = id
	}
	return c.id, nil
}

// cutOff lists the presence sessions, on the catalog node, of proxies
// that are not among live (read before them): proxies cut off from Redis.
// Their registrations lapsed, but each may serve from its cached maps for
// as long as it holds its presence on every node it knows
// (shardmap.Registration). The catalog node is the one every proxy knows:
// a node added since a proxy was cut off lacks that proxy's session, so
// its answer, taken first, let a move onto it flip past a proxy still
// serving the old map.
func (r *Runner) cutOff(ctx context.Context, live []string) ([]string, error) {
	cluster, err := r.clusterID.get(ctx, r.store)
	if err != nil {
		return nil, err
	}
	present, err := r.cluster.Present(ctx, cluster, r.cluster.NodeNames()[0])
	if err != nil {
		return nil, err
	}
	for _, id := range live {
		delete(present, pgshard.PresenceName(cluster, id))
	}
	cut := make([]string, 0, len(present))
	for name := range present {
		cut = append(cut, name)
	}
	slices.Sort(cut)
	return cut, nil
}
