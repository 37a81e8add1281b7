package migrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// RecoverOptions tune RecoverMaps.
type RecoverOptions struct {
	// Settle is how long to wait, after ending the walsenders of
	// migrations whose records Redis lost, before reading the nodes: a
	// migrator that was inside a freeze rolls it back within its freeze
	// budget, and one that was draining stops at its next phase change
	// (shardmap.Coordination.PutMigration). Default 5 s.
	Settle time.Duration
	// DrainTimeout bounds the final drain of one fenced migration.
	DrainTimeout time.Duration
}

// RecoveredTree says what RecoverMaps did for one tree.
type RecoveredTree struct {
	Tenant, Tree string
	// Skipped says why the tree was left alone (it is registered).
	Skipped    string
	Epoch      uint64
	Shards     int
	Finished   []string // migrations carried to their end (fenced on the nodes)
	RolledBack []string // migrations undone (not fenced yet)
}

// RecoverMaps rebuilds, from the nodes, the registry entry and the map of
// every tree that the store lacks, in every tenant database of the catalog
// node (docs/DESIGN.md section 17). A migration that armed its fence is
// finished; one that did not is rolled back. Each rebuilt map's epoch is
// above any the tree's map ever had, so no proxy's cache keeps an older
// one. A tree the store still has is skipped.
func RecoverMaps(ctx context.Context, cluster *pgshard.Cluster, store Store, opts RecoverOptions, log *slog.Logger) ([]RecoveredTree, error) {
	if opts.Settle <= 0 {
		opts.Settle = 5 * time.Second
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = time.Minute
	}
	if log == nil {
		log = slog.Default()
	}
	rc := &recovery{cluster: cluster, nodes: clusterNodes{Cluster: cluster}, store: store, opts: opts, log: log,
		runner: NewRunner(cluster, store, Options{}, nil, log)}
	dbs, err := cluster.Databases(ctx)
	if err != nil {
		return nil, err
	}
	var out []RecoveredTree
	for _, tenant := range dbs {
		has, err := cluster.HasTrees(ctx, tenant)
		if err != nil {
			return out, err
		}
		if !has {
			continue
		}
		got, err := rc.tenant(ctx, tenant)
		out = append(out, got...)
		if err != nil {
			return out, fmt.Errorf("tenant %s: %w", tenant, err)
		}
	}
	return out, nil
}

type recovery struct {
	cluster *pgshard.Cluster
	nodes   clusterNodes
	store   Store
	runner  *Runner
	opts    RecoverOptions
	log     *slog.Logger
}

// tenantState is what the nodes hold of one tenant.
type tenantState struct {
	owners  map[string][]pgshard.Ownership // by tree
	moving  []pgshard.Moving
	objects []pgshard.MigrationObject
	// members are the trees being rebuilt, by map name: a colocation
	// group's migration streams every member table at once.
	members map[string][]*shardmap.Tree
	// carried are the migrations whose stream a member's recovery drained
	// and dropped already: the group's other members only take their
	// slots (a second drain would find no progress row and copy afresh).
	carried map[string]bool
	// drops are the shard tables that own nothing once the migrations are
	// resolved, dropped by dropPending.
	drops []pendingDrop
}

// pendingDrop is a shard table to drop.
type pendingDrop struct {
	tree *shardmap.Tree
	idx  int
	node string
}

// dropLater notes shard idx of t on node to be dropped once every member
// of t's group is rebuilt: the group's tables of one shard are dropped
// together, in the order their foreign keys allow (a table another member
// references goes last, else 2BP01), and only once the members' maps
// agree.
func (st *tenantState) dropLater(t *shardmap.Tree, idx int, node string) {
	st.drops = append(st.drops, pendingDrop{t, idx, node})
}

