package migrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// lattice_resize(tree, fillfactor => n [, index_fillfactor => n,
// deduplicate => bool]) is a tree operation (shardmap.TreeOp of kind
// resize, recorded before it acts, resumed by the tree's lease holder): it
// records the layout in the tree's DDL log (pgshard.SetLayout), then
// rewrites every shard that was created before that, one resize migration
// per shard (resize.go), at most --max-concurrent-migrations migrations of
// the tree in flight at once (the reshard's own count with them). A
// colocation group's member is resized with its whole group: the group's
// migrations move every member's table, so the layout goes into every
// member's log and each shard's one migration rewrites them all.

// Tree events of a resize.
const (
	EventResizeStarted   = "resize_started"
	EventResizeCompleted = "resize_completed"
)

// Phases of a resize's record after shardmap.OpIntent.
const resizeRewrite = "rewrite" // the layout is in the DDL log; shards are rewritten

// resizeState is a resize's own part of its record.
type resizeState struct {
	Layout btreeindex.Layout `json:"layout"`
	// HighWater is the map's when the layout was recorded: the shards below
	// it were created with the old layout, every shard from it on with the
	// new one.
	HighWater int `json:"high_water"`
	Shards    int `json:"shards"` // shards to rewrite when the layout was recorded
	// Members are the trees whose logs have the layout: the tree's, or
	// every member of its colocation group. A member that joined the group
	// since gets it too, and every shard is rewritten again (joined).
	Members []string `json:"members,omitempty"`
	// Copied is the rows each shard's migration copied, by migration id.
	Copied map[string]int64 `json:"copied,omitempty"`
}

func resizeStateOf(op *shardmap.TreeOp) (resizeState, error) {
	var st resizeState
	if err := json.Unmarshal(op.State, &st); err != nil {
		return st, fmt.Errorf("migrator: resize %s: decode its state: %w", op.ID, err)
	}
	return st, nil
}

// resizePoll is how often a running resize looks at its migrations.
const resizePoll = 500 * time.Millisecond

// toRewrite lists the shards of m a resize still rewrites: those that own
// slots, were created before the layout (below highWater), and are not
// being rewritten now.
func toRewrite(m *shardmap.Map, highWater int, resizing []*shardmap.Migration) []int {
	var out []int
	for _, idx := range m.OwningShards() {
		if idx < highWater && !slices.ContainsFunc(resizing, func(o *shardmap.Migration) bool { return o.Source == idx }) {
			out = append(out, idx)
		}
	}
	return out
}

// runResize is the TreeOpHandler of resizes.
func (f *Functions) runResize(ctx context.Context, run *TreeOpRun) error {
	op, c := run.Op, f.coord
	st, err := resizeStateOf(op)
	if err != nil {
		return err
	}
	// The map's trees: a group lives on while any member does, the one
	// named in the call dropped or not.
	u, err := unitFrom(ctx, f.store, op.Tenant, op.TreeMap())
	if errors.Is(err, shardmap.ErrNotFound) {
		c.log.Warn("resize: its tree is gone", "op", op.ID, "tree", op.Tree)
		return nil
	}
	if err != nil {
		return err
	}
	t := u.lead
	save := func() error {
		b, err := json.Marshal(st)
		if err != nil {
			return err
		}
		op.State = b
		return run.Save(ctx)
	}
	if op.Phase == shardmap.OpIntent {
		for _, member := range u.trees {
			if _, err := f.cluster.SetLayout(ctx, f.store, member, st.Layout, op.ID); err != nil {
				return err
			}
			st.Members = append(st.Members, member.Name)
		}
		m, err := f.store.Map(ctx, t.Tenant, t.MapName())
		if err != nil {
			return err
		}
		st.HighWater, st.Shards = m.HighWater, len(toRewrite(m, m.HighWater, nil))
		rows, err := c.runner.rowCounts(ctx, u, m)
		if err != nil {
			return err
		}
		op.RowsTotal = 0
		for _, idx := range m.OwningShards() {
			op.RowsTotal += rows[idx]
		}
		op.Phase = resizeRewrite
		if err := save(); err != nil {
			return err
		}
		c.log.Info("resize: layout recorded; rewriting the shards", "op", op.ID, "tree", t.Name, "members", u.names(), "layout", st.Layout.String(), "shards", st.Shards)
	}
	c.runner.crash("resize_rewrite")
	for {
		done, err := c.resizeTick(ctx, t, &st)
		if err != nil {
			return err
		}
		// Read after the tick, so that a member that joined before the
		// last look at the shards is seen before the resize completes.
		if again, err := f.resizeJoined(ctx, op, &st); err != nil {
			return err
		} else if again {
			done = false
		}
		op.RowsDone = 0
		for _, n := range st.Copied {
			op.RowsDone += n
		}
		if err := save(); err != nil {
			return err
		}
		if done {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(resizePoll):
		}
	}
	// Under the name it was called with, as lattice_resize counted its start.
	took := time.Since(op.Started)
	f.coord.metrics.ResizeCompleted.WithLabelValues(op.Tree, t.Tenant).Inc()
	f.coord.metrics.ResizeSeconds.WithLabelValues(op.Tree, t.Tenant).Observe(took.Seconds())
	layout := st.Layout
	c.runner.publish(ctx, Event{Event: EventResizeCompleted, Tenant: t.Tenant, Tree: op.Tree, Epoch: c.runner.mapEpoch(ctx, t.Tenant, t.MapName()),
		Operation: op.ID, Layout: &layout, Shards: st.Shards})
	c.log.Info("resize completed", "op", op.ID, "tree", op.Tree, "members", strings.Join(st.Members, ","), "tenant", t.Tenant, "layout", layout.String(), "shards", st.Shards, "took", took)
	return nil
}

