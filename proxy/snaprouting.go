package proxy

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// A transaction under REPEATABLE READ or SERIALIZABLE reads each node under
// the snapshot that node took at the transaction's first statement there,
// while the proxy routes each statement by the map of its moment. After a
// flip or a release the two disagree: the source of a split, its moved rows
// deleted after the snapshot, still shows them to it, and the new map reads
// them from the target too (a row twice); a target filled after the
// snapshot shows it nothing (a row lost). So once a tree's routing changed
// since the transaction's first statement took its view (tx.routing), a
// statement of such a transaction that reads or writes the tree gets a
// serialization failure, which such transactions are written to retry. A
// READ COMMITTED transaction takes a snapshot per statement, within the
// statement's own view: it goes on.

// isolationTimeout bounds the one query that asks a transaction's backend
// for its isolation level.
const isolationTimeout = 5 * time.Second

// noteRouting keeps v as the transaction's routing while no node holds a
// part of it yet: the view the snapshots are taken under. Outside a
// transaction too, since a query string may open one (BEGIN; SELECT ...)
// whose statements take their backends together. A statement that exports
// the transaction's snapshot records that routing for the transactions
// that import it.
func (s *session) noteRouting(v *shardmap.View, p *router.Plan) {
	if len(s.tx.conns) == 0 && s.tx.routing != v {
		s.forgetExport()
		s.tx.routing, s.tx.isolation = v, ""
	}
	if s.tx.active && p.Kind == router.Catalog && exportsSnapshot(p.SQL) {
		s.srv.exports.add(s, s.tx.routing)
		s.tx.exported = true
	}
}

// importedSnapshot reports a transaction that imported a snapshot with SET
// TRANSACTION SNAPSHOT.
func (s *session) importedSnapshot() bool {
	return len(s.tx.local) > 0 && slices.ContainsFunc(s.tx.local, importsSnapshot)
}

// forgetExport takes the transaction's export, if any, off the proxy's.
func (s *session) forgetExport() {
	if s.tx.exported {
		s.srv.exports.remove(s)
		s.tx.exported = false
	}
}

// exportsSnapshot reports a statement that may call pg_export_snapshot. It
// may say yes of one that does not (a comment, a literal): that only makes
// importers stricter.
func exportsSnapshot(sql string) bool {
	return strings.Contains(sql, "xport_snapshot") || strings.Contains(sql, "XPORT_SNAPSHOT")
}

// snapshotExports are the routings under which the open transactions of a
// proxy's sessions exported their snapshots, by session.
type snapshotExports struct {
	mu sync.Mutex
	by map[*session]*shardmap.View
}

func (e *snapshotExports) add(s *session, v *shardmap.View) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.by == nil {
		e.by = map[*session]*shardmap.View{}
	}
	e.by[s] = v
}

func (e *snapshotExports) remove(s *session) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.by, s)
}

// views are the routings of tenant's open exports.
func (e *snapshotExports) views(tenant string) []*shardmap.View {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*shardmap.View
	for _, v := range e.by {
		if v.Tenant == tenant {
			out = append(out, v)
		}
	}
	return out
}

// checkRouting fails a statement of p's trees routed by v when the
// transaction holds snapshots taken under another routing of them and its
// isolation level keeps those snapshots. A transaction that imported a
// snapshot (SET TRANSACTION SNAPSHOT) took it under the routing of the
// transaction that exported it: every export open on this proxy counts.
func (s *session) checkRouting(ctx context.Context, v *shardmap.View, p *router.Plan) error {
	if !s.tx.active || len(s.tx.conns) == 0 || s.tx.routing == nil {
		return nil
	}
	imported := s.importedSnapshot()
	if !imported && s.tx.routing == v {
		return nil // the common case: no map changed since the first statement
	}
	trees := planTrees(p)
	if len(trees) == 0 {
		return nil
	}
	under := []*shardmap.View{s.tx.routing}
	if imported {
		if under = s.srv.exports.views(s.tenant); len(under) == 0 {
			e := sqlstate.New(sqlstate.FeatureNotSupported, "this transaction imported a snapshot that no open transaction of this Lattice proxy exported, so the routing of tree %q under it is unknown", trees[0].Name)
			e.Hint = "Export the snapshot (pg_export_snapshot) through the same proxy and keep that transaction open, as pg_dump --jobs does."
			return e
		}
	}
	var moved *shardmap.Tree
	for _, t := range trees {
		for _, u := range under {
			if u != v && !sameRouting(u.Maps[t.Name], v.Maps[t.Name]) {
				moved = t
			}
		}
	}
	if moved == nil {
		return nil
	}
	if !imported { // an import needs REPEATABLE READ or SERIALIZABLE
		keeps, err := s.keepsSnapshot(ctx)
		if err != nil || !keeps {
			return err
		}
	}
	e := sqlstate.New(sqlstate.SerializationFailure, "could not serialize access: tree %q was resharded since this transaction took its snapshot", moved.Name)
	e.Detail = "Under its snapshot the rows that moved are where they were, while the tree's map now says where they are: reading them could show a row twice or not at all."
	e.Hint = "Retry the transaction, as for any serialization failure. A READ COMMITTED transaction is not affected."
	return e
}

// keepsSnapshot reports whether the transaction runs under REPEATABLE READ
// or SERIALIZABLE, asking its first backend once. A backend with work of
// this exchange queued cannot be asked in between: the answer is then
// yes, which costs at worst a retry.
func (s *session) keepsSnapshot(ctx context.Context) (bool, error) {
	if s.tx.isolation == "" {
		be := s.tx.conns[0]
		if be.TxStatus == 'E' || s.tx.failed {
			return false, nil // the statement fails as it is
		}
		if s.inBatch(be) {
			return true, nil
		}
		ctx, cancel := context.WithTimeout(ctx, isolationTimeout)
		row, err := queryRow(ctx, be, "SHOW transaction_isolation")
		cancel()
		if err != nil {
			return false, err
		}
		if len(row) != 1 {
			return false, sqlstate.New(sqlstate.InternalError, "node %s answered SHOW transaction_isolation with %d columns", be.Node, len(row))
		}
		s.tx.isolation = string(row[0])
	}
	return s.tx.isolation == "repeatable read" || s.tx.isolation == "serializable", nil
}

// planTrees are the trees p reads or writes: its own (with its colocation
// group, which shares its map) and the trees an INSERT ... SELECT loads
// from.
func planTrees(p *router.Plan) []*shardmap.Tree {
	var out []*shardmap.Tree
	for ; p != nil; p = sourcePlan(p) {
		if p.Tree != nil {
			out = append(out, p.Tree)
		}
	}
	return out
}

func sourcePlan(p *router.Plan) *router.Plan {
	if p.Copy == nil {
		return nil
	}
	return p.Copy.Source
}

// sameRouting reports whether two maps of a tree send every slot to the
// same table, read alike: the same owners, nodes, states and mixed marks.
// Frozen and freezing slots do not count; a map that went is a change.
func sameRouting(a, b *shardmap.Map) bool {
	return a != nil && b != nil && slices.Equal(a.Slots, b.Slots) && maps.Equal(a.Shards, b.Shards)
}
