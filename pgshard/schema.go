package pgshard

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// OwnerTable is the table in every shard schema that records, per tree, the
// slots the schema's shard owns and the map epoch that gave them, so that a
// map can be rebuilt from the nodes if Redis loses it:
//
//	CREATE TABLE lattice_sNNNN.lattice_owner (
//	    tree    text PRIMARY KEY,          -- one schema holds shard NNNN of every tree
//	    epoch   bigint NOT NULL,           -- map epoch of the record; never lowered
//	    slots   int4multirange NOT NULL,   -- owned slots, e.g. {[0,512),[1024,1536)}; {} for a pending shard
//	    updated timestamptz NOT NULL DEFAULT now()
//	)
//
// A slot s is owned when `s <@ slots`.
const OwnerTable = "lattice_owner"

// schemaLockClass is the first key of the advisory lock that serialises
// creating and dropping a shard schema (the second key is the shard index):
// CREATE SCHEMA IF NOT EXISTS races with itself, and a drop must not remove a
// schema another tree's shard is being created in.
const schemaLockClass = 0x4c617431 // "Lat1"

// schemaRE matches shard schema names and captures the index.
var schemaRE = regexp.MustCompile(`^lattice_s([0-9]{4,})$`)

// ShardTable is the quoted, qualified name of shard idx of t.
func ShardTable(t *shardmap.Tree, idx int) string {
	return pgx.Identifier{shardmap.SchemaName(idx), t.Name}.Sanitize()
}

// ShardDDL is t's DDL log with "{{table}}" replaced by shard idx's table
// and "{{schema}}" by its schema (DROP INDEX names the index by schema).
func ShardDDL(t *shardmap.Tree, idx int) []string {
	r := strings.NewReplacer("{{table}}", ShardTable(t, idx), "{{schema}}", quoteIdent(shardmap.SchemaName(idx)))
	out := make([]string, len(t.DDL))
	for i, s := range t.DDL {
		out[i] = r.Replace(s)
	}
	return out
}

// Ownership is one shard's ownership record as a node holds it.
type Ownership struct {
	Tree  string
	Shard int
	Node  string
	Epoch uint64
	Slots [][2]int // inclusive slot ranges, ascending
}

// multirange renders inclusive slot ranges as an int4multirange literal.
func multirange(slots [][2]int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, r := range slots {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "[%d,%d)", r[0], r[1]+1)
	}
	b.WriteByte('}')
	return b.String()
}

func epochParam(epoch uint64) (int64, error) {
	if epoch > math.MaxInt64 {
		return 0, fmt.Errorf("pgshard: epoch %d does not fit a bigint", epoch)
	}
	return int64(epoch), nil
}

// CreateShard creates shard idx of t on node: the schema, the table built by
// replaying t's DDL log, and the ownership record of slots at epoch. All in
// one transaction, so a table that exists is complete; running it again
// after a crash skips the DDL and only refreshes the ownership record.
func (c *Cluster) CreateShard(ctx context.Context, t *shardmap.Tree, idx int, node string, slots [][2]int, epoch uint64) error {
	ep, err := epochParam(epoch)
	if err != nil {
		return err
	}
	// A node gets its first shard of a tenant at tree creation, or as a
	// split's target (the node owning the fewest slots may own none).
	if err := c.EnsureTenant(ctx, node, t.Tenant); err != nil {
		return err
	}
	if err := c.EnsureRole(ctx, node, t.Tenant); err != nil {
		return err
	}
	if err := c.referencesFor(ctx, node, t.Tenant); err != nil {
		return err
	}
	p, err := c.Admin(ctx, node, t.Tenant)
	if err != nil {
		return err
	}
	schema := quoteIdent(shardmap.SchemaName(idx))
	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, int32(schemaLockClass), int32(idx)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, ownerTableDDL(schema)); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, ShardTable(t, idx)).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			for _, stmt := range ShardDDL(t, idx) {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("replay %q: %w", stmt, err)
				}
			}
		}
		// The control role owns the shard; the tenant's role may read and
		// write its rows, not alter it or its fence.
		if err := grantShard(ctx, tx, t.Tenant, schema, ShardTable(t, idx)); err != nil {
			return err
		}
		return upsertOwnership(ctx, tx, schema, t.Name, slots, ep)
	})
	if err != nil {
		return fmt.Errorf("pgshard: create shard %d of %s/%s on %s: %w", idx, t.Tenant, t.Name, node, err)
	}
	return nil
}

func ownerTableDDL(schema string) string {
	return "CREATE TABLE IF NOT EXISTS " + schema + "." + OwnerTable + ` (
    tree    text PRIMARY KEY,
    epoch   bigint NOT NULL,
    slots   int4multirange NOT NULL,
    updated timestamptz NOT NULL DEFAULT now()
)`
}

