package migrator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// NodeRegistry is the store of the deployment's nodes; shardmap.RedisStore
// implements it.
type NodeRegistry interface {
	shardmap.NodeStore
	TenantsWithTrees(ctx context.Context) ([]string, error)
}

// NodeAdmin is what lattice_add_node, lattice_nodes and lattice_remove_node
// need beyond the functions' own wiring.
type NodeAdmin struct {
	Registry NodeRegistry
	// Watch applies the registry to this proxy; a change is reloaded at
	// once, so that the caller's next statement already sees it.
	Watch *shardmap.NodeWatch
	// Requirements a new node must meet.
	Requirements pgshard.NodeRequirements
}

// SetNodeAdmin enables the node functions.
func (f *Functions) SetNodeAdmin(a NodeAdmin) { f.nodes = &a }

func nodeField(name string, oid uint32, size int16) pgproto3.FieldDescription {
	return pgproto3.FieldDescription{Name: []byte(name), DataTypeOID: oid, DataTypeSize: size, TypeModifier: -1}
}

func init() {
	maps.Copy(signatures, map[string][]pgproto3.FieldDescription{
		"lattice_add_node":    {field("lattice_add_node", pgtype.TextOID)},
		"lattice_remove_node": {field("lattice_remove_node", pgtype.TextOID)},
		"lattice_nodes": {
			field("node", pgtype.TextOID), field("dsn", pgtype.TextOID), field("state", pgtype.TextOID),
			nodeField("catalog", pgtype.BoolOID, 1), nodeField("reachable", pgtype.BoolOID, 1),
			field("shards", pgtype.Int4OID), field("slots", pgtype.Int4OID), field("bytes", pgtype.Int8OID),
			nodeField("added", pgtype.TimestamptzOID, 8),
		},
	})
	maps.Copy(argNames, map[string][]string{
		"lattice_add_node":    {"name", "dsn"},
		"lattice_remove_node": {"name"},
	})
}

// callNode runs a node function; ok is false for any other name.
func (f *Functions) callNode(ctx context.Context, tenant, name string, args []*string, named map[string]*string) (rows [][]any, ok bool, err error) {
	switch name {
	case "lattice_add_node", "lattice_remove_node", "lattice_nodes":
	default:
		return nil, false, nil
	}
	if f.nodes == nil {
		return nil, true, sqlstate.New(sqlstate.FeatureNotSupported, "%s is not available in this process", name)
	}
	a, err := bindArgs(name, args, named, argNames[name]...)
	if err != nil {
		return nil, true, err
	}
	switch name {
	case "lattice_add_node":
		n, err := required(a, "name")
		if err != nil {
			return nil, true, err
		}
		dsn, err := required(a, "dsn")
		if err != nil {
			return nil, true, err
		}
		msg, err := f.AddNode(ctx, tenant, n, dsn)
		if err != nil {
			return nil, true, err
		}
		return [][]any{{msg}}, true, nil
	case "lattice_remove_node":
		n, err := required(a, "name")
		if err != nil {
			return nil, true, err
		}
		msg, err := f.RemoveNode(ctx, n)
		if err != nil {
			return nil, true, err
		}
		return [][]any{{msg}}, true, nil
	}
	infos, err := f.Nodes(ctx, tenant)
	if err != nil {
		return nil, true, err
	}
	rows = make([][]any, len(infos))
	for i, n := range infos {
		var bytes any // NULL when the node did not answer
		if n.Reachable {
			bytes = n.Bytes
		}
		rows[i] = []any{n.Name, n.DSN, string(n.State), n.Catalog, n.Reachable, int32(n.Shards), int32(n.Slots), bytes, n.Added}
	}
	return rows, true, nil
}

// NodeInfo is one node as lattice_nodes and the admin API show it, for
// one tenant's trees.
type NodeInfo struct {
	Name      string             `json:"name"`
	DSN       string             `json:"dsn"`
	State     shardmap.NodeState `json:"state"`
	Catalog   bool               `json:"catalog"`
	Reachable bool               `json:"reachable"`
	Shards    int                `json:"shards"` // active and pending shards of the tenant's trees
	Slots     int                `json:"slots"`  // slots those shards own
	Bytes     int64              `json:"bytes"`  // the tenant's shard tables on disk
	Added     time.Time          `json:"added"`
}

// Nodes lists the registry's nodes in order (the catalog node first) with
// tenant's shards and slots on each, their bytes, and whether the node
// answers now.
func (f *Functions) Nodes(ctx context.Context, tenant string) ([]NodeInfo, error) {
	if f.nodes == nil {
		return nil, sqlstate.New(sqlstate.FeatureNotSupported, "the node registry is not available in this process")
	}
	reg, err := f.nodes.Registry.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	shards, slots, err := f.placement(ctx, []string{tenant})
	if err != nil {
		return nil, err
	}
	usage := f.cluster.Usage(ctx, tenant)
	out := make([]NodeInfo, len(reg.Nodes))
	for i, e := range reg.Nodes {
		u := usage[e.Name] // a node this proxy has not applied yet reads as unreachable
		out[i] = NodeInfo{Name: e.Name, DSN: e.DSN, State: e.State, Catalog: i == 0, Reachable: u.Reachable,
			Shards: shards[e.Name], Slots: slots[e.Name], Bytes: u.Bytes, Added: e.Added}
	}
	return out, nil
}

