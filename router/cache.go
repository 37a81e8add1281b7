package router

import (
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Planner plans statements and caches the plans. It is safe for concurrent
// use.
//
// Two caches, each bounded and LRU-ish:
//
//   - by exact statement text: a hit is one map lookup under a read lock;
//   - by shape (the statement's tokens with the values of its constants
//     left out, see shape.go): a statement that differs from a planned one
//     only in literal constants is scanned, not parsed, and its plan is
//     derived from the shape's template, the key re-read and re-checked
//     from the new literal.
//
// An entry keeps the plans of a statement for up to maxVariants trees
// versions, so that tenants sharing a Planner (versions are unique across
// tenants) do not evict each other's plans. A statement whose planning
// consulted no tree (SELECT 1, BEGIN, SET ...) has one plan for every
// version.
type Planner struct {
	exact     *lru[planned]
	shapes    *lru[*shapeTemplate]
	shapeHits atomic.Int64 // plans derived from a shape template
}

type planned struct {
	plans []*Plan
	err   *sqlstate.Error
}

// NewPlanner returns a Planner whose caches hold about maxEntries statement
// strings and maxEntries shapes. maxEntries <= 0 disables caching (every
// Plan parses).
func NewPlanner(maxEntries int) *Planner {
	if maxEntries <= 0 {
		return &Planner{}
	}
	return &Planner{exact: newLRU[planned](maxEntries), shapes: newLRU[*shapeTemplate](maxEntries)}
}

// Plan returns one plan per statement of sql: a simple Query message may
// hold several; an empty string (or only semicolons and comments) gives no
// plan. version is the tenant's trees version: a cached plan made under
// another version is planned again. Errors (syntax errors) are *sqlstate.Error with
// SQLSTATE 42601; statements that cannot be routed are not errors but plans
// of Kind Refused. The plans are shared: do not modify them.
func (p *Planner) Plan(sql string, trees Trees, version uint64) ([]*Plan, error) {
	if p.exact == nil {
		var used bool
		plans, _, perr := planFull(sql, &recordingTrees{trees: trees, used: &used}, nil, false)
		if perr != nil {
			return nil, perr
		}
		return plans, nil
	}
	if v, ok := p.exact.get(sql, version); ok {
		if v.err != nil {
			return nil, v.err
		}
		return v.plans, nil
	}

	// A statement of a known shape: scan it and derive the plan.
	var toks []token
	var key []byte
	if utf8.ValidString(sql) && strings.IndexByte(sql, 0) < 0 {
		buf := scanBufs.Get().(*scanBuf)
		defer scanBufs.Put(buf)
		var ok bool
		if toks, key, ok = buf.scan(sql); ok {
			if t, ok := p.shapes.getBytes(key, version); ok {
				// Not cached by exact text: statements of one shape
				// differ mostly in their literals (a point select's key),
				// so each would be a new entry pushing out plans that are
				// hit, at the cost of a map insert per statement.
				if plans, ok := t.derive(sql, toks); ok {
					p.shapeHits.Add(1)
					return plans, nil
				}
			}
		}
	}

	// Planned in full: what planning keeps of the tokens must not be the
	// reused buffer's.
	toks = slices.Clone(toks)
	var used bool
	plans, tmpl, perr := planFull(sql, &recordingTrees{trees: trees, used: &used}, toks, toks != nil)
	if tmpl != nil && tmpl.prep != nil {
		// The derived plan is the full one (the template checked) and
		// carries the parameters.
		if d, ok := tmpl.derive(sql, toks); ok {
			plans = d
		}
	}
	p.exact.put(sql, version, !used, planned{plans: plans, err: perr})
	if tmpl != nil {
		tmpl.anyVer = !used
		p.shapes.put(string(key), version, !used, tmpl)
	}
	if perr != nil {
		return nil, perr
	}
	return plans, nil
}

// Len is the number of statement strings in the exact-text cache.
func (p *Planner) Len() int {
	if p.exact == nil {
		return 0
	}
	return p.exact.len()
}

// recordingTrees notes whether planning consulted the trees at all: a plan
// of a statement that names no relation is valid under every version.
type recordingTrees struct {
	trees Trees
	used  *bool
}

func (r *recordingTrees) Tree(name string) (*shardmap.Tree, bool) {
	*r.used = true
	if r.trees == nil {
		return nil, false
	}
	return r.trees.Tree(name)
}

// Group and Reference pass on what the trees know of colocation groups
// and reference tables (colocate.go); both count as consulting the trees.
func (r *recordingTrees) Group(t *shardmap.Tree) string {
	*r.used = true
	if g, ok := r.trees.(Groups); ok {
		return g.Group(t)
	}
	return ""
}

func (r *recordingTrees) Reference(name string) bool {
	*r.used = true
	ref, ok := r.trees.(References)
	return ok && ref.Reference(name)
}

func (r *recordingTrees) ReferenceNames() []string {
	*r.used = true
	if l, ok := r.trees.(ReferenceLister); ok {
		return l.ReferenceNames()
	}
	return nil
}

// lru is a bounded, LRU-ish map from string to values kept per version.
// Each of its shards keeps two generations; new keys go to the young one, a
// hit in the old one moves the entry to the young one, and when the young
// one is full it becomes the old one (the previous old generation is
// dropped). A hit in the young generation is a map lookup under a read lock.
type lru[T any] struct {
	shards []lruShard[T]
	seed   maphash.Seed
	perGen int  // entries per generation per shard
	noOld  bool // maxEntries == 1: a single generation
}

type lruShard[T any] struct {
	mu    sync.RWMutex
	young map[string]*lruEntry[T]
	old   map[string]*lruEntry[T]
}

const maxVariants = 4

type lruEntry[T any] struct {
	vars [maxVariants]variant[T]
	n    int // variants in use
	next int // the variant replaced next when all are in use
}

type variant[T any] struct {
	version uint64
	anyVer  bool // valid under every version
	val     T
}

func newLRU[T any](maxEntries int) *lru[T] {
	c := &lru[T]{seed: maphash.MakeSeed()}
	n := 1
	for n < 16 && maxEntries/(n*2) >= 64 {
		n *= 2
	}
	c.shards = make([]lruShard[T], n)
	// Two generations per shard, each at most perGen: at most maxEntries in all.
	c.perGen = maxEntries / (2 * n)
	if c.perGen < 1 {
		c.perGen, c.noOld = 1, true
	}
	for i := range c.shards {
		c.shards[i].young = make(map[string]*lruEntry[T])
	}
	return c
}

func (c *lru[T]) shard(key string) *lruShard[T] {
	if len(c.shards) == 1 {
		return &c.shards[0]
	}
	return &c.shards[maphash.String(c.seed, key)&uint64(len(c.shards)-1)]
}

func (c *lru[T]) get(key string, version uint64) (T, bool) {
	s := c.shard(key)
	s.mu.RLock()
	e, young := s.young[key]
	if !young {
		e = s.old[key]
	}
	return s.found(c, e, young, version, func() string { return key })
}

// getBytes is get of a key in a reused byte buffer (the shape key): the
// lookups make no string of it; only a hit in the old generation, which
// keeps the key, copies it.
func (c *lru[T]) getBytes(key []byte, version uint64) (T, bool) {
	s := &c.shards[0]
	if len(c.shards) > 1 {
		s = &c.shards[maphash.Bytes(c.seed, key)&uint64(len(c.shards)-1)]
	}
	s.mu.RLock()
	e, young := s.young[string(key)]
	if !young {
		e = s.old[string(key)]
	}
	return s.found(c, e, young, version, func() string { return string(key) })
}

// found ends a lookup begun under the read lock: e is the entry found (or
// nil), young whether in the young generation; an old one's entry is
// moved to the young one under the key keyOf gives.
func (s *lruShard[T]) found(c *lru[T], e *lruEntry[T], young bool, version uint64, keyOf func() string) (T, bool) {
	var v variant[T]
	var hit bool
	if e != nil {
		v, hit = e.find(version)
	}
	s.mu.RUnlock()
	if e != nil && !young {
		s.mu.Lock()
		s.promoteLocked(keyOf(), c)
		s.mu.Unlock()
	}
	return v.val, hit
}

func (c *lru[T]) put(key string, version uint64, anyVer bool, val T) {
	s := c.shard(key)
	s.mu.Lock()
	e := s.young[key]
	if e == nil {
		e = s.promoteLocked(key, c)
	}
	if e == nil {
		e = &lruEntry[T]{}
		s.insertLocked(key, e, c)
	}
	e.add(variant[T]{version: version, anyVer: anyVer, val: val})
	s.mu.Unlock()
}

func (c *lru[T]) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += len(s.young) + len(s.old)
		s.mu.RUnlock()
	}
	return n
}

