package migrator

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// Nodes is what a Runner asks of the PostgreSQL nodes. The pipeline's
// phases, crash points and rollbacks depend on nothing else of the nodes,
// so they are unit-tested with a fake (runner_test.go); clusterNodes is
// the real one.
type Nodes interface {
	// The verification of each move (verify.go).
	VerifyNodes

	// NodeNames lists the nodes in cluster order.
	NodeNames() []string
	CreateShard(ctx context.Context, t *shardmap.Tree, idx int, node string, slots [][2]int, epoch uint64) error
	// WaitTreeDDL waits until no DDL statement on the trees holds their
	// DDL lock on the catalog node.
	WaitTreeDDL(ctx context.Context, tenant string, trees []string) error
	DropShard(ctx context.Context, t *shardmap.Tree, idx int, node string) error
	WriteOwnership(ctx context.Context, t *shardmap.Tree, idx int, node string, slots [][2]int, epoch uint64) error
	// ClaimSlots adds slots to a shard's ownership record (a flipped
	// migration's target); ReserveMap raises the catalog node's epoch
	// ceiling and high-water mark of a tree before a map write passes them
	// (docs/DESIGN.md section 17).
	ClaimSlots(ctx context.Context, t *shardmap.Tree, idx int, node string, slots [][2]int, epoch uint64) error
	ReserveMap(ctx context.Context, t *shardmap.Tree, epoch uint64, highWater int) (ceiling uint64, high int, err error)

	PrepareSlotFence(ctx context.Context, node string, f pgshard.SlotFence) error
	// ArmSlotFences arms fences of one node's tables in one transaction and
	// returns the WAL position read in it.
	ArmSlotFences(ctx context.Context, node string, fs []pgshard.SlotFence) (string, error)
	// ArmBlockers lists the transactions older than older that hold a lock
	// on the fences' tables that their arm would wait for; DropBlockers,
	// those their removal would wait for.
	ArmBlockers(ctx context.Context, node string, fs []pgshard.SlotFence, older time.Duration) ([]pgshard.Blocker, error)
	DropBlockers(ctx context.Context, node string, fs []pgshard.SlotFence, older time.Duration) ([]pgshard.Blocker, error)
	DropSlotFence(ctx context.Context, node string, f pgshard.SlotFence) error
	// InstallSlotFence prepares and arms a fence (the empty-tree re-pin).
	InstallSlotFence(ctx context.Context, node string, f pgshard.SlotFence) error

	// TreeRowCount estimates each shard's rows; TreeEmpty probes a tree
	// for rows (the coordinator's fold plan and re-pin).
	TreeRowCount(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (map[int]int64, error)
	TreeEmpty(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (bool, error)
	// ShardSizes estimates each shard's rows and bytes (a grow's placement
	// and a rebalance's plan).
	ShardSizes(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (map[int]pgshard.ShardSize, error)

	// Present lists the presence sessions of cluster's proxies on node
	// (section 12).
	Present(ctx context.Context, cluster, node string) (map[string]bool, error)
	// WarmPresence opens, before a freeze's pause, the connection that
	// Present's looks on the catalog node take, and looks once on it.
	WarmPresence(ctx context.Context, cluster string)
	// WALPosition is node's current WAL position.
	WALPosition(ctx context.Context, node, tenant string) (pglogrepl.LSN, error)
	// DeleteSlots deletes the rows of slots from a shard table in
	// transactions of about batch rows scanned that pass the fence.
	DeleteSlots(ctx context.Context, t *shardmap.Tree, node string, shard int, slots [][2]int, batch int) error
	// Notify sends a tree event to the tenant's listeners.
	Notify(ctx context.Context, tenant, payload string) error

	// StartShadow starts (or resumes) mig's shadow copy of the tables of
	// ts: the trees of mig's map (a colocation group's members, or one
	// tree).
	StartShadow(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration, log *slog.Logger) (Stream, error)
	// SlotBlockers lists the transactions the creation of the replication
	// slot named slot on node is waiting for, if it is.
	SlotBlockers(ctx context.Context, node, tenant, slot string) ([]pgshard.Blocker, error)
	// DropShadow removes what mig's shadow copy made; missing pieces are
	// fine.
	DropShadow(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration) error
}

// Stream is a running shadow copy as the pipeline sees it.
type Stream interface {
	Stats() ShadowStats
	// WaitApplied waits until every source change before lsn is in the
	// target.
	WaitApplied(ctx context.Context, lsn pglogrepl.LSN) error
	// Stop ends the stream; the copy's state on the nodes stays.
	Stop() error
}

var _ Stream = (*Shadow)(nil)
