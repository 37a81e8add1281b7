package migrator

import (
	"context"

	"github.com/lattice-db/lattice/shardmap"
)

// SettleReference waits until every live proxy that serves ref's tenant
// has acknowledged ref's entry (shardmap.ReferenceAckName) and no proxy cut
// off from Redis is seen on the nodes of its copies, as a freeze waits for
// a map: no write planned on an older entry still runs. pgshard calls it
// after marking the copies about to change, before it locks the table.
func (r *Runner) SettleReference(ctx context.Context, ref *shardmap.Reference) error {
	t := &shardmap.Tree{Tenant: ref.Tenant, Name: shardmap.ReferenceAckName(ref.Name)}
	// The cut-off look reads the nodes from the map's shards.
	m := &shardmap.Map{Tree: t.Name, Epoch: ref.Epoch, Shards: map[int]shardmap.Shard{}}
	for i, n := range ref.Nodes {
		m.Shards[i] = shardmap.Shard{Index: i, Node: n, State: shardmap.ShardActive}
	}
	return r.waitAcks(ctx, t, m)
}
