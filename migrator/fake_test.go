package migrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pglogrepl"
	"github.com/redis/go-redis/v9"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// fakeNodes is Nodes in memory: each shard table is slot -> key -> value.
// Its shadow copy copies at StartShadow and has nothing to stream after;
// hooks let a test corrupt a row, stall the final drain or write as a
// client would.
type fakeNodes struct {
	mu      sync.Mutex
	nodes   []string
	tables  map[int]map[int]map[string]string // shard -> slot -> key -> value
	copied  map[string]bool                   // migration ids whose copy committed
	fences  map[string]bool                   // "migration/shard"
	events  []Event
	calls   []string
	stall   bool // the final drain never reaches the fence's position
	noSnaps bool // OpenSnapshots fails
	// lateApply: a source row changes after the copy, and the stream
	// applies the change to the target only in the final drain.
	lateApply bool
	target    int // the shard a test corrupts
	// compareErr fails comparisons, as a statement timeout would.
	compareErr error
	// exportErr fails the snapshots' exports.
	exportErr error

	// afterCompare runs after a comparison, before the differing slots'
	// rows written since the flip are read: a client's write.
	afterCompare func(f *fakeNodes)
	crash        func(point string) // called at the copy's crash point
	// logs are the targets' write logs, by migration id.
	logs map[string]*fakeWriteLog
	// reserves counts ReserveMap calls: upserts on the catalog node.
	reserves int
	// held is how many looks before a freeze find a long transaction on
	// the source table.
	held int
	// present are the presence sessions each node lists.
	present map[string]map[string]bool
	// rowCountStalls is how many TreeRowCount calls never answer, as a
	// node whose answer was lost on a dead connection: they return only
	// when their context ends.
	rowCountStalls int
	// dropBlocked, when set, holds every fence's removal until it is
	// closed, as a long transaction on the table would.
	dropBlocked chan struct{}
	// built is the DDL log each created shard table replayed, by index.
	built map[int][]string
	// replayed is the DDL log of the last CreateShard of each "node/index"
	// (a move's target has its source's index).
	replayed map[string][]string
	// ddlRunning, when set, ends a DDL statement that holds its tree's DDL
	// lock: WaitTreeDDL runs it, as the real wait returns only once the
	// statement has logged itself.
	ddlRunning func()
}

// fakeWriteLog is a target's write log: each key's row before the first
// client write since the log was made.
type fakeWriteLog struct {
	mig  *shardmap.Migration
	rows map[shardmap.RowDiff]fakeImage
}

type fakeImage struct {
	existed bool
	old     string
}

var _ Nodes = (*fakeNodes)(nil)

func newFakeNodes() *fakeNodes {
	return &fakeNodes{nodes: []string{"n1", "n2"}, tables: map[int]map[int]map[string]string{},
		copied: map[string]bool{}, fences: map[string]bool{}, logs: map[string]*fakeWriteLog{}, built: map[int][]string{},
		replayed: map[string][]string{}}
}

func (f *fakeNodes) call(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

// called reports whether a call starting with prefix was made.
func (f *fakeNodes) called(prefix string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.calls, func(c string) bool { return len(c) >= len(prefix) && c[:len(prefix)] == prefix })
}

func (f *fakeNodes) table(shard int) map[int]map[string]string {
	if f.tables[shard] == nil {
		f.tables[shard] = map[int]map[string]string{}
	}
	return f.tables[shard]
}

// put writes a row, as a client or a test would.
func (f *fakeNodes) put(shard, slot int, key, value string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tb := f.table(shard)
	if tb[slot] == nil {
		tb[slot] = map[string]string{}
	}
	tb[slot][key] = value
}

// write writes a row as a client would, through the proxy: a target's
// write log records it; del deletes the row instead.
func (f *fakeNodes) write(shard, slot int, key, value string, del bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tb := f.table(shard)
	if tb[slot] == nil {
		tb[slot] = map[string]string{}
	}
	for _, l := range f.logs {
		d := shardmap.RowDiff{Slot: slot, Key: key}
		if _, seen := l.rows[d]; !seen && l.mig.Target == shard && inRanges(slot, l.mig.Slots) {
			old, existed := tb[slot][key]
			l.rows[d] = fakeImage{existed: existed, old: old}
		}
	}
	if del {
		delete(tb[slot], key)
	} else {
		tb[slot][key] = value
	}
}