// placement counts, per node, the active and pending shards of the
// tenants' trees and the slots they own. Retired shards own no slot and
// hold no row: they are tombstones in the map only.
func (f *Functions) placement(ctx context.Context, tenants []string) (shards, slots map[string]int, err error) {
	shards, slots = map[string]int{}, map[string]int{}
	for _, tenant := range tenants {
		trees, err := f.store.Trees(ctx, tenant)
		if err != nil {
			return nil, nil, err
		}
		for _, t := range trees {
			m, err := f.store.Map(ctx, tenant, t.MapName())
			if errors.Is(err, shardmap.ErrNotFound) {
				continue // dropped meanwhile
			}
			if err != nil {
				return nil, nil, err
			}
			for _, sh := range m.Shards {
				if sh.State != shardmap.ShardRetired {
					shards[sh.Node]++
				}
			}
			for _, idx := range m.Slots {
				slots[m.Shards[idx].Node]++
			}
		}
	}
	return shards, slots, nil
}

// migratingNodes lists the nodes that migrations in flight of the
// tenants' trees read from or write to.
func (f *Functions) migratingNodes(ctx context.Context, tenants []string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, tenant := range tenants {
		trees, err := f.store.Trees(ctx, tenant)
		if err != nil {
			return nil, err
		}
		for _, t := range trees {
			migs, err := f.store.Migrations(ctx, tenant, t.MapName())
			if err != nil {
				return nil, err
			}
			for _, m := range migs {
				if m.Phase != shardmap.PhaseDone {
					out[m.SourceNode], out[m.TargetNode] = true, true
				}
			}
		}
	}
	return out, nil
}

// nodeName is a registry name: lower case, as an unquoted identifier
// folds, short enough for a label in every log line and metric.
var nodeName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// AddNode checks the server at dsn and adds it to the registry as name. It
// refuses a bad name, a DSN with a password, a name or a server the
// registry has, and a server that fails pgshard.Cluster.CheckNode; nothing
// changes then. tenant is the caller's: its database is created on the
// node, as every other tenant's with trees is.
func (f *Functions) AddNode(ctx context.Context, tenant, name, dsn string) (string, error) {
	if f.nodes == nil {
		return "", sqlstate.New(sqlstate.FeatureNotSupported, "the node registry is not available in this process")
	}
	if !nodeName.MatchString(name) {
		return "", sqlstate.New(sqlstate.InvalidParameterValue, "invalid node name %q", name).
			WithHint("use 1 to 63 lower-case letters, digits, '_' or '-', starting with a letter or digit")
	}
	clean, _, secret, err := pgshard.SplitPassword(dsn)
	if err != nil {
		return "", sqlstate.New(sqlstate.InvalidParameterValue, "node %s: %v", name, err).
			WithHint("give a DSN as postgres://user@host:port/database or host=... port=... user=... dbname=...")
	}
	if secret {
		return "", sqlstate.New(sqlstate.InvalidParameterValue, "the DSN of node %s carries a password; the node registry never stores one", name).
			WithHint("give the DSN without the password (%s), and put the password in the --pgpass file of every proxy (host:port:database:user:password) or in PGPASSWORD", redactedHint(clean))
	}
	cfg, err := pgconn.ParseConfig(clean)
	if err != nil {
		return "", sqlstate.New(sqlstate.InvalidParameterValue, "node %s: %v", name, err).
			WithHint("give a DSN as postgres://user@host:port/database or host=... port=... user=... dbname=...")
	}
	reg, err := f.nodes.Registry.Nodes(ctx)
	if err != nil {
		return "", err
	}
	if err := duplicate(reg, name, cfg); err != nil {
		return "", err
	}
	tenants, err := f.nodes.Registry.TenantsWithTrees(ctx)
	if err != nil {
		return "", err
	}
	if !slices.Contains(tenants, tenant) {
		tenants = append(tenants, tenant)
	}
	if err := f.cluster.CheckNode(ctx, pgshard.Node{Name: name, DSN: clean}, tenants, f.nodes.Requirements); err != nil {
		return "", err
	}
	next, err := shardmap.UpdateNodes(ctx, f.nodes.Registry, func(n *shardmap.Nodes) error {
		if err := duplicate(n, name, cfg); err != nil {
			return err
		}
		n.Nodes = append(n.Nodes, shardmap.NodeEntry{Name: name, DSN: clean, State: shardmap.NodeActive, Added: time.Now().UTC()})
		return nil
	})
	if err != nil {
		return "", err
	}
	if err := f.nodes.Watch.Reload(ctx); err != nil {
		return "", fmt.Errorf("node %s added (registry version %d), but this proxy did not apply it yet: %w", name, next.Version, err)
	}
	return fmt.Sprintf("node %s added: %d nodes, registry version %d", name, len(next.Nodes), next.Version), nil
}

