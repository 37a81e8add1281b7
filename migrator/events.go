package migrator

import (
	"context"
	"encoding/json"
	"time"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
)

// EventsChannel is the PostgreSQL notification channel of tree events.
// Events are sent with pg_notify in the tenant's database on the catalog
// node, so a client of any proxy that runs LISTEN lattice_events (which the
// proxy routes to the catalog node like any LISTEN) receives them, whichever
// proxy did the work.
const EventsChannel = "lattice_events"

// Tree event names.
const (
	EventReshardStarted     = "reshard_started"
	EventReshardCompleted   = "reshard_completed"
	EventMigrationCommitted = "migration_committed" // a split or fold flipped its slots to the target
	EventMigrationRetired   = "migration_retired"   // its source released: moved rows deleted, or a fold's donor dropped
	EventRebalanceStarted   = "rebalance_started"   // lattice_rebalance, lattice_drain_node (per tree) or lattice_move_shard stored its intent
	EventRebalanceCompleted = "rebalance_completed" // every move of that intent is done
)

// Event is the JSON payload of a notification on EventsChannel.
type Event struct {
	Event  string `json:"event"`
	Tenant string `json:"tenant"`
	Tree   string `json:"tree"`
	// Epoch is the shard map epoch the event happened at.
	Epoch uint64    `json:"epoch"`
	At    time.Time `json:"at"`

	// Reshard events.
	Reshard string `json:"reshard,omitempty"`       // operation id
	From    int    `json:"from_shards,omitempty"`   // distinct shards when it started
	To      int    `json:"target_shards,omitempty"` // the target count
	Shards  int    `json:"shards,omitempty"`        // distinct shards at completion
	Repin   bool   `json:"repin,omitempty"`         // the empty-tree re-pin, no migrations

	// Migration events: the shard indices it moves slots between.
	Migration string `json:"migration,omitempty"`
	Kind      string `json:"kind,omitempty"` // split, fold or move; a rebalance event's: rebalance, drain or move
	Source    *int   `json:"source,omitempty"`
	Target    *int   `json:"target,omitempty"`
	// A move's nodes (its shard index stays).
	SourceNode string `json:"source_node,omitempty"`
	TargetNode string `json:"target_node,omitempty"`

	// Rebalance events.
	Rebalance string `json:"rebalance,omitempty"` // operation id
	By        string `json:"by,omitempty"`        // bytes or slots
	Node      string `json:"node,omitempty"`      // a drain's node, a move's target node
	Moves     *int   `json:"moves,omitempty"`     // moves made, at completion
	Slots     []int  `json:"slots,omitempty"`     // migration_verify_failed: the slots that differ

	// Tree operation events (snapshot, merge, resize).
	Operation  string             `json:"operation,omitempty"`   // operation id
	TargetTree string             `json:"target_tree,omitempty"` // a snapshot's new tree, a merge's target
	SourceTree string             `json:"source_tree,omitempty"` // a merge's source (Tree is its target)
	Rows       *int64             `json:"rows,omitempty"`        // rows copied, at completion
	Layout     *btreeindex.Layout `json:"layout,omitempty"`      // a resize's storage parameters
	Error      string             `json:"error,omitempty"`       // merge_failed: what the target refused
}

// eventTimeout bounds one notification: an event is never worth holding a
// migration up for.
const eventTimeout = 5 * time.Second

// publish sends ev to the tenant's listeners. Events are notifications, not
// a log: a failure is logged and the work goes on.
func (r *Runner) publish(ctx context.Context, ev Event) {
	ev.At = time.Now().UTC()
	payload, err := json.Marshal(ev)
	if err != nil {
		r.log.Warn("tree event not encoded", "event", ev.Event, "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), eventTimeout)
	defer cancel()
	if err := r.cluster.Notify(ctx, ev.Tenant, string(payload)); err != nil {
		r.log.Warn("tree event not published", "event", ev.Event, "tree", ev.Tree, "tenant", ev.Tenant, "err", err)
	}
}

// migrationEvent is the event of mig at epoch.
func migrationEvent(name string, mig *shardmap.Migration, epoch uint64) Event {
	src, tgt := mig.Source, mig.Target
	ev := Event{Event: name, Tenant: mig.Tenant, Tree: mig.Tree, Epoch: epoch,
		Migration: mig.ID, Kind: string(mig.Kind), Source: &src, Target: &tgt}
	if mig.Kind == shardmap.Move {
		ev.SourceNode, ev.TargetNode = mig.SourceNode, mig.TargetNode
	}
	return ev
}

// mapEpoch is the tree's current map epoch, 0 when it cannot be read (the
// event still goes out).
func (r *Runner) mapEpoch(ctx context.Context, tenant, tree string) uint64 {
	m, err := r.store.Map(ctx, tenant, tree)
	if err != nil {
		return 0
	}
	return m.Epoch
}