func (f *fakeNodes) get(shard, slot int, key string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.tables[shard][slot][key]
	return v, ok
}

// rows counts a shard's rows in slots.
func (f *fakeNodes) rows(shard int, slots [][2]int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for slot, rows := range f.tables[shard] {
		if inRanges(slot, slots) {
			n += len(rows)
		}
	}
	return n
}

func (f *fakeNodes) NodeNames() []string { return f.nodes }

func (f *fakeNodes) WaitTreeDDL(ctx context.Context, tenant string, trees []string) error {
	f.mu.Lock()
	f.call("waitddl %v", trees)
	end := f.ddlRunning
	f.ddlRunning = nil
	f.mu.Unlock()
	if end != nil {
		end()
	}
	return nil
}

func (f *fakeNodes) CreateShard(ctx context.Context, t *shardmap.Tree, idx int, node string, slots [][2]int, epoch uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("create %d %s", idx, t.Name)
	if _, ok := f.tables[idx]; !ok {
		f.built[idx] = slices.Clone(t.DDL) // an existing table is kept, as CREATE ... IF NOT EXISTS does
	}
	f.replayed[fmt.Sprintf("%s/%d", node, idx)] = slices.Clone(t.DDL)
	f.table(idx)
	return nil
}

func (f *fakeNodes) DropShard(ctx context.Context, t *shardmap.Tree, idx int, node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("drop %d %s", idx, t.Name)
	delete(f.tables, idx)
	return nil
}

func (f *fakeNodes) WriteOwnership(ctx context.Context, t *shardmap.Tree, idx int, node string, slots [][2]int, epoch uint64) error {
	return nil
}

func (f *fakeNodes) ClaimSlots(ctx context.Context, t *shardmap.Tree, idx int, node string, slots [][2]int, epoch uint64) error {
	return nil
}

// ReserveMap grants what is asked, as a catalog node whose record lies
// ahead of every map write.
func (f *fakeNodes) ReserveMap(ctx context.Context, t *shardmap.Tree, epoch uint64, highWater int) (uint64, int, error) {
	f.mu.Lock()
	f.reserves++
	f.mu.Unlock()
	return epoch + 1024, highWater, nil
}

func (f *fakeNodes) PrepareSlotFence(ctx context.Context, node string, fc pgshard.SlotFence) error {
	return nil
}

func (f *fakeNodes) ArmSlotFences(ctx context.Context, node string, fs []pgshard.SlotFence) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fc := range fs {
		f.call("fence %s %s", fc.Migration, fc.Tree.Name)
		f.fences[fmt.Sprintf("%s/%d", fc.Migration, fc.Shard)] = true
	}
	return "0/100", nil
}

func (f *fakeNodes) ArmBlockers(ctx context.Context, node string, fs []pgshard.SlotFence, older time.Duration) ([]pgshard.Blocker, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held == 0 {
		return nil, nil
	}
	f.held--
	f.call("held %s", fs[0].Migration)
	return []pgshard.Blocker{{Pid: 42, State: "idle in transaction", Age: time.Minute}}, nil
}

func (f *fakeNodes) SlotBlockers(ctx context.Context, node, tenant, slot string) ([]pgshard.Blocker, error) {
	return nil, nil
}

// DropBlockers finds a reader on the table while dropBlocked is open.
func (f *fakeNodes) DropBlockers(ctx context.Context, node string, fs []pgshard.SlotFence, older time.Duration) ([]pgshard.Blocker, error) {
	if f.dropBlocked == nil {
		return nil, nil
	}
	select {
	case <-f.dropBlocked:
		return nil, nil
	default:
		return []pgshard.Blocker{{Pid: 43, State: "active", Age: time.Minute}}, nil
	}
}

