package pgshard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// What `lattice recover-map` reads from the nodes: the material a tree's
// registry entry and map are rebuilt from (docs/DESIGN.md section 17).

// Databases lists the databases of the catalog node that may be tenants.
func (c *Cluster) Databases(ctx context.Context) ([]string, error) {
	p, err := c.Admin(ctx, c.Catalog().Name, c.DefaultTenant())
	if err != nil {
		return nil, err
	}
	rows, err := p.Query(ctx, `SELECT datname FROM pg_catalog.pg_database WHERE datallowconn AND NOT datistemplate ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("pgshard: list databases of the catalog node: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// NodeTree is a tree as the catalog node shows it: the registry entry
// rebuilt from its template and its TreesTable row.
type NodeTree struct {
	Tree *shardmap.Tree
	// Record is the TreesTable row; nil for a tree created before it
	// existed, whose key column is then its one-column primary key.
	Record *TreeRecord
}

// ReadTrees rebuilds the registry entry of every tree of tenant from the
// catalog node: a table of public whose template fence is on it. Its DDL
// log is the template's definition as it is now, which is what every
// shard table has (docs/DESIGN.md section 14, invariant 13).
func (c *Cluster) ReadTrees(ctx context.Context, tenant string) ([]NodeTree, error) {
	conn, err := c.connect(ctx, c.Catalog().Name, tenant)
	if err != nil {
		return nil, err
	}
	defer closeConn(conn)
	var out []NodeTree
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT c.relname FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE t.tgname = $1 AND n.nspname = 'public' ORDER BY 1`, fenceTrigger)
		if err != nil {
			return err
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		recs, err := readTreeRecords(ctx, tx)
		if err != nil {
			return err
		}
		for _, name := range names {
			nt, err := nodeTree(ctx, tx, tenant, name, recs[name])
			if err != nil {
				return fmt.Errorf("tree %s: %w", name, err)
			}
			out = append(out, nt)
		}
		// The tree a group is named after is in it when any member names it.
		groups := map[string]bool{}
		for _, nt := range out {
			groups[nt.Tree.Group] = nt.Tree.Group != ""
		}
		for _, nt := range out {
			if groups[nt.Tree.Name] {
				nt.Tree.Group = nt.Tree.Name
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgshard: read the trees of %s from the catalog node: %w", tenant, err)
	}
	return out, nil
}

func readTreeRecords(ctx context.Context, tx pgx.Tx) (map[string]*TreeRecord, error) {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, TreesTable).Scan(&exists); err != nil || !exists {
		return nil, err
	}
	// The group through to_jsonb: a table made before the column was added
	// has none.
	rows, err := tx.Query(ctx, `SELECT tree, key_column, slot_count, created, epoch_ceiling, high_water,
    coalesce(to_jsonb(r) ->> 'colocation_group', '') FROM `+TreesTable+` r`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]*TreeRecord{}
	for rows.Next() {
		r := new(TreeRecord)
		var ceiling int64
		if err := rows.Scan(&r.Tree, &r.KeyColumn, &r.SlotCount, &r.Created, &ceiling, &r.HighWater, &r.Group); err != nil {
			return nil, err
		}
		r.EpochCeiling = uint64(ceiling)
		r.Created = r.Created.UTC()
		out[r.Tree] = r
	}
	return out, rows.Err()
}

func nodeTree(ctx context.Context, tx pgx.Tx, tenant, name string, rec *TreeRecord) (NodeTree, error) {
	ti, err := inspectTable(ctx, tx, name)
	if err != nil {
		return NodeTree{}, err
	}
	ddl, err := buildDDL(ti)
	if err != nil {
		return NodeTree{}, err
	}
	// buildDDL leaves foreign keys out: their targets are rendered per
	// shard, as the DDL log had them.
	fks, err := templateForeignKeys(ctx, tx, ti)
	if err != nil {
		return NodeTree{}, err
	}
	for _, fk := range fks {
		ddl = append(ddl, foreignKeyStatement(fk.con, fk.to))
	}
	t := &shardmap.Tree{Tenant: tenant, Name: name, DDL: ddl}
	for _, col := range ti.Columns {
		t.Columns = append(t.Columns, col.Name)
	}
	if rec != nil {
		t.KeyColumn, t.SlotCount, t.Created, t.Group = rec.KeyColumn, rec.SlotCount, rec.Created, rec.Group
	} else if t.KeyColumn, err = primaryKeyColumn(ti); err != nil {
		return NodeTree{}, err
	}
	for _, col := range ti.Columns {
		if col.Name == t.KeyColumn {
			if t.KeyType, err = shardmap.KeyTypeFor(col.Type); err != nil {
				return NodeTree{}, err
			}
		}
	}
	if t.KeyType == "" {
		return NodeTree{}, fmt.Errorf("the template has no key column %q", t.KeyColumn)
	}
	return NodeTree{Tree: t, Record: rec}, nil
}

// primaryKeyColumn is the key of a tree without a TreesTable row: its
// primary key's column, when it has one only.
func primaryKeyColumn(ti *tableInfo) (string, error) {
	for _, ix := range ti.Indexes {
		if !ix.Primary {
			continue
		}
		if len(ix.Keys) == 1 {
			for _, col := range ti.Columns {
				if col.Num == ix.Keys[0] {
					return col.Name, nil
				}
			}
		}
		break
	}
	return "", errors.New("no record of its shard key on the catalog node, and its primary key is not one column")
}

// Moving is one MovingTable row: the slots a migration's armed fence took
// from the source shard's ownership record.
type Moving struct {
	Migration  string
	Tree       string
	Kind       string
	Source     int
	SourceNode string
	Slots      [][2]int
	Target     int
	TargetNode string
}

// ReadMoving reads every MovingTable row of tenant on every node.
func (c *Cluster) ReadMoving(ctx context.Context, tenant string) ([]Moving, error) {
	names := c.NodeNames()
	per := make([][]Moving, len(names))
	err := forEachNode(ctx, names, func(ctx context.Context, node string) error {
		recs, err := c.readNodeMoving(ctx, node, tenant)
		per[indexOf(names, node)] = recs
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []Moving
	for _, recs := range per {
		out = append(out, recs...)
	}
	return out, nil
}

func indexOf(names []string, name string) int {
	for i, n := range names {
		if n == name {
			return i
		}
	}
	return -1
}

func (c *Cluster) readNodeMoving(ctx context.Context, node, tenant string) ([]Moving, error) {
	p, err := c.Admin(ctx, node, tenant)
	if err != nil {
		return nil, err
	}
	schemas, err := shardSchemasWith(ctx, p.Query, MovingTable)
	if sqlstate.Is(err, sqlstate.InvalidCatalogName) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: %w", node, err)
	}
	var out []Moving
	for idx, schema := range schemas {
		rows, err := p.Query(ctx, `SELECT migration, tree, kind, target, target_node, lower(r), upper(r)
FROM `+quoteIdent(schema)+`.`+MovingTable+` m LEFT JOIN LATERAL unnest(m.slots) r ON true ORDER BY 1, 2, 6`)
		if err != nil {
			return nil, fmt.Errorf("pgshard: node %s: read %s.%s: %w", node, schema, MovingTable, err)
		}
		for rows.Next() {
			var mv Moving
			var lo, hi *int32
			if err := rows.Scan(&mv.Migration, &mv.Tree, &mv.Kind, &mv.Target, &mv.TargetNode, &lo, &hi); err != nil {
				rows.Close()
				return nil, err
			}
			if n := len(out); n == 0 || out[n-1].Migration != mv.Migration || out[n-1].Tree != mv.Tree || out[n-1].Source != idx {
				mv.Source, mv.SourceNode = idx, node
				out = append(out, mv)
			}
			if lo != nil {
				last := &out[len(out)-1]
				last.Slots = append(last.Slots, [2]int{int(*lo), int(*hi) - 1})
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// shardSchemasWith lists the shard schemas that hold table, by index.
func shardSchemasWith(ctx context.Context, query func(context.Context, string, ...any) (pgx.Rows, error), table string) (map[int]string, error) {
	rows, err := query(ctx, `SELECT n.nspname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = $1 AND c.relkind = 'r' AND n.nspname LIKE 'lattice\_s%'`, table)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, s := range names {
		if m := schemaRE.FindStringSubmatch(s); m != nil {
			idx, err := strconv.Atoi(m[1])
			if err == nil {
				out[idx] = s
			}
		}
	}
	return out, nil
}

// MigrationObject is what a migration made on a node, found by its name:
// a replication slot, a publication (with the shard table it publishes),
// or a progress row in a target schema.
type MigrationObject struct {
	Migration string // the id in lattice_m_<id>
	Node      string
	Kind      string // "slot", "publication" or "progress"
	Shard     int    // the publication's source shard, the progress row's target; -1 for a slot
	Tree      string // the publication's table; "" otherwise
	Active    bool   // a slot a walsender streams from
}

// ReadMigrationObjects lists the migrations' objects of tenant on every
// node.
func (c *Cluster) ReadMigrationObjects(ctx context.Context, tenant string) ([]MigrationObject, error) {
	names := c.NodeNames()
	per := make([][]MigrationObject, len(names))
	err := forEachNode(ctx, names, func(ctx context.Context, node string) error {
		objs, err := c.readNodeMigrationObjects(ctx, node, tenant)
		per[indexOf(names, node)] = objs
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []MigrationObject
	for _, o := range per {
		out = append(out, o...)
	}
	return out, nil
}

func (c *Cluster) readNodeMigrationObjects(ctx context.Context, node, tenant string) ([]MigrationObject, error) {
	p, err := c.Admin(ctx, node, tenant)
	if err != nil {
		return nil, err
	}
	var out []MigrationObject
	rows, err := p.Query(ctx, `SELECT substr(slot_name, 11), active FROM pg_catalog.pg_replication_slots
WHERE slot_name LIKE 'lattice\_m\_%' AND database = current_database() ORDER BY 1`)
	if sqlstate.Is(err, sqlstate.InvalidCatalogName) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: replication slots: %w", node, err)
	}
	for rows.Next() {
		o := MigrationObject{Node: node, Kind: "slot", Shard: -1}
		if err := rows.Scan(&o.Migration, &o.Active); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, o)
	}
	rows.Close()
	rows, err = p.Query(ctx, `SELECT substr(p.pubname, 11), coalesce(t.schemaname, ''), coalesce(t.tablename, '')
FROM pg_catalog.pg_publication p LEFT JOIN pg_catalog.pg_publication_tables t ON t.pubname = p.pubname
WHERE p.pubname LIKE 'lattice\_m\_%' ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: publications: %w", node, err)
	}
	for rows.Next() {
		o := MigrationObject{Node: node, Kind: "publication", Shard: -1}
		var schema string
		if err := rows.Scan(&o.Migration, &schema, &o.Tree); err != nil {
			rows.Close()
			return nil, err
		}
		if m := schemaRE.FindStringSubmatch(schema); m != nil {
			o.Shard, _ = strconv.Atoi(m[1])
		}
		out = append(out, o)
	}
	rows.Close()
	schemas, err := shardSchemasWith(ctx, p.Query, "lattice_progress")
	if err != nil {
		return nil, fmt.Errorf("pgshard: node %s: progress tables: %w", node, err)
	}
	idxs := make([]int, 0, len(schemas))
	for idx := range schemas {
		idxs = append(idxs, idx)
	}
	sort.Ints(idxs)
	for _, idx := range idxs {
		rows, err := p.Query(ctx, `SELECT migration FROM `+quoteIdent(schemas[idx])+`.lattice_progress ORDER BY 1`)
		if err != nil {
			return nil, fmt.Errorf("pgshard: node %s: progress rows: %w", node, err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			out = append(out, MigrationObject{Migration: id, Node: node, Kind: "progress", Shard: idx})
		}
	}
	return out, nil
}

// EndMigrators ends the walsenders that stream from tenant's migration
// slots on every node, and returns how many it ended: a migrator whose
// records Redis lost must not go on beside a recovery.
func (c *Cluster) EndMigrators(ctx context.Context, tenant string) (int, error) {
	var mu sync.Mutex
	total := 0
	err := forEachNode(ctx, c.NodeNames(), func(ctx context.Context, node string) error {
		p, err := c.Admin(ctx, node, tenant)
		if err != nil {
			return err
		}
		var n int
		err = p.QueryRow(ctx, `SELECT count(pg_terminate_backend(active_pid)) FROM pg_catalog.pg_replication_slots
WHERE slot_name LIKE 'lattice\_m\_%' AND database = current_database() AND active_pid IS NOT NULL`).Scan(&n)
		if sqlstate.Is(err, sqlstate.InvalidCatalogName) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("pgshard: node %s: end migrators: %w", node, err)
		}
		mu.Lock()
		total += n
		mu.Unlock()
		return nil
	})
	return total, err
}

// ComplementSlots is every slot of [0, slotCount) outside ranges, as
// inclusive ranges.
func ComplementSlots(ranges [][2]int, slotCount int) [][2]int {
	own := make([]bool, slotCount)
	for _, r := range ranges {
		for s := r[0]; s <= r[1] && s < slotCount; s++ {
			own[s] = true
		}
	}
	var out [][2]int
	for s := 0; s < slotCount; s++ {
		if own[s] {
			continue
		}
		if n := len(out); n > 0 && out[n-1][1] == s-1 {
			out[n-1][1] = s
		} else {
			out = append(out, [2]int{s, s})
		}
	}
	return out
}

// Deployments lists the deployment ids that the presence sessions of
// running proxies carry on the nodes (PresenceName), for `lattice
// recover-map` to give Redis back the id its proxies still use.
func (c *Cluster) Deployments(ctx context.Context) ([]string, error) {
	names := c.NodeNames()
	per := make([][]string, len(names))
	err := forEachNode(ctx, names, func(ctx context.Context, node string) error {
		p, err := c.Admin(ctx, node, c.DefaultTenant())
		if err != nil {
			return err
		}
		rows, err := p.Query(ctx, `SELECT DISTINCT split_part(substr(application_name, $2), '/', 1)
FROM pg_catalog.pg_stat_activity WHERE application_name LIKE $1 ORDER BY 1`, presencePrefix+"%/%", len(presencePrefix)+1)
		if err != nil {
			return fmt.Errorf("pgshard: node %s: presence sessions: %w", node, err)
		}
		per[indexOf(names, node)], err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ids := range per {
		for _, id := range ids {
			if id != "" && !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}