// resizeJoined gives the layout to the trees that joined the resized
// group since the layout was recorded. A tree joins a group only while no
// migration of it is in flight (pgshard's colocateWith), but between two
// of the resize's: its tables on the shards rewritten before were created
// without the layout, so every shard of the map is rewritten again (the
// high-water mark moves to the map's). It reports whether one joined.
func (f *Functions) resizeJoined(ctx context.Context, op *shardmap.TreeOp, st *resizeState) (bool, error) {
	if op.TreeMap() == op.Tree && len(st.Members) <= 1 {
		if t, err := f.store.Tree(ctx, op.Tenant, op.Tree); err != nil || t.Group == "" {
			return false, err // alone, it has no members to gain
		}
	}
	u, err := unitFrom(ctx, f.store, op.Tenant, op.TreeMap())
	if err != nil {
		return false, err
	}
	var joined []string
	for _, member := range u.trees {
		if slices.Contains(st.Members, member.Name) {
			continue
		}
		if _, err := f.cluster.SetLayout(ctx, f.store, member, st.Layout, op.ID); err != nil {
			return false, err
		}
		joined = append(joined, member.Name)
	}
	if len(joined) == 0 {
		return false, nil
	}
	m, err := f.store.Map(ctx, op.Tenant, op.TreeMap())
	if err != nil {
		return false, err
	}
	st.Members = append(st.Members, joined...)
	st.HighWater = m.HighWater
	st.Shards += len(toRewrite(m, m.HighWater, nil))
	f.coord.log.Info("resize: trees joined the group; they get the layout, and every shard is rewritten again", "op", op.ID, "group", op.TreeMap(), "joined", joined)
	return true, nil
}

// resizeTick starts the resize migrations of every shard still to rewrite
// while fewer than MaxConcurrentMigrations migrations of the tree are in
// flight, and runs those recorded (after a crash too). It reports true once
// no shard is left and none is being rewritten.
func (c *Coordinator) resizeTick(ctx context.Context, t *shardmap.Tree, st *resizeState) (bool, error) {
	migs, err := c.store.Migrations(ctx, t.Tenant, t.MapName())
	if err != nil {
		return false, err
	}
	m, err := c.store.Map(ctx, t.Tenant, t.MapName())
	if err != nil {
		return false, err
	}
	flying := inFlight(migs)
	var resizing []*shardmap.Migration
	if st.Copied == nil {
		st.Copied = map[string]int64{}
	}
	for _, mig := range flying {
		if mig.Kind != shardmap.Resize {
			continue
		}
		resizing = append(resizing, mig)
		st.Copied[mig.ID] = mig.RowsCopied
		if !phaseOperator(mig.Phase) {
			c.ensureRunning(ctx, mig)
		}
	}
	todo := toRewrite(m, st.HighWater, resizing)
	if len(todo) == 0 && len(resizing) == 0 {
		return true, nil
	}
	free := c.opts.MaxConcurrentMigrations - len(flying)
	for _, idx := range todo {
		if free <= 0 {
			break
		}
		mig, err := c.runner.StartResize(ctx, t, idx)
		if errors.Is(err, ErrBusy) {
			continue // another migration holds it; a later tick takes it
		}
		if err != nil {
			return false, err
		}
		c.ensureRunning(ctx, mig)
		free--
	}
	return false, nil
}

var resizeSignatures = map[string][]pgproto3.FieldDescription{
	"lattice_resize":          {field("lattice_resize", pgtype.TextOID)},
	"lattice_resize_complete": {field("lattice_resize_complete", pgtype.BoolOID)},
	"lattice_resize_status":   resizeStatusSignature,
}

var resizeArgNames = map[string][]string{
	"lattice_resize":          {"tree", "fillfactor", "index_fillfactor", "deduplicate"},
	"lattice_resize_complete": {"tree"},
	"lattice_resize_status":   {"tree"},
}

func init() {
	maps.Copy(signatures, resizeSignatures)
	maps.Copy(argNames, resizeArgNames)
}