func (f *fakeNodes) DropSlotFence(ctx context.Context, node string, fc pgshard.SlotFence) error {
	if f.dropBlocked != nil {
		select {
		case <-f.dropBlocked:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.fences, fmt.Sprintf("%s/%d", fc.Migration, fc.Shard))
	return nil
}

func (f *fakeNodes) InstallSlotFence(ctx context.Context, node string, fc pgshard.SlotFence) error {
	_, err := f.ArmSlotFences(ctx, node, []pgshard.SlotFence{fc})
	return err
}

func (f *fakeNodes) TreeRowCount(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (map[int]int64, error) {
	f.mu.Lock()
	stall := f.rowCountStalls > 0
	if stall {
		f.rowCountStalls--
	}
	f.mu.Unlock()
	if stall {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return f.rowCounts(t, m), nil
}

func (f *fakeNodes) rowCounts(t *shardmap.Tree, m *shardmap.Map) map[int]int64 {
	out := map[int]int64{}
	for idx := range m.Shards {
		out[idx] = int64(f.rows(idx, [][2]int{{0, t.SlotCount - 1}}))
	}
	return out
}

// ShardSizes weighs each row as 100 bytes.
func (f *fakeNodes) ShardSizes(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (map[int]pgshard.ShardSize, error) {
	rows, _ := f.TreeRowCount(ctx, t, m)
	out := map[int]pgshard.ShardSize{}
	for idx, n := range rows {
		out[idx] = pgshard.ShardSize{Rows: n, Bytes: 100 * n}
	}
	return out, nil
}

func (f *fakeNodes) TreeEmpty(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (bool, error) {
	for _, c := range f.rowCounts(t, m) {
		if c > 0 {
			return false, nil
		}
	}
	return true, nil
}

func (f *fakeNodes) Present(ctx context.Context, cluster, node string) (map[string]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.present[node]), nil
}

func (f *fakeNodes) WarmPresence(ctx context.Context, cluster string) {}

func (f *fakeNodes) WALPosition(ctx context.Context, node, tenant string) (pglogrepl.LSN, error) {
	return 0x100, nil
}

func (f *fakeNodes) DeleteSlots(ctx context.Context, t *shardmap.Tree, node string, shard int, slots [][2]int, batch int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("delete %d %s", shard, t.Name)
	for slot := range f.tables[shard] {
		if inRanges(slot, slots) {
			delete(f.tables[shard], slot)
		}
	}
	return nil
}

func (f *fakeNodes) Notify(ctx context.Context, tenant, payload string) error {
	var ev Event
	if err := json.Unmarshal([]byte(payload), &ev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, ev)
	return nil
}

func (f *fakeNodes) eventNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.events {
		out = append(out, e.Event)
	}
	return out
}

// StartShadow copies the moving rows unless an earlier run committed the
// copy; a crash at "copy" leaves nothing copied, as the real copy's one
// transaction does.
func (f *fakeNodes) StartShadow(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration, log *slog.Logger) (Stream, error) {
	f.mu.Lock()
	done := f.copied[mig.ID]
	f.mu.Unlock()
	if !done {
		if f.crash != nil {
			f.crash("copy")
		}
		f.mu.Lock()
		src, tgt := f.table(mig.Source), f.table(mig.Target)
		for slot, rows := range src {
			if inRanges(slot, mig.Slots) {
				tgt[slot] = maps.Clone(rows)
			}
		}
		f.copied[mig.ID] = true
		f.call("copy %s", mig.ID)
		if f.lateApply {
			src[mig.Slots[0][0]][f.lateKey(mig)] = "late"
		}
		f.mu.Unlock()
	}
	return &fakeStream{f: f, mig: mig}, nil
}

// lateKey is the row lateApply changes. Called with mu held.
func (f *fakeNodes) lateKey(mig *shardmap.Migration) string {
	return slices.Sorted(maps.Keys(f.tables[mig.Source][mig.Slots[0][0]]))[0]
}

// applyLate applies lateApply's change in the final drain (the fence is
// armed).
func (s *fakeStream) applyLate() {
	f := s.f
	f.mu.Lock()
	late := f.lateApply && f.fences[fmt.Sprintf("%s/%d", s.mig.ID, s.mig.Source)]
	f.mu.Unlock()
	if !late {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	slot, key := s.mig.Slots[0][0], f.lateKey(s.mig)
	f.tables[s.mig.Target][slot][key] = f.tables[s.mig.Source][slot][key]
	f.lateApply = false
}

func (f *fakeNodes) DropShadow(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("dropshadow %s", mig.ID)
	return nil
}

type fakeStream struct {
	f   *fakeNodes
	mig *shardmap.Migration
}

func (s *fakeStream) Stats() ShadowStats { return ShadowStats{Applied: 0x100, Copied: true} }

func (s *fakeStream) WaitApplied(ctx context.Context, lsn pglogrepl.LSN) error {
	s.f.mu.Lock()
	stall := s.f.stall
	s.f.mu.Unlock()
	if stall {
		<-ctx.Done()
		return ctx.Err()
	}
	s.applyLate()
	return nil
}

func (s *fakeStream) Stop() error { return nil }

// The verification's side.

func (f *fakeNodes) OpenSnapshots(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration, timeout time.Duration) (Snapshots, error) {
	if f.noSnaps {
		return nil, fmt.Errorf("fake: no connection")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("opensnapshots %s", mig.ID)
	return &fakeSnapshots{f: f, mig: mig}, nil
}

// slotRows copies one slot of a shard.
func (f *fakeNodes) slotRows(shard, slot int) map[string]string {
	return maps.Clone(f.tables[shard][slot])
}

func rowHash(k, v string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(k + "\x00" + v))
	return h.Sum64()
}

// diffKeys lists the keys of one slot whose rows differ between a and b.
func diffKeys(slot int, a, b map[string]string) []shardmap.RowDiff {
	var out []shardmap.RowDiff
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			out = append(out, shardmap.RowDiff{Slot: slot, Key: k})
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, shardmap.RowDiff{Slot: slot, Key: k})
		}
	}
	slices.SortFunc(out, func(x, y shardmap.RowDiff) int {
		if x.Key < y.Key {
			return -1
		}
		return 1
	})
	return out
}

type fakeSnapshots struct {
	f        *fakeNodes
	mig      *shardmap.Migration
	src, tgt map[int]map[string]string      // slot -> rows at TakeSource, TakeTarget
	logged   map[shardmap.RowDiff]fakeImage // the write log at TakeTarget
}

func (s *fakeSnapshots) TakeTarget(ctx context.Context) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.call("take target %s", s.mig.ID)
	if s.f.exportErr != nil {
		return s.f.exportErr
	}
	s.tgt = s.take(s.mig.Target)
	s.logged = nil
	if l := s.f.logs[s.mig.ID]; l != nil {
		s.logged = maps.Clone(l.rows)
	}
	return nil
}