// dropPending drops the shard tables noted by dropLater, each shard's on
// each node in reference order.
func (rc *recovery) dropPending(ctx context.Context, st *tenantState) error {
	type place struct {
		idx  int
		node string
	}
	var order []place
	byPlace := map[place][]*shardmap.Tree{}
	for _, d := range st.drops {
		pl := place{d.idx, d.node}
		if byPlace[pl] == nil {
			order = append(order, pl)
		}
		byPlace[pl] = append(byPlace[pl], d.tree)
	}
	st.drops = nil
	for _, pl := range order {
		err := inReferenceOrder(byPlace[pl], sqlstate.DependentObjectsStillExist, func(t *shardmap.Tree) error {
			return rc.cluster.DropShard(ctx, t, pl.idx, pl.node)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (rc *recovery) tenant(ctx context.Context, tenant string) ([]RecoveredTree, error) {
	trees, err := rc.cluster.ReadTrees(ctx, tenant)
	if err != nil {
		return nil, err
	}
	var out []RecoveredTree
	var todo []pgshard.NodeTree
	for _, nt := range trees {
		switch _, err := rc.store.Tree(ctx, tenant, nt.Tree.Name); {
		case err == nil:
			out = append(out, RecoveredTree{Tenant: tenant, Tree: nt.Tree.Name, Skipped: "registered in Redis"})
		case errors.Is(err, shardmap.ErrNotFound):
			todo = append(todo, nt)
		default:
			return out, err
		}
	}
	if len(todo) == 0 {
		return out, nil
	}
	st, err := rc.quiesce(ctx, tenant)
	if err != nil {
		return out, err
	}
	// Before any tree is written: a tenant with some trees in Redis would
	// serve a missing one as its empty template.
	if err := rc.refuseVerifyFailed(ctx, tenant, todo, st); err != nil {
		return out, err
	}
	// A colocation group's members are rebuilt together: one map, one epoch.
	groups := map[string][]pgshard.NodeTree{}
	var order []string
	for _, nt := range todo {
		g := nt.Tree.MapName()
		if groups[g] == nil {
			order = append(order, g)
		}
		groups[g] = append(groups[g], nt)
	}
	st.members, st.carried = map[string][]*shardmap.Tree{}, map[string]bool{}
	for _, g := range order {
		for _, nt := range groups[g] {
			st.members[g] = append(st.members[g], nt.Tree)
		}
	}
	// Before any tree is written too, for the same reason.
	if err := rc.proveMoving(ctx, todo, st); err != nil {
		return out, err
	}
	for _, g := range order {
		if nts := groups[g]; len(nts) == 1 && nts[0].Tree.Group == "" {
			rt, err := rc.tree(ctx, nts[0], st)
			if err != nil {
				return out, fmt.Errorf("tree %s: %w", nts[0].Tree.Name, err)
			}
			out = append(out, rt)
			continue
		}
		rts, err := rc.group(ctx, tenant, g, groups[g], st)
		out = append(out, rts...)
		if err != nil {
			return out, fmt.Errorf("colocation group %s: %w", g, err)
		}
	}
	return out, nil
}

// group rebuilds the members of colocation group g that Redis lost. Their
// ownership records must give one map; it is stored at an epoch above every
// member's records and ceiling, or, when Redis kept a member, the members
// join the map Redis kept, which must be the same.
func (rc *recovery) group(ctx context.Context, tenant, g string, nts []pgshard.NodeTree, st *tenantState) ([]RecoveredTree, error) {
	rts := make([]RecoveredTree, len(nts))
	ms := make([]*shardmap.Map, len(nts))
	var epoch uint64
	high := 0
	for i, nt := range nts {
		rt, m, err := rc.rebuild(ctx, nt, st)
		if err != nil {
			return nil, fmt.Errorf("tree %s: %w", nt.Tree.Name, err)
		}
		if i > 0 && !sameLayout(ms[0], m) {
			return nil, fmt.Errorf("trees %s and %s record different shards for the same slots", nts[0].Tree.Name, nt.Tree.Name)
		}
		rts[i], ms[i] = rt, m
		epoch, high = max(epoch, m.Epoch), max(high, m.HighWater)
	}
	anchor, err := rc.keptMember(ctx, tenant, g)
	if err != nil {
		return nil, err
	}
	if anchor != nil {
		kept, err := rc.store.Map(ctx, tenant, g)
		if err != nil {
			return nil, err
		}
		if !sameLayout(kept, ms[0]) {
			return nil, fmt.Errorf("the map Redis kept for member %s differs from what the nodes record for %s", anchor.Name, nts[0].Tree.Name)
		}
		epoch, high = kept.Epoch, kept.HighWater
	}
	if err := rc.dropPending(ctx, st); err != nil {
		return nil, err
	}
	for i, nt := range nts {
		m := ms[i]
		m.Tree, m.Epoch, m.HighWater = g, epoch, high
		nt.Tree.Group = g
		if rts[i], err = rc.register(ctx, nt.Tree, m, rts[i], anchor); err != nil {
			return rts[:i], fmt.Errorf("tree %s: %w", nt.Tree.Name, err)
		}
		if anchor == nil {
			anchor = nt.Tree // as stored: the next members join it
		}
	}
	return rts, nil
}

// keptMember is a member of group g that Redis still has, nil if none.
func (rc *recovery) keptMember(ctx context.Context, tenant, g string) (*shardmap.Tree, error) {
	trees, err := rc.store.Trees(ctx, tenant)
	if err != nil {
		return nil, err
	}
	for _, t := range trees {
		if t.MapName() == g {
			return t, nil
		}
	}
	return nil, nil
}

// sameLayout reports whether a and b give every slot the same shard on
// the same node.
func sameLayout(a, b *shardmap.Map) bool {
	if !slices.Equal(a.Slots, b.Slots) {
		return false
	}
	for _, idx := range a.OwningShards() {
		if a.Shards[idx].Node != b.Shards[idx].Node {
			return false
		}
	}
	return true
}

// quiesce ends the walsenders of the tenant's migrations, waits Settle if
// any migration left objects, and reads the nodes.
func (rc *recovery) quiesce(ctx context.Context, tenant string) (*tenantState, error) {
	st, err := rc.read(ctx, tenant)
	if err != nil || len(st.moving) == 0 && len(st.objects) == 0 {
		return st, err
	}
	n, err := rc.cluster.EndMigrators(ctx, tenant)
	if err != nil {
		return nil, err
	}
	rc.log.Info("recover-map: migrations in flight; letting their migrators stop before reading the nodes",
		"tenant", tenant, "walsenders_ended", n, "settle", rc.opts.Settle)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(rc.opts.Settle):
	}
	if _, err := rc.cluster.EndMigrators(ctx, tenant); err != nil {
		return nil, err
	}
	return rc.read(ctx, tenant)
}

func (rc *recovery) read(ctx context.Context, tenant string) (*tenantState, error) {
	owners, err := rc.cluster.ReadOwnership(ctx, tenant)
	if err != nil {
		return nil, err
	}
	moving, err := rc.cluster.ReadMoving(ctx, tenant)
	if err != nil {
		return nil, err
	}
	objects, err := rc.cluster.ReadMigrationObjects(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return &tenantState{owners: owners, moving: moving, objects: objects}, nil
}

// recShard is one shard of the tree being rebuilt.
type recShard struct {
	node  string
	slots [][2]int
	epoch uint64
}

func (rc *recovery) tree(ctx context.Context, nt pgshard.NodeTree, st *tenantState) (RecoveredTree, error) {
	rt, m, err := rc.rebuild(ctx, nt, st)
	if err != nil {
		return rt, err
	}
	if err := rc.dropPending(ctx, st); err != nil {
		return rt, err
	}
	return rc.register(ctx, nt.Tree, m, rt, nil)
}

// rebuild finishes or rolls back the tree's migrations on the nodes and
// builds its map from the ownership records, at an epoch above every one
// it recorded; nothing is written to Redis.
func (rc *recovery) rebuild(ctx context.Context, nt pgshard.NodeTree, st *tenantState) (RecoveredTree, *shardmap.Map, error) {
	t := nt.Tree
	rt := RecoveredTree{Tenant: t.Tenant, Tree: t.Name}
	shards := map[int]*recShard{}
	var seconds []secondRecord // a move's second record of its index (recover_move.go)
	maxIdx, maxEpoch := -1, uint64(0)
	for _, o := range st.owners[t.Name] {
		s := &recShard{node: o.Node, slots: o.Slots, epoch: o.Epoch}
		if prev, dup := shards[o.Shard]; dup {
			if slices.ContainsFunc(seconds, func(sr secondRecord) bool { return sr.idx == o.Shard }) {
				return rt, nil, fmt.Errorf("shard %d has ownership records on nodes %s, %s and more", o.Shard, prev.node, o.Node)
			}
			seconds = append(seconds, secondRecord{o.Shard, s})
			maxEpoch = max(maxEpoch, o.Epoch)
			continue
		}
		shards[o.Shard] = s
		maxIdx, maxEpoch = max(maxIdx, o.Shard), max(maxEpoch, o.Epoch)
	}
	if len(shards) == 0 {
		return rt, nil, errors.New("no shard of the tree has an ownership record on any node")
	}
	if t.SlotCount == 0 { // a tree without a TreesTable row
		for _, s := range shards {
			for _, r := range s.slots {
				t.SlotCount = max(t.SlotCount, r[1]+1)
			}
		}
	}

	// The epoch first: every record written from here on carries it.
	epoch := maxEpoch + 1<<20
	highWater := maxIdx + 1
	if nt.Record != nil {
		epoch = max(nt.Record.EpochCeiling, maxEpoch) + 1
		highWater = max(highWater, nt.Record.HighWater)
	} else {
		rc.log.Warn("recover-map: the tree predates its catalog record; its epoch is set far above its ownership records' instead of above a recorded ceiling",
			"tenant", t.Tenant, "tree", t.Name)
	}

	// Fenced migrations: the source accepts no write for the slots, so
	// carrying them to the target is safe whether or not the flip was
	// written.
	targets := map[int]bool{}
	for _, mv := range st.moving {
		if mv.Tree != t.Name || mv.Kind == string(shardmap.Move) {
			continue // a move is resolved with its index's second record
		}
		if err := rc.finish(ctx, t, mv, shards, st, epoch); err != nil {
			return rt, nil, fmt.Errorf("finish migration %s: %w", mv.Migration, err)
		}
		targets[mv.Target] = true
		rt.Finished = append(rt.Finished, mv.Migration)
	}
	// Migrations that had not fenced: the source still owns the slots.
	for _, id := range unfenced(t.Name, st) {
		if err := rc.rollBack(ctx, t, id, shards, st); err != nil {
			return rt, nil, fmt.Errorf("roll back migration %s: %w", id, err)
		}
		rt.RolledBack = append(rt.RolledBack, id)
	}
	for _, sr := range seconds {
		id, err := rc.resolveMove(ctx, t, sr, shards, st, epoch)
		if err != nil {
			return rt, nil, err
		}
		if id != "" {
			rt.Finished = append(rt.Finished, id)
		}
	}
	// A shard that owns nothing now is a split target that never got its
	// slots, or a fold donor whose release stopped short: nothing routes
	// to it, and it holds no row that is not also on an owner. Dropped
	// with its group's tables of the shard (dropPending).
	for idx, s := range shards {
		if len(s.slots) > 0 {
			continue
		}
		st.dropLater(t, idx, s.node)
		delete(shards, idx)
	}

	m := &shardmap.Map{Tenant: t.Tenant, Tree: t.Name, Epoch: epoch, Slots: make([]int, t.SlotCount),
		Shards: map[int]shardmap.Shard{}, HighWater: highWater}
	owned := make([]int, t.SlotCount)
	for idx, s := range shards {
		m.Shards[idx] = shardmap.Shard{Index: idx, Node: s.node, State: shardmap.ShardActive}
		for _, r := range s.slots {
			for slot := r[0]; slot <= r[1]; slot++ {
				if slot >= t.SlotCount {
					return rt, nil, fmt.Errorf("shard %d records slot %d, beyond the tree's %d slots", idx, slot, t.SlotCount)
				}
				if owned[slot] > 0 {
					return rt, nil, fmt.Errorf("slot %d is recorded as owned by shards %d and %d", slot, m.Slots[slot], idx)
				}
				owned[slot]++
				m.Slots[slot] = idx
			}
		}
	}
	if i := slices.Index(owned, 0); i >= 0 {
		return rt, nil, fmt.Errorf("no shard records slot %d, and no migration on the nodes holds it", i)
	}
	t.ShardCount = m.DistinctShards()
	if t.Created.IsZero() {
		t.Created = time.Now().UTC()
	}
	return rt, m, nil
}

// register raises the ceiling to m's epoch, writes the ownership records
// with it and stores the tree and m: as a tree alone or its group's first
// member (anchor nil), or as a member joining anchor's group, whose stored
// map m must equal.
func (rc *recovery) register(ctx context.Context, t *shardmap.Tree, m *shardmap.Map, rt RecoveredTree, anchor *shardmap.Tree) (RecoveredTree, error) {
	epoch, highWater := m.Epoch, m.HighWater
	// The ceiling goes up before the map exists, and the records carry the
	// new epoch, so a later recovery starts above this one.
	if _, _, err := rc.cluster.ReserveMap(ctx, t, epoch, highWater); err != nil {
		return rt, err
	}
	for _, idx := range m.OwningShards() {
		if err := rc.cluster.WriteOwnership(ctx, t, idx, m.Shards[idx].Node, m.SlotRanges(idx), epoch); err != nil {
			return rt, err
		}
	}
	create := func() error { return rc.store.CreateTree(ctx, t, m) }
	if anchor != nil {
		create = func() error { return rc.store.CreateColocated(ctx, t, anchor, m.Epoch) }
	}
	if err := create(); err != nil {
		if errors.Is(err, shardmap.ErrExists) {
			rt.Skipped = "registered in Redis while it was rebuilt"
			return rt, nil
		}
		return rt, err
	}
	rt.Epoch, rt.Shards = m.Epoch, t.ShardCount
	rc.log.Info("recover-map: tree rebuilt", "tenant", t.Tenant, "tree", t.Name, "epoch", m.Epoch,
		"shards", t.ShardCount, "high_water", highWater, "finished", rt.Finished, "rolled_back", rt.RolledBack)
	return rt, nil
}

// movingMigration is the Migration a MovingTable row stands for, for the
// runner's helpers.
func movingMigration(t *shardmap.Tree, mv pgshard.Moving) *shardmap.Migration {
	return &shardmap.Migration{ID: mv.Migration, Tenant: t.Tenant, Tree: t.Name, Kind: shardmap.MigrationKind(mv.Kind),
		Source: mv.Source, SourceNode: mv.SourceNode, Target: mv.Target, TargetNode: mv.TargetNode, Slots: mv.Slots}
}

// finish carries a fenced migration to its end. Unless the target's record
// holds the slots (the flip was written, and the target may have taken
// writes since), the stream is first drained to the source's current WAL
// position: the fence has held back every write to the slots, so the
// target then has all of them. Then the release: the stream's objects,
// the source's copies of the rows (a fold's donor table noted for
// dropPending), the fence.
func (rc *recovery) finish(ctx context.Context, t *shardmap.Tree, mv pgshard.Moving, shards map[int]*recShard, st *tenantState, epoch uint64) error {
	mig := movingMigration(t, mv)
	tgt, ok := shards[mv.Target]
	if !ok {
		return fmt.Errorf("its target shard %d has no ownership record", mv.Target)
	}
	if err := rc.carry(ctx, t, mig, mv, tgt, st, epoch); err != nil {
		return err
	}
	src := shards[mv.Source]
	if mig.Kind == shardmap.Fold || mig.Kind == shardmap.Resize {
		if src != nil && len(src.slots) == 0 {
			st.dropLater(t, mv.Source, mv.SourceNode)
			delete(shards, mv.Source)
		}
	} else if err := rc.runner.deleteMoved(ctx, t, mig); err != nil {
		return err
	}
	return rc.cluster.DropSlotFence(ctx, mv.SourceNode, rc.runner.fence(t, mig, 0))
}

// drain applies the stream of a fenced migration up to its source's
// current WAL position.
func (rc *recovery) drain(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, st *tenantState) error {
	lsn, err := rc.runner.sourceLSN(ctx, t, mig)
	if err != nil {
		return err
	}
	sh, err := rc.nodes.StartShadow(ctx, st.tables(t), mig, rc.log)
	if err != nil {
		return err
	}
	defer sh.Stop()
	wctx, cancel := context.WithTimeout(ctx, rc.opts.DrainTimeout)
	defer cancel()
	if err := sh.WaitApplied(wctx, lsn); err != nil {
		return fmt.Errorf("final drain to %s: %w", lsn, err)
	}
	return nil
}

// unfenced lists the migrations of tree that left objects on the nodes
// without a fence: a publication on one of its shard tables.
func unfenced(tree string, st *tenantState) []string {
	fenced := map[string]bool{}
	for _, mv := range st.moving {
		fenced[mv.Migration] = true
	}
	var out []string
	for _, o := range st.objects {
		if o.Kind == "publication" && o.Tree == tree && !fenced[o.Migration] && !slices.Contains(out, o.Migration) {
			out = append(out, o.Migration)
		}
	}
	return out
}

// rollBack undoes a migration that had not fenced its source: its slot,
// publication and progress row go, and a fold survivor loses the copies
// of the donor's rows (a split target owns nothing and is dropped later).
func (rc *recovery) rollBack(ctx context.Context, t *shardmap.Tree, id string, shards map[int]*recShard, st *tenantState) error {
	var pub *pgshard.MigrationObject
	var progress []pgshard.MigrationObject
	for i, o := range st.objects {
		switch {
		case o.Migration != id:
		case o.Kind == "publication":
			pub = &st.objects[i]
		case o.Kind == "progress":
			progress = append(progress, o)
		}
	}
	// Without a progress row no copy committed: the target is the source
	// itself for DropShadow's sake, which then deletes no progress row.
	mig := &shardmap.Migration{ID: id, Tenant: t.Tenant, Tree: t.Name, Source: pub.Shard, SourceNode: pub.Node,
		Target: pub.Shard, TargetNode: pub.Node, Slots: [][2]int{{0, t.SlotCount - 1}}}
	if len(progress) > 0 {
		mig.Target, mig.TargetNode = progress[0].Shard, progress[0].Node
	}
	if err := rc.nodes.DropShadow(ctx, []*shardmap.Tree{t}, mig); err != nil {
		return err
	}
	// A freeze makes the target's write log before it fences.
	if err := rc.nodes.DropWriteLog(ctx, []*shardmap.Tree{t}, mig); err != nil {
		return err
	}
	fence := pgshard.SlotFence{Migration: id, Tree: t, Shard: pub.Shard, Slots: mig.Slots}
	if err := rc.cluster.DropSlotFence(ctx, pub.Node, fence); err != nil {
		return err
	}
	for _, p := range progress {
		s, ok := shards[p.Shard]
		if !ok || len(s.slots) == 0 || s.node != p.Node {
			continue // a split target, or a move's: dropped as owning nothing
		}
		// A fold survivor: only its own slots' rows stay.
		if stray := pgshard.ComplementSlots(s.slots, t.SlotCount); len(stray) > 0 {
			if err := rc.nodes.DeleteSlots(ctx, t, s.node, p.Shard, stray, rc.runner.opts.ReleaseBatch); err != nil {
				return err
			}
		}
	}
	return nil
}

func hasObject(st *tenantState, id, kind string) bool {
	return slices.ContainsFunc(st.objects, func(o pgshard.MigrationObject) bool { return o.Migration == id && o.Kind == kind })
}

// covers reports whether ranges hold every slot of want.
func covers(ranges, want [][2]int) bool {
	for _, w := range want {
		for s := w[0]; s <= w[1]; s++ {
			if !slices.ContainsFunc(ranges, func(r [2]int) bool { return s >= r[0] && s <= r[1] }) {
				return false
			}
		}
	}
	return true
}

// mergeRanges is the union of two lists of inclusive ranges, ascending.
func mergeRanges(a, b [][2]int) [][2]int {
	var slots []int
	seen := map[int]bool{}
	for _, l := range [][][2]int{a, b} {
		for _, r := range l {
			for s := r[0]; s <= r[1]; s++ {
				if !seen[s] {
					seen[s] = true
					slots = append(slots, s)
				}
			}
		}
	}
	slices.Sort(slots)
	return ranges(slots)
}

// carry gives a fenced migration's slots to its target, unless its record
// holds them already (the flip was written): the stream is drained first,
// if its slot is left. Then the stream's objects go.
func (rc *recovery) carry(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, mv pgshard.Moving, tgt *recShard, st *tenantState, epoch uint64) error {
	if !covers(tgt.slots, mv.Slots) {
		if hasObject(st, mv.Migration, "slot") && !st.carried[mv.Migration] {
			if err := rc.drain(ctx, t, mig, st); err != nil {
				return err
			}
		}
		if err := rc.cluster.ClaimSlots(ctx, t, mv.Target, mv.TargetNode, mv.Slots, epoch); err != nil {
			return err
		}
		tgt.slots = mergeRanges(tgt.slots, mv.Slots)
	}
	if err := rc.nodes.DropShadow(ctx, st.tables(t), mig); err != nil {
		return err
	}
	st.carried[mv.Migration] = true
	return nil
}

// tables are the trees whose tables t's migrations stream: the members of
// its map being rebuilt (t alone, for a tree alone).
func (st *tenantState) tables(t *shardmap.Tree) []*shardmap.Tree {
	if ts := st.members[t.MapName()]; len(ts) > 0 {
		return ts
	}
	return []*shardmap.Tree{t}
}
