package router

import (
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// A plan says what a statement does; resolving it against a tenant's shard
// maps and the client's Bind says where it runs now. Plans are cached and
// shared; a resolution is made for one execution and belongs to its caller.

// maxKeyElems bounds the keys of an IN list or array that are hashed; a
// longer one reads every shard.
const maxKeyElems = 100000

// Bind is what routing reads of an extended-protocol Bind: the parameter
// values, their format codes (none: all text; one: the same for all) and
// the parameter types the statement declared (0 or missing: unspecified).
// The simple protocol has no Bind: pass nil.
type Bind struct {
	Params  [][]byte
	Formats []int16
	OIDs    []uint32
	// AsPrepared says a Single plan runs as its Prepared statement:
	// Target.SQL is then its text with parameters.
	AsPrepared bool
}

func (b *Bind) count() int {
	if b == nil {
		return 0
	}
	return len(b.Params)
}

func (b *Bind) oids() []uint32 {
	if b == nil {
		return nil
	}
	return b.OIDs
}

// param returns parameter n (1-based) with its format and declared type.
func (b *Bind) param(n int) (val []byte, format int16, oid uint32) {
	val = b.Params[n-1]
	switch {
	case len(b.Formats) == 1:
		format = b.Formats[0]
	case n-1 < len(b.Formats):
		format = b.Formats[n-1]
	}
	if n-1 < len(b.OIDs) {
		oid = b.OIDs[n-1]
	}
	return val, format, oid
}

// Target is one statement of a resolved plan, on one node.
type Target struct {
	Node string
	// Shard is the shard index for a statement on one shard (Single,
	// InsertSplit, WriteAll); -1 for a statement over several shards of
	// the node (FanOut, Copy TO of several shards).
	Shard int
	// Slot is the slot of the key of a statement on one shard by its key
	// (Single), and RowSlots the slot of each of an InsertSplit part's
	// Rows: the proxy counts the slots' load by them.
	Slot     int
	RowSlots []int
	// Shards are the shards a FanOut part reads, for the same count.
	Shards []int
	// Sources are the shards the statement reads, a mixed one with the
	// filter that keeps only the rows of its own slots (FanOut, Copy TO).
	Sources []btreeindex.Source
	// Rows are the VALUES rows (0-based, in order) an InsertSplit part
	// inserts, and Params the original parameter numbers of its $1, $2...
	Rows   []int
	Params []int
	// SQL is the statement to run. It is empty for Copy FROM, whose rows
	// are routed one by one as they arrive.
	SQL string
}

// Routing is a plan resolved against a map and a Bind.
type Routing struct {
	// Targets are in shard order for statements on one shard each
	// (InsertSplit parts in order of the first row of each shard;
	// WriteAll grouped by node, the nodes in order of their first shard),
	// and one per node otherwise.
	Targets []Target
	// Whole marks an aggregating FanOut whose shards all lie on one node:
	// its one target runs the whole statement, with no final step.
	Whole bool
	// Limit and Offset are a FanOut's LIMIT (-1 for none) and OFFSET (0
	// for none), applied by the proxy after the merge; every node returns
	// at most PerNode rows (LIMIT + OFFSET, or -1).
	Limit, Offset, PerNode int64
	// Frozen marks a statement that touches frozen slots, which the proxy
	// holds until the migrator flips or thaws them: the slot of its key
	// (Single, InsertSplit), or any slot of the tree for a statement over
	// several shards.
	Frozen bool
	// Explain is Lattice's plan of an Explain, the lines the client gets
	// before Targets[0]'s: its one target explains the first part.
	Explain []string
}

// Resolve resolves p against view v and the client's Bind (nil in the
// simple protocol). Plans without a tree (Catalog, Transaction ...) and
// DDL, which the proxy runs on every shard itself, resolve to no target.
// Errors carry the SQLSTATE to send the client.
func Resolve(v *shardmap.View, p *Plan, b *Bind) (*Routing, error) {
	var r *Routing
	if p.Kind == Single {
		// The routing of one statement and its target in one allocation.
		one := &struct {
			r Routing
			t [1]Target
		}{}
		r = &one.r
		r.Targets = one.t[:0]
	} else {
		r = &Routing{}
	}
	if err := ResolveTo(r, v, p, b); err != nil {
		return nil, err
	}
	return r, nil
}

// ResolveTo is Resolve into r, reusing the array of its Targets: the proxy
// resolves every point statement into one Routing of its session, so that
// the routing allocates nothing. r is overwritten, also on error.
func ResolveTo(r *Routing, v *shardmap.View, p *Plan, b *Bind) error {
	*r = Routing{Targets: r.Targets[:0]}
	var got *Routing
	var err error
	switch p.Kind {
	case RefWrite:
		got, err = resolveRefWrite(v, p)
	case Explain:
		got, err = resolveExplain(v, p, b)
	case Single, InsertSplit, WriteAll, FanOut, Copy:
		if e := resolveTree(r, v, p, b); e != nil {
			return e
		}
		return nil
	default:
		return nil
	}
	if err != nil {
		return err
	}
	*r = *got
	return nil
}

// resolveTree is ResolveTo of a plan over the shards of a tree.
func resolveTree(r *Routing, v *shardmap.View, p *Plan, b *Bind) *sqlstate.Error {
	m := v.Maps[p.Tree.Name]
	if m == nil {
		return &sqlstate.Error{Code: sqlstate.SystemError, Message: "tree " + strconv.Quote(p.Tree.Name) + " has no shard map"}
	}
	r.Limit, r.PerNode = -1, -1
	var err *sqlstate.Error
	switch p.Kind {
	case Single:
		err = r.single(m, p, b)
	case InsertSplit:
		err = r.insertSplit(m, p, b)
	case WriteAll:
		r.writeAll(m, p)
	case FanOut:
		err = r.fanOut(m, p, b)
	case Copy:
		err = r.copyPlan(m, p)
	}
	if err != nil {
		return err
	}
	if len(p.References) > 0 {
		return copiesOn(v, p, r)
	}
	return nil
}

// Nodes are the nodes of the targets, in order of their first target.
func (r *Routing) Nodes() []string {
	var out []string
	for _, t := range r.Targets {
		if !slices.Contains(out, t.Node) {
			out = append(out, t.Node)
		}
	}
	return out
}

func (r *Routing) single(m *shardmap.Map, p *Plan, b *Bind) *sqlstate.Error {
	slot, err := KeySlot(p.Tree.KeyType, len(m.Slots), p.Key, b)
	if err != nil {
		return err
	}
	// Levels pinned to other values read their rows from this shard too:
	// right only when those rows are there, in this very slot (one slot
	// also has one migration state).
	for _, also := range p.KeyAlso {
		s, err := KeySlot(p.Tree.KeyType, len(m.Slots), also, b)
		if err != nil {
			return err
		}
		if s != slot {
			return refused("Give every part of the statement the same "+p.Tree.KeyColumn+" value, or run the parts as separate statements.",
				"the statement fixes the shard key %s to values of different shards in its parts", qn(p.Tree.KeyColumn))
		}
	}
	sh := m.Owner(slot)
	r.Frozen = m.IsFrozen(slot)
	var sql string
	if b != nil && b.AsPrepared && p.Prepared != nil {
		sql = p.Prepared.SQL(sh.Index)
	} else {
		sql = p.Render(schemaName(sh.Index))
	}
	r.Targets = append(r.Targets, Target{Node: sh.Node, Shard: sh.Index, Slot: slot, SQL: sql})
	return nil
}

// insertSplit groups the VALUES rows by owning shard, in order of first
// appearance, and renders each shard's INSERT with only its rows. When
// every row goes to one shard, the statement runs there unchanged but for
// the tree's name.
func (r *Routing) insertSplit(m *shardmap.Map, p *Plan, b *Bind) *sqlstate.Error {
	// Each part gets only its rows' parameters, so no backend sees the
	// whole Bind: its count is checked here, as PostgreSQL checks it.
	if want := max(p.split.maxParam, len(b.oids())); b.count() != want {
		return &sqlstate.Error{Code: sqlstate.ProtocolViolation, Message: "bind message supplies " + strconv.Itoa(b.count()) +
			" parameters, but the statement requires " + strconv.Itoa(want)}
	}
	index := map[int]int{}
	for i, key := range p.Rows {
		slot, err := KeySlot(p.Tree.KeyType, len(m.Slots), key, b)
		if err != nil {
			return err
		}
		r.Frozen = r.Frozen || m.IsFrozen(slot)
		sh := m.Owner(slot)
		g, ok := index[sh.Index]
		if !ok {
			g = len(r.Targets)
			index[sh.Index] = g
			r.Targets = append(r.Targets, Target{Node: sh.Node, Shard: sh.Index})
		}
		r.Targets[g].Rows = append(r.Targets[g].Rows, i)
		r.Targets[g].RowSlots = append(r.Targets[g].RowSlots, slot)
	}
	for i := range r.Targets {
		t := &r.Targets[i]
		t.SQL, t.Params = p.RenderRows(schemaName(t.Shard), t.Rows)
	}
	return nil
}

// writeAll runs the statement on every owning shard. A mixed shard's part
// is restricted to the slots the shard owns, by the same predicate its
// reads go through: a fold survivor holds copies of the donor's rows until
// the flip, a split source the moved rows until the release, and a write
// that reached those would count them in its command tag and return them
// in RETURNING a second time. The donor's rows are written on the donor
// only, and reach the survivor through the migration's stream.
func (r *Routing) writeAll(m *shardmap.Map, p *Plan) {
	r.Frozen = len(m.Frozen) > 0
	for _, g := range nodeGroups(m, nil) {
		for _, idx := range g.shards {
			schema := schemaName(idx)
			sql := p.Render(schema)
			if m.Shards[idx].Mixed {
				owned := m.SlotRanges(idx)
				sql = p.RenderFiltered(schema, func(q string) string { return btreeindex.SlotPredicate(p.Tree, q, owned) })
			}
			r.Targets = append(r.Targets, Target{Node: g.node, Shard: idx, SQL: sql})
		}
	}
}

func (r *Routing) fanOut(m *shardmap.Map, p *Plan, b *Bind) *sqlstate.Error {
	r.Frozen = len(m.Frozen) > 0
	only := keyShards(m, p, b)
	if p.Agg == nil {
		if err := r.limits(p, b); err != nil {
			return err
		}
	}
	if only == nil && p.every.get(r, m) {
		return nil
	}
	r.fanTargets(m, p, nodeGroups(m, only))
	if only == nil {
		p.every.put(r, m)
	}
	return nil
}

// fanTargets renders a fan-out's statement for each node's shards.
func (r *Routing) fanTargets(m *shardmap.Map, p *Plan, groups []nodeGroup) {
	if p.Agg != nil {
		if len(groups) == 1 {
			r.Whole = true
			srcs := btreeindex.Sources(m, p.Tree, groups[0].shards)
			r.Targets = []Target{{Node: groups[0].node, Shard: -1, Shards: groups[0].shards, Sources: srcs, SQL: p.RenderWhole(srcs)}}
			return
		}
		for _, g := range groups {
			srcs := btreeindex.Sources(m, p.Tree, g.shards)
			r.Targets = append(r.Targets, Target{Node: g.node, Shard: -1, Shards: g.shards, Sources: srcs, SQL: p.RenderPartial(srcs)})
		}
		return
	}
	for _, g := range groups {
		srcs := btreeindex.Sources(m, p.Tree, g.shards)
		r.Targets = append(r.Targets, Target{Node: g.node, Shard: -1, Shards: g.shards, Sources: srcs, SQL: p.RenderFanOut(srcs, r.PerNode)})
	}
}

// allShards keeps a FanOut plan's routing over every shard of one map:
// rendering a branch per shard is most of the cost of resolving a
// fan-out, and a plan whose WHERE does not restrict the key renders the
// same statements for every execution on one map. Maps are immutable and
// a new epoch is a new *Map (shardmap.View), so the map's pointer names
// what the targets were made from; the node's row bound (PerNode) is in
// the statement, so it is part of the key. Sessions share the plan: the
// entry is swapped whole.
type allShards struct {
	last atomic.Pointer[allShardsEntry]
}

type allShardsEntry struct {
	m       *shardmap.Map
	perNode int64
	whole   bool
	targets []Target
}

// get fills r's targets from the entry made for m, if there is one.
func (e *allShards) get(r *Routing, m *shardmap.Map) bool {
	x := e.last.Load()
	if x == nil || x.m != m || x.perNode != r.PerNode {
		return false
	}
	r.Targets, r.Whole = append(r.Targets[:0], x.targets...), x.whole
	return true
}

// put keeps r's targets, made over every shard of m.
func (e *allShards) put(r *Routing, m *shardmap.Map) {
	e.last.Store(&allShardsEntry{m: m, perNode: r.PerNode, whole: r.Whole, targets: slices.Clone(r.Targets)})
}

// copyPlan resolves COPY: FROM STDIN routes its rows as they arrive; TO
// STDOUT reads the key's shard, or every shard grouped by node, the first
// node's part writing the header line.
func (r *Routing) copyPlan(m *shardmap.Map, p *Plan) *sqlstate.Error {
	if p.Copy.Query && p.Copy.QueryKind == Single {
		// The key of a COPY (SELECT ...) is a literal: there is no Bind.
		slot, err := KeySlot(p.Tree.KeyType, len(m.Slots), p.Key, nil)
		if err != nil {
			return err
		}
		sh := m.Owner(slot)
		r.Frozen = m.IsFrozen(slot)
		srcs := btreeindex.Schemas(shardmap.SchemaName(sh.Index))
		r.Targets = []Target{{Node: sh.Node, Shard: sh.Index, Sources: srcs, SQL: p.RenderCopyTo(srcs, true)}}
		return nil
	}
	r.Frozen = len(m.Frozen) > 0
	if p.Copy.From {
		return nil
	}
	for i, g := range nodeGroups(m, nil) {
		srcs := btreeindex.Sources(m, p.Tree, g.shards)
		r.Targets = append(r.Targets, Target{Node: g.node, Shard: -1, Sources: srcs, SQL: p.RenderCopyTo(srcs, i == 0)})
	}
	return nil
}

// schemaNames are the schemas of the first shards, named once: naming the
// shard is on every statement's path, and fmt is slow.
var schemaNames = sync.OnceValue(func() []string {
	out := make([]string, 1024)
	for i := range out {
		out[i] = shardmap.SchemaName(i)
	}
	return out
})

func schemaName(idx int) string {
	if idx >= 0 && idx < 1024 {
		return schemaNames()[idx]
	}
	return shardmap.SchemaName(idx)
}

// nodeGroup is the owning shards of a tree on one node, in shard order.
type nodeGroup struct {
	node   string
	shards []int
}

// nodeGroups lists the nodes holding owning shards of m, in order of their
// first shard; only the shards in only when it is not nil.
func nodeGroups(m *shardmap.Map, only map[int]bool) []nodeGroup {
	var out []nodeGroup
	index := map[string]int{}
	for _, idx := range m.OwningShards() {
		if only != nil && !only[idx] {
			continue
		}
		node := m.Shards[idx].Node
		g, ok := index[node]
		if !ok {
			g = len(out)
			index[node] = g
			out = append(out, nodeGroup{node: node})
		}
		out[g].shards = append(out[g].shards, idx)
	}
	return out
}

// KeySlot hashes a key value: a literal, or a Bind parameter in text or
// binary form. A NULL key matches no row and cannot be inserted, so any
// shard answers it correctly: it gets slot 0.
func KeySlot(kt shardmap.KeyType, slots int, key Value, b *Bind) (int, *sqlstate.Error) {
	if key.Null {
		return 0, nil
	}
	if key.Param == 0 {
		slot, err := shardmap.SlotForText(kt, []byte(key.Text), slots)
		if err != nil {
			return 0, &sqlstate.Error{Code: sqlstate.InvalidTextRepresentation, Message: err.Error()}
		}
		return slot, nil
	}
	if key.Param > b.count() {
		return 0, &sqlstate.Error{Code: sqlstate.ProtocolViolation, Message: "bind message supplies " + strconv.Itoa(b.count()) +
			" parameters, but the shard key is $" + strconv.Itoa(key.Param)}
	}
	val, format, oid := b.param(key.Param)
	if val == nil {
		return 0, nil
	}
	var slot int
	var err error
	if format == 1 {
		if !binaryKeyOID(kt, oid) {
			return 0, &sqlstate.Error{Code: sqlstate.FeatureNotSupported,
				Message: "shard key $" + strconv.Itoa(key.Param) + " is sent in binary as type oid " + strconv.FormatUint(uint64(oid), 10) + ", which Lattice cannot hash as the key's type",
				Hint:    "send the key as text, or with the key column's own type"}
		}
		slot, err = shardmap.SlotForBinary(kt, val, slots)
	} else {
		slot, err = shardmap.SlotForText(kt, val, slots)
	}
	if err != nil {
		return 0, &sqlstate.Error{Code: sqlstate.InvalidTextRepresentation, Message: "shard key $" + strconv.Itoa(key.Param) + ": " + err.Error()}
	}
	return slot, nil
}

// binaryKeyOID reports whether a binary parameter of type oid hashes like
// the key: a float8 sent for an int key has 8 bytes too, but another value.
func binaryKeyOID(kt shardmap.KeyType, oid uint32) bool {
	if oid == 0 {
		return true // the server infers the key column's own type
	}
	switch kt {
	case shardmap.KeyInt:
		return oid == pgtype.Int2OID || oid == pgtype.Int4OID || oid == pgtype.Int8OID
	case shardmap.KeyUUID:
		return oid == pgtype.UUIDOID
	}
	return oid == pgtype.TextOID || oid == pgtype.VarcharOID
}

// keyShards returns the shards owning the keys a FanOut plan restricts its
// shard key to (key IN (...), key = ANY(...)), or nil for every shard. A
// key that cannot be read restricts nothing: reading every shard is always
// correct for a SELECT, and PostgreSQL reports a malformed value.
func keyShards(m *shardmap.Map, p *Plan, b *Bind) map[int]bool {
	if p.Keys == nil && p.KeyArray == nil {
		return nil
	}
	kt, slots := p.Tree.KeyType, len(m.Slots)
	only := map[int]bool{}
	for _, k := range p.Keys {
		slot, err := KeySlot(kt, slots, k, b)
		if err != nil {
			return nil
		}
		only[m.Owner(slot).Index] = true
	}
	if a := p.KeyArray; a != nil {
		raw, format, oid := []byte(a.Text), int16(0), uint32(0)
		if a.Param > 0 {
			if a.Param > b.count() {
				return nil
			}
			raw, format, oid = b.param(a.Param)
		}
		if raw == nil {
			// key = ANY(NULL) matches no row: any one shard answers.
			only[m.Owner(0).Index] = true
			return only
		}
		slotsOf, ok := arraySlots(kt, slots, raw, format, oid)
		if !ok {
			return nil
		}
		for _, slot := range slotsOf {
			only[m.Owner(slot).Index] = true
		}
	}
	if len(only) == 0 {
		// An empty list or array matches no row.
		only[m.Owner(0).Index] = true
	}
	return only
}

var typeMap = pgtype.NewMap()

// arraySlots hashes the non-NULL elements of a one-dimensional array value
// in text or binary form.
func arraySlots(kt shardmap.KeyType, slots int, raw []byte, format int16, oid uint32) ([]int, bool) {
	var out []int
	if format == 0 {
		var elems []*string
		if err := typeMap.Scan(pgtype.TextArrayOID, 0, raw, &elems); err != nil || len(elems) > maxKeyElems {
			return nil, false
		}
		for _, e := range elems {
			if e == nil {
				continue
			}
			slot, err := shardmap.SlotForText(kt, []byte(*e), slots)
			if err != nil {
				return nil, false
			}
			out = append(out, slot)
		}
		return out, true
	}
	// Binary: ndim, has-null flag, element type, then per dimension its
	// length and lower bound, then each element as length and bytes.
	if oid != 0 && oid != pgtype.Int2ArrayOID && oid != pgtype.Int4ArrayOID && oid != pgtype.Int8ArrayOID &&
		oid != pgtype.TextArrayOID && oid != pgtype.VarcharArrayOID && oid != pgtype.UUIDArrayOID {
		return nil, false
	}
	if len(raw) < 12 {
		return nil, false
	}
	ndim := int32(binary.BigEndian.Uint32(raw))
	elemOID := binary.BigEndian.Uint32(raw[8:])
	if ndim == 0 {
		return nil, true
	}
	if ndim != 1 || len(raw) < 20 || !binaryKeyOID(kt, elemOID) {
		return nil, false
	}
	n := int32(binary.BigEndian.Uint32(raw[12:]))
	if n < 0 || n > maxKeyElems {
		return nil, false
	}
	rest := raw[20:]
	for range n {
		if len(rest) < 4 {
			return nil, false
		}
		l := int32(binary.BigEndian.Uint32(rest))
		rest = rest[4:]
		if l < 0 {
			continue // NULL
		}
		if int(l) > len(rest) {
			return nil, false
		}
		slot, err := shardmap.SlotForBinary(kt, rest[:l], slots)
		if err != nil {
			return nil, false
		}
		out = append(out, slot)
		rest = rest[l:]
	}
	return out, len(rest) == 0
}

// limits evaluates LIMIT and OFFSET from literals or Bind parameters.
func (r *Routing) limits(p *Plan, b *Bind) *sqlstate.Error {
	var err *sqlstate.Error
	if r.Limit, err = countValue(p.Limit, b, "LIMIT", sqlstate.InvalidRowCountInLimitClause); err != nil {
		return err
	}
	if r.Offset, err = countValue(p.Offset, b, "OFFSET", sqlstate.InvalidRowCountInResultOffsetClause); err != nil {
		return err
	}
	if r.Offset < 0 {
		r.Offset = 0
	}
	r.PerNode = -1
	if r.Limit >= 0 {
		r.PerNode = r.Limit + r.Offset
		if r.PerNode < r.Limit { // overflow
			r.PerNode = math.MaxInt64
		}
	}
	return nil
}

// countValue reads a LIMIT or OFFSET count; -1 when there is none (absent,
// NULL, ALL).
func countValue(v *Value, b *Bind, what, code string) (int64, *sqlstate.Error) {
	if v == nil || v.Null {
		return -1, nil
	}
	text := v.Text
	if v.Param > 0 {
		if v.Param > b.count() {
			return 0, &sqlstate.Error{Code: sqlstate.ProtocolViolation, Message: "bind message supplies " + strconv.Itoa(b.count()) +
				" parameters, but " + what + " uses $" + strconv.Itoa(v.Param)}
		}
		raw, format, oid := b.param(v.Param)
		if raw == nil {
			return -1, nil
		}
		if format == 1 {
			t, err := binaryCount(raw, oid, what, v.Param)
			if err != nil {
				return 0, err
			}
			text = t
		} else {
			text = string(raw)
		}
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return 0, &sqlstate.Error{Code: sqlstate.InvalidTextRepresentation, Message: "invalid input syntax for type bigint: " + strconv.Quote(text)}
	}
	if n < 0 {
		return 0, &sqlstate.Error{Code: code, Message: what + " must not be negative"}
	}
	return n, nil
}

// binaryCount is the text of a count sent in binary. PostgreSQL types a
// LIMIT parameter as bigint; a driver that learnt that from Describe sends
// it without naming the type, so an undeclared one is read by its length.
func binaryCount(raw []byte, oid uint32, what string, param int) (string, *sqlstate.Error) {
	if oid == 0 {
		oid = map[int]uint32{2: pgtype.Int2OID, 4: pgtype.Int4OID, 8: pgtype.Int8OID}[len(raw)]
	}
	bad := &sqlstate.Error{Code: sqlstate.InvalidBinaryRepresentation, Message: "incorrect binary data format in bind parameter"}
	switch oid {
	case pgtype.Int2OID:
		if len(raw) != 2 {
			return "", bad
		}
		return strconv.Itoa(int(int16(binary.BigEndian.Uint16(raw)))), nil
	case pgtype.Int4OID:
		if len(raw) != 4 {
			return "", bad
		}
		return strconv.Itoa(int(int32(binary.BigEndian.Uint32(raw)))), nil
	case pgtype.Int8OID:
		if len(raw) != 8 {
			return "", bad
		}
		return strconv.FormatInt(int64(binary.BigEndian.Uint64(raw)), 10), nil
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.NameOID, 0:
		return string(raw), nil
	}
	return "", &sqlstate.Error{Code: sqlstate.InvalidBinaryRepresentation, Message: what + " $" + strconv.Itoa(param) + " is sent in binary as type oid " +
		strconv.FormatUint(uint64(oid), 10) + "; send it as an integer", Hint: "bind " + what + " as bigint, or send it as text"}
}