// asOfFlip puts back, in the target's snapshot, the row of each key the
// write log held then: the target's rows as of the flip, as flipImage
// reads them.
func (s *fakeSnapshots) asOfFlip() {
	for d, img := range s.logged {
		if s.tgt[d.Slot] == nil {
			s.tgt[d.Slot] = map[string]string{}
		}
		if img.existed {
			s.tgt[d.Slot][d.Key] = img.old
		} else {
			delete(s.tgt[d.Slot], d.Key)
		}
	}
}

func (s *fakeSnapshots) TakeSource(ctx context.Context) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.call("take source %s", s.mig.ID)
	if s.f.exportErr != nil {
		return s.f.exportErr
	}
	s.src = s.take(s.mig.Source)
	return nil
}

// take copies the moving slots of shard. Called with f.mu held.
func (s *fakeSnapshots) take(shard int) map[int]map[string]string {
	out := map[int]map[string]string{}
	for _, rg := range s.mig.Slots {
		for slot := rg[0]; slot <= rg[1]; slot++ {
			out[slot] = s.f.slotRows(shard, slot)
		}
	}
	return out
}

func (s *fakeSnapshots) Compare(ctx context.Context) (*shardmap.Verification, error) {
	if s.f.compareErr != nil {
		return nil, s.f.compareErr
	}
	if s.src == nil || s.tgt == nil {
		return nil, errors.New("fake: a snapshot is missing") // as pgSnapshots.Compare
	}
	s.asOfFlip()
	v := &shardmap.Verification{Exact: true}
	for _, rg := range s.mig.Slots {
		for slot := rg[0]; slot <= rg[1]; slot++ {
			a, b := s.src[slot], s.tgt[slot]
			var sa, sb uint64
			for k, x := range a {
				sa += rowHash(k, x)
			}
			for k, x := range b {
				sb += rowHash(k, x)
			}
			v.Rows += int64(len(a))
			if len(a) != len(b) || sa != sb {
				v.Differ = append(v.Differ, shardmap.SlotDiff{Slot: slot, SourceRows: int64(len(a)), TargetRows: int64(len(b))})
				v.DiffRows = append(v.DiffRows, diffKeys(slot, a, b)...)
			}
		}
	}
	if s.f.afterCompare != nil {
		s.f.afterCompare(s.f)
	}
	return v, nil
}

func (s *fakeSnapshots) WrittenSince(ctx context.Context, slots []int) ([]shardmap.RowDiff, error) {
	return (&fakeLogged{f: s.f, mig: s.mig}).WrittenSince(ctx, slots)
}

func (s *fakeSnapshots) Close() {}