// promoteLocked moves key's entry from the old generation to the young one.
func (s *lruShard[T]) promoteLocked(key string, c *lru[T]) *lruEntry[T] {
	e, ok := s.old[key]
	if !ok {
		return nil
	}
	delete(s.old, key)
	s.insertLocked(key, e, c)
	return e
}

func (s *lruShard[T]) insertLocked(key string, e *lruEntry[T], c *lru[T]) {
	if len(s.young) >= c.perGen {
		s.old = s.young
		if c.noOld {
			s.old = nil
		}
		s.young = make(map[string]*lruEntry[T], c.perGen)
	}
	s.young[key] = e
}

func (e *lruEntry[T]) find(version uint64) (variant[T], bool) {
	for i := 0; i < e.n; i++ {
		if v := e.vars[i]; v.anyVer || v.version == version {
			return v, true
		}
	}
	return variant[T]{}, false
}

func (e *lruEntry[T]) add(v variant[T]) {
	if v.anyVer {
		e.vars[0], e.n, e.next = v, 1, 0
		return
	}
	for i := 0; i < e.n; i++ {
		if e.vars[i].version == v.version || e.vars[i].anyVer {
			e.vars[i] = v
			return
		}
	}
	if e.n < maxVariants {
		e.vars[e.n] = v
		e.n++
		return
	}
	e.vars[e.next] = v
	e.next = (e.next + 1) % maxVariants
}