// upsertOwnership writes the record unless the stored one has a newer epoch:
// a slow writer holding an old map must not undo a newer one.
func upsertOwnership(ctx context.Context, tx pgx.Tx, schema, tree string, slots [][2]int, epoch int64) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.`+OwnerTable+` AS o (tree, epoch, slots, updated)
VALUES ($1, $2, $3::int4multirange, now())
ON CONFLICT (tree) DO UPDATE SET epoch = excluded.epoch, slots = excluded.slots, updated = excluded.updated
WHERE o.epoch <= excluded.epoch`, tree, epoch, multirange(slots))
	return err
}

// WriteOwnership records on node that shard idx of t owns slots at epoch.
// It never lowers the recorded epoch: a write older than the record is ignored.
func (c *Cluster) WriteOwnership(ctx context.Context, t *shardmap.Tree, idx int, node string, slots [][2]int, epoch uint64) error {
	ep, err := epochParam(epoch)
	if err != nil {
		return err
	}
	p, err := c.Admin(ctx, node, t.Tenant)
	if err != nil {
		return err
	}
	schema := quoteIdent(shardmap.SchemaName(idx))
	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error {
		return upsertOwnership(ctx, tx, schema, t.Name, slots, ep)
	})
	if err != nil {
		return fmt.Errorf("pgshard: write ownership of shard %d of %s/%s on %s: %w", idx, t.Tenant, t.Name, node, err)
	}
	return nil
}

// DropShard drops shard idx of t from node with its ownership record, and
// the schema once no tree has a shard in it. Dropping a shard that is not
// there is not an error.
func (c *Cluster) DropShard(ctx context.Context, t *shardmap.Tree, idx int, node string) error {
	p, err := c.Admin(ctx, node, t.Tenant)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, p, func(tx pgx.Tx) error { return dropShardTx(ctx, tx, t, idx) })
	if err != nil {
		return fmt.Errorf("pgshard: drop shard %d of %s/%s on %s: %w", idx, t.Tenant, t.Name, node, err)
	}
	return nil
}

// dropShardTx is DropShard inside tx.
func dropShardTx(ctx context.Context, tx pgx.Tx, t *shardmap.Tree, idx int) error {
	schema := quoteIdent(shardmap.SchemaName(idx))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, int32(schemaLockClass), int32(idx)); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "DROP TABLE IF EXISTS "+ShardTable(t, idx)); err != nil {
		return err
	}
	var hasOwner bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, schema+"."+OwnerTable).Scan(&hasOwner); err != nil {
		return err
	}
	if !hasOwner {
		return nil
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+schema+`.`+OwnerTable+` WHERE tree = $1`, t.Name); err != nil {
		return err
	}
	var others bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+schema+`.`+OwnerTable+`)`).Scan(&others); err != nil || others {
		return err
	}
	// No tree has a shard here any more; what is left (the ownership
	// table, a migration's progress table) belongs to this shard.
	_, err := tx.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	return err
}

// ReadOwnership reads the ownership records of every shard schema on every
// node for tenant, by tree, ordered by shard then node: the material to
// rebuild maps from. A node without the tenant's database holds none.
func (c *Cluster) ReadOwnership(ctx context.Context, tenant string) (map[string][]Ownership, error) {
	names := c.NodeNames()
	per := make([][]Ownership, len(names))
	idx := make(map[string]int, len(names))
	for i, n := range names {
		idx[n] = i
	}
	err := forEachNode(ctx, names, func(ctx context.Context, node string) error {
		recs, err := c.readNodeOwnership(ctx, node, tenant)
		per[idx[node]] = recs
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string][]Ownership)
	for _, recs := range per {
		for _, r := range recs {
			out[r.Tree] = append(out[r.Tree], r)
		}
	}
	for _, recs := range out {
		sort.SliceStable(recs, func(i, j int) bool { return recs[i].Shard < recs[j].Shard })
	}
	return out, nil
}

func (c *Cluster) readNodeOwnership(ctx context.Context, node, tenant string) ([]Ownership, error) {
	p, err := c.Admin(ctx, node, tenant)
	if err != nil {
		return nil, err
	}
	rows, err := p.Query(ctx, `SELECT n.nspname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = $1 AND c.relkind = 'r' AND n.nspname LIKE 'lattice\_s%'
ORDER BY 1`, OwnerTable)
	if sqlstate.Is(err, sqlstate.InvalidCatalogName) { // no such database
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: list shard schemas: %w", node, err)
	}
	schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: list shard schemas: %w", node, err)
	}
	var parts []string
	for _, s := range schemas {
		m := schemaRE.FindStringSubmatch(s)
		if m == nil {
			continue
		}
		parts = append(parts, `SELECT `+m[1]+`::int AS shard, o.tree, o.epoch, lower(r), upper(r)
FROM `+quoteIdent(s)+`.`+OwnerTable+` o LEFT JOIN LATERAL unnest(o.slots) r ON true`)
	}
	if len(parts) == 0 {
		return nil, nil
	}
	rows, err = p.Query(ctx, strings.Join(parts, "\nUNION ALL\n")+"\nORDER BY 1, 2, 4")
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: read ownership: %w", node, err)
	}
	defer rows.Close()
	var out []Ownership
	for rows.Next() {
		var (
			shard  int
			tree   string
			epoch  int64
			lo, hi *int32
		)
		if err := rows.Scan(&shard, &tree, &epoch, &lo, &hi); err != nil {
			return nil, fmt.Errorf("pgshard: node %s: read ownership: %w", node, err)
		}
		n := len(out)
		if n == 0 || out[n-1].Shard != shard || out[n-1].Tree != tree {
			out = append(out, Ownership{Tree: tree, Shard: shard, Node: node, Epoch: uint64(epoch)})
			n++
		}
		if lo != nil {
			out[n-1].Slots = append(out[n-1].Slots, [2]int{int(*lo), int(*hi) - 1})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgshard: node %s: read ownership: %w", node, err)
	}
	return out, nil
}