// redactedHint shows a cleaned DSN in a hint, bounded.
func redactedHint(dsn string) string {
	if len(dsn) > 200 {
		return dsn[:200] + "..."
	}
	return dsn
}

// duplicate refuses a name the registry has, or a server (host and port)
// one of its nodes already is: two names for one server would let a shard
// "move" onto the node it is on.
func duplicate(reg *shardmap.Nodes, name string, cfg *pgconn.Config) error {
	for _, e := range reg.Nodes {
		if e.Name == name {
			return sqlstate.New(sqlstate.DuplicateObject, "node %s already exists", name).
				WithHint("choose another name, or see the nodes with SELECT * FROM lattice_nodes()")
		}
		other, err := pgconn.ParseConfig(e.DSN)
		if err == nil && other.Host == cfg.Host && other.Port == cfg.Port {
			return sqlstate.New(sqlstate.DuplicateObject, "the server at %s:%d is node %s already", cfg.Host, cfg.Port, e.Name).
				WithHint("a server joins once; each node must be a separate PostgreSQL server")
		}
	}
	return nil
}

// RemoveNode takes name out of the registry. It is refused (55000) for the
// catalog node, and while any shard of any tenant's tree, or a migration in
// flight, is on it. Its copies of reference tables, which only its shards
// needed, are released first (releaseReferences).
func (f *Functions) RemoveNode(ctx context.Context, name string) (string, error) {
	if f.nodes == nil {
		return "", sqlstate.New(sqlstate.FeatureNotSupported, "the node registry is not available in this process")
	}
	reg, err := f.nodes.Registry.Nodes(ctx)
	if err != nil {
		return "", err
	}
	pos := slices.IndexFunc(reg.Nodes, func(e shardmap.NodeEntry) bool { return e.Name == name })
	if pos < 0 {
		return "", sqlstate.New(sqlstate.UndefinedObject, "node %s does not exist", name).
			WithHint("see the nodes with SELECT * FROM lattice_nodes()")
	}
	if pos == 0 {
		return "", sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "node %s is the catalog node and cannot be removed", name).
			WithHint("the catalog node holds every ordinary table; to replace its server, promote a physical replica behind the same DSN (see the README)")
	}
	if err := f.holds(ctx, name); err != nil {
		return "", err
	}
	if err := f.releaseReferences(ctx, name); err != nil {
		return "", err
	}
	removed := reg.Nodes[pos]
	next, err := shardmap.UpdateNodes(ctx, f.nodes.Registry, func(n *shardmap.Nodes) error {
		n.Nodes = slices.DeleteFunc(n.Nodes, func(e shardmap.NodeEntry) bool { return e.Name == name })
		return nil
	})
	if err != nil {
		return "", err
	}
	// A tree created, or a migration started, on another proxy between the
	// check and the write may have placed a shard there: look again, and
	// put the node back if so, rather than leave a shard on a node no
	// proxy knows.
	if err := f.holds(ctx, name); err != nil {
		if _, rerr := shardmap.UpdateNodes(ctx, f.nodes.Registry, func(n *shardmap.Nodes) error {
			if _, ok := n.Node(name); !ok {
				n.Nodes = append(n.Nodes, removed)
			}
			return nil
		}); rerr != nil {
			return "", errors.Join(err, fmt.Errorf("putting node %s back failed: %w", name, rerr))
		}
		_ = f.nodes.Watch.Reload(ctx)
		return "", errors.Join(err, f.restoreReferences(ctx, name))
	}
	if err := f.nodes.Watch.Reload(ctx); err != nil {
		return "", fmt.Errorf("node %s removed (registry version %d), but this proxy did not apply it yet: %w", name, next.Version, err)
	}
	return fmt.Sprintf("node %s removed: %d nodes, registry version %d", name, len(next.Nodes), next.Version), nil
}

// holds refuses (55000) while a shard or a migration of any tenant is on node.
func (f *Functions) holds(ctx context.Context, node string) error {
	tenants, err := f.nodes.Registry.TenantsWithTrees(ctx)
	if err != nil {
		return err
	}
	shards, slots, err := f.placement(ctx, tenants)
	if err != nil {
		return err
	}
	if shards[node] > 0 {
		return sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "node %s holds %d shards (%d slots) and cannot be removed", node, shards[node], slots[node]).
			WithHint("move its shards off first: SELECT lattice_drain_node('%s'), then wait for lattice_drain_complete('%s')", node, node)
	}
	migrating, err := f.migratingNodes(ctx, tenants)
	if err != nil {
		return err
	}
	if migrating[node] {
		return sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "a migration in flight uses node %s, which cannot be removed now", node).
			WithHint("wait for the running reshard or move to finish (lattice_reshard_status), then remove the node")
	}
	return nil
}