func (f *fakeNodes) DiffNow(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, slots []int, ignore []shardmap.RowDiff, timeout time.Duration) ([]shardmap.RowDiff, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []shardmap.RowDiff
	for _, slot := range slots {
		for _, d := range diffKeys(slot, f.tables[mig.Source][slot], f.tables[mig.Target][slot]) {
			if !slices.Contains(ignore, d) {
				out = append(out, d)
			}
		}
	}
	return out, nil
}

func (f *fakeNodes) PrepareWriteLog(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("writelog %s", mig.ID)
	if f.logs[mig.ID] == nil {
		f.logs[mig.ID] = &fakeWriteLog{mig: mig, rows: map[shardmap.RowDiff]fakeImage{}}
	}
	return nil
}

func (f *fakeNodes) DropWriteLog(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("drop writelog %s", mig.ID)
	delete(f.logs, mig.ID)
	return nil
}

func (f *fakeNodes) OpenWriteLog(ctx context.Context, ts []*shardmap.Tree, mig *shardmap.Migration, timeout time.Duration) (Comparison, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("openwritelog %s", mig.ID)
	return &fakeLogged{f: f, mig: mig}, nil
}

// fakeLogged compares as clusterNodes' write log does: the source as it
// is, the target as it is with each logged key's row put back.
type fakeLogged struct {
	f   *fakeNodes
	mig *shardmap.Migration
}

func (l *fakeLogged) Compare(ctx context.Context) (*shardmap.Verification, error) {
	f := l.f
	if f.compareErr != nil {
		return nil, f.compareErr
	}
	f.mu.Lock()
	log := f.logs[l.mig.ID]
	if log == nil {
		f.mu.Unlock()
		return nil, errNoWriteLog
	}
	s := &fakeSnapshots{f: f, mig: l.mig, logged: maps.Clone(log.rows)}
	s.src, s.tgt = s.take(l.mig.Source), s.take(l.mig.Target)
	f.mu.Unlock()
	v, err := s.Compare(ctx)
	if v != nil {
		v.FromLog = true
	}
	return v, err
}

func (l *fakeLogged) WrittenSince(ctx context.Context, slots []int) ([]shardmap.RowDiff, error) {
	l.f.mu.Lock()
	defer l.f.mu.Unlock()
	var out []shardmap.RowDiff
	for d := range l.f.logs[l.mig.ID].rows {
		if slices.Contains(slots, d.Slot) {
			out = append(out, d)
		}
	}
	return out, nil
}

func (l *fakeLogged) Close() {}

func (f *fakeNodes) MarkVerifyFailed(ctx context.Context, t *shardmap.Tree, node string, idx int, migration string, slots [][2]int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("mark verify_failed %d", idx)
	return nil
}

func (f *fakeNodes) ClearVerifyFailed(ctx context.Context, t *shardmap.Tree, node string, idx int, migration string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("clear verify_failed %d", idx)
	return nil
}

func (f *fakeNodes) RepairRows(ctx context.Context, t *shardmap.Tree, mig *shardmap.Migration, diffs []shardmap.RowDiff) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.call("repair %d", len(diffs))
	tgt := f.table(mig.Target)
	for _, d := range diffs {
		if tgt[d.Slot] == nil {
			tgt[d.Slot] = map[string]string{}
		}
		if v, ok := f.tables[mig.Source][d.Slot][d.Key]; ok {
			tgt[d.Slot][d.Key] = v
		} else {
			delete(tgt[d.Slot], d.Key)
		}
	}
	return nil
}

// phaseStore records every phase a migration record is written with.
type phaseStore struct {
	Store
	mu     sync.Mutex
	phases []shardmap.MigrationPhase
	// last is every migration's last record, kept after it is deleted.
	last []shardmap.Migration
	// onPhase, if set, is called after each phase is stored.
	onPhase func(shardmap.MigrationPhase)
}

func (s *phaseStore) PutMigration(ctx context.Context, m *shardmap.Migration) error {
	s.mu.Lock()
	if n := len(s.phases); n == 0 || s.phases[n-1] != m.Phase {
		s.phases = append(s.phases, m.Phase)
	}
	if i := slices.IndexFunc(s.last, func(o shardmap.Migration) bool { return o.ID == m.ID }); i >= 0 {
		s.last[i] = *m
	} else {
		s.last = append(s.last, *m)
	}
	s.mu.Unlock()
	if err := s.Store.PutMigration(ctx, m); err != nil {
		return err
	}
	if s.onPhase != nil {
		s.onPhase(m.Phase)
	}
	return nil
}