// callResize runs lattice_resize, lattice_resize_complete and
// lattice_resize_status; ok is false for any other name.
func (f *Functions) callResize(ctx context.Context, tenant, name string, args []*string, named map[string]*string) (rows [][]any, ok bool, err error) {
	params, ok := resizeArgNames[name]
	if !ok {
		return nil, false, nil
	}
	a, err := bindArgs(name, args, named, params...)
	if err != nil {
		return nil, true, err
	}
	var v any
	switch name {
	case "lattice_resize_status":
		rows, err = f.resizeStatus(ctx, tenant, a)
		return rows, true, err
	case "lattice_resize":
		v, err = f.resize(ctx, tenant, a)
	default:
		v, err = f.resizeComplete(ctx, tenant, a)
	}
	if err != nil {
		return nil, true, err
	}
	return [][]any{{v}}, true, nil
}

// resizeLayout reads lattice_resize's layout arguments.
func resizeLayout(a map[string]*string) (btreeindex.Layout, error) {
	var l btreeindex.Layout
	if a["fillfactor"] == nil {
		e := sqlstate.New(sqlstate.NullValueNotAllowed, "lattice_resize needs fillfactor")
		e.Hint = "Call it as SELECT lattice_resize('tree', fillfactor => 70 [, index_fillfactor => 80, deduplicate => true])."
		return l, e
	}
	var err error
	if l.Fillfactor, err = optionalInt(a, "fillfactor", 0); err != nil {
		return l, err
	}
	if l.IndexFillfactor, err = optionalInt(a, "index_fillfactor", 0); err != nil {
		return l, err
	}
	if a["index_fillfactor"] != nil && l.IndexFillfactor == 0 {
		// 0 means "keep" inside Layout; given, it is out of range.
		e := sqlstate.New(sqlstate.InvalidParameterValue, "index_fillfactor 0 is out of range: it must be between %d and %d", btreeindex.MinFillfactor, btreeindex.MaxFillfactor)
		e.Hint = "Give index_fillfactor => n with 10 <= n <= 100, or leave it out to keep each index's own."
		return l, e
	}
	if a["deduplicate"] != nil {
		d, err := optionalBool(a, "deduplicate")
		if err != nil {
			return l, err
		}
		l.Deduplicate = &d
	}
	return l, l.Validate()
}

// resize is lattice_resize: it validates the layout, records the resize
// (its intent, before anything acts) and returns; the tree's lease holder
// runs it (runResize). A resize already running with the same layout is a
// no-op, one with another layout refuses the call.
func (f *Functions) resize(ctx context.Context, tenant string, a map[string]*string) (string, error) {
	t, err := f.lookupTree(ctx, tenant, a)
	if err != nil {
		return "", err
	}
	l, err := resizeLayout(a)
	if err != nil {
		return "", err
	}
	if f.ops == nil {
		return "", sqlstate.New(sqlstate.FeatureNotSupported, "this process runs no tree operations")
	}
	b, err := json.Marshal(resizeState{Layout: l})
	if err != nil {
		return "", err
	}
	op := &shardmap.TreeOp{Tenant: tenant, Kind: shardmap.OpResize, Tree: t.Name, Map: t.MapName(), State: b}
	other, err := f.ops.Start(ctx, op)
	if err != nil {
		return "", err
	}
	if other != nil {
		ost, err := resizeStateOf(other)
		if err != nil {
			return "", err
		}
		if other.Kind == shardmap.OpResize && ost.Layout.String() == l.String() {
			return fmt.Sprintf("a resize of %s to %s is already running", other.Tree, l), nil
		}
		e := sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "a %s of %s (operation %s) is in progress", other.Kind, t.Name, other.ID)
		e.Hint = fmt.Sprintf("Wait until SELECT lattice_resize_complete('%s') returns true, then resize it again.", t.Name)
		return "", e
	}
	f.coord.metrics.ResizeStarted.WithLabelValues(t.Name, t.Tenant).Inc()
	f.coord.runner.publish(ctx, Event{Event: EventResizeStarted, Tenant: t.Tenant, Tree: t.Name,
		Epoch: f.coord.runner.mapEpoch(ctx, t.Tenant, t.MapName()), Operation: op.ID, Layout: &l})
	return fmt.Sprintf("resizing %s to %s", t.Name, l), nil
}

// resizeComplete is lattice_resize_complete(tree): no resize of the tree
// (of its colocation group) is recorded.
func (f *Functions) resizeComplete(ctx context.Context, tenant string, a map[string]*string) (bool, error) {
	t, err := f.lookupTree(ctx, tenant, a)
	if err != nil {
		return false, err
	}
	ops, err := f.resizesOf(ctx, t)
	return len(ops) == 0, err
}

// resizesOf lists the resizes recorded on t's map: t's own, or one of any
// member of its colocation group, which rewrites t's tables too.
func (f *Functions) resizesOf(ctx context.Context, t *shardmap.Tree) ([]*shardmap.TreeOp, error) {
	ops, err := f.store.TreeOps(ctx, t.Tenant, "")
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(ops, func(op *shardmap.TreeOp) bool {
		return op.Kind != shardmap.OpResize || !op.OnMap(t.MapName())
	}), nil
}
