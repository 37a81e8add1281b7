// Package autonomic is the policy of the hot-shard split monitor and of
// over-split healing (docs/DESIGN.md section 6.1): given a tree's map, its
// migrations in flight, its registry shard count and its per-slot write
// rates, it says which shard to split at which slot, which adjacent pair
// to fold, and why. It does no I/O: migrator/autonomic.go feeds it from
// Redis and a LoadSource and carries its decisions out with the
// migrator's split and fold.
package autonomic