// started is every migration ever recorded, as last recorded, oldest first.
func (s *phaseStore) started() []shardmap.Migration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.last)
}

func (s *phaseStore) recorded() []shardmap.MigrationPhase {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.phases)
}

// crashed is the panic a test's crash hook raises in place of SIGKILL.
type crashed struct{ point string }

// testRig is a tree of 4 shards with 4 rows in each slot of 0..63, on a
// fake cluster and a store in miniredis.
type testRig struct {
	t     *testing.T
	ctx   context.Context
	nodes *fakeNodes
	store *phaseStore
	tree  *shardmap.Tree
	opts  Options
}

const rigSlots = 64

func newRig(t *testing.T) *testRig {
	t.Helper()
	mr := miniredis.RunT(t)
	rs := shardmap.NewRedisStore(redis.NewClient(&redis.Options{Addr: mr.Addr()}), "test")
	t.Cleanup(func() { rs.Close() })
	tree := &shardmap.Tree{Tenant: "app", Name: "items", KeyColumn: "id", KeyType: shardmap.KeyText,
		Columns: []string{"id", "v"}, SlotCount: rigSlots, ShardCount: 4,
		DDL: []string{"CREATE TABLE {{table}} (id text PRIMARY KEY, v text)"}}
	m := shardmap.NewIdentityMap("app", "items", rigSlots, 4, []string{"n1", "n2"})
	ctx := context.Background()
	if err := rs.CreateTree(ctx, tree, m); err != nil {
		t.Fatal(err)
	}
	r := &testRig{t: t, ctx: ctx, nodes: newFakeNodes(), store: &phaseStore{Store: rs}, tree: tree,
		opts: Options{FreezeBudget: 200 * time.Millisecond, AckPoll: time.Millisecond}}
	for slot := 0; slot < rigSlots; slot++ {
		for i := 0; i < 4; i++ {
			r.nodes.put(m.Slots[slot], slot, fmt.Sprintf("k%d-%d", slot, i), "v")
		}
	}
	return r
}

// runCoordinator runs c until the test ends.
func (r *testRig) runCoordinator(t *testing.T, c *Coordinator) {
	ctx, cancel := context.WithCancel(r.ctx)
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-ran
	})
}

// runner is a fresh Runner, as a restarted process has: no snapshots
// held. A crash at point (if not empty) panics out of its run.
func (r *testRig) runner(point string) *Runner {
	run := newRunner(r.nodes, r.store, r.opts, nil, slog.New(slog.DiscardHandler))
	run.crash = func(p string) {
		if p == point {
			panic(crashed{p})
		}
	}
	r.nodes.crash = run.crash
	return run
}

// run runs mig and reports the crash point it stopped at, "" if none.
func (r *testRig) run(run *Runner, mig *shardmap.Migration) (point string, err error) {
	defer func() {
		if p := recover(); p != nil {
			c, ok := p.(crashed)
			if !ok {
				panic(p)
			}
			point = c.point
		}
	}()
	return "", run.Run(r.ctx, mig)
}

// stored is mig as the store holds it, nil once deleted.
func (r *testRig) stored(mig *shardmap.Migration) *shardmap.Migration {
	migs, err := r.store.Migrations(r.ctx, mig.Tenant, mig.Tree)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, m := range migs {
		if m.ID == mig.ID {
			return m
		}
	}
	return nil
}

func (r *testRig) mapNow() *shardmap.Map {
	m, err := r.store.Map(r.ctx, r.tree.Tenant, r.tree.Name)
	if err != nil {
		r.t.Fatal(err)
	}
	return m
}

// start records a split of shard 0, a move of shard 0 to the other node,
// or a fold of shard 1 into shard 0.
func (r *testRig) start(kind shardmap.MigrationKind) *shardmap.Migration {
	run := r.runner("")
	var mig *shardmap.Migration
	var err error
	switch kind {
	case shardmap.Split:
		mig, err = run.StartSplit(r.ctx, r.tree, 0)
	case shardmap.Move:
		to := map[string]string{"n1": "n2", "n2": "n1"}[r.mapNow().Shards[0].Node]
		mig, err = run.StartMove(r.ctx, r.tree, 0, to)
	default:
		mig, err = run.StartFold(r.ctx, r.tree, 1, 0)
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return mig
}
