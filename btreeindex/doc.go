// Package btreeindex is the per-shard B+ table layout as the request path
// and the migrator see it (docs/DESIGN.md, section 9). A physical shard is
// an ordinary PostgreSQL table, lattice_sNNNN.<tree>, whose primary-key
// btree is the B+ structure; a shard may for a while hold rows of slots it
// does not own (section 5). This package knows:
//
//   - the layout of a shard's B+ structure, as storage parameters (heap
//     and btree fillfactor, btree deduplication), their bounds and the
//     DDL that sets them (layout.go);
//   - which rows of a shard belong to which virtual slot, as SQL: the slot
//     expression per key type and predicates over sets of slots (slot.go);
//   - how a scan reads each shard of a node so that it sees every row once,
//     through a slot predicate where the shard is mixed (source.go);
//   - how the ordered streams of several nodes become one: sort keys, the
//     decoding and PostgreSQL-compatible comparison of sort values
//     (sortkey.go, value.go), a heap-based k-way merge over a small
//     row-source interface that knows no session and no connection
//     (merge.go), and the statement that has PostgreSQL order rows whose
//     keys the merge cannot compare (pgsort.go).
//
// Of Lattice's packages it imports only shardmap and sqlstate (the error
// catalogue); router, pgshard, the proxy and the migrator import it, never
// the reverse (TestImports).
package btreeindex
