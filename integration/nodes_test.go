package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/localnode"
)

var extraNodeSeq atomic.Int64

// startExtraNode starts one more PostgreSQL node the way TestMain starts
// the harness's (settings override localnode's defaults), under the harness
// dir, and stops it when the test ends. The harness's resetNodes does not
// know it: each test starts its own.
func startExtraNode(t testing.TB, name string, settings map[string]string) *localnode.Postgres {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := filepath.Join(harness.dir, fmt.Sprintf("extra-%03d-%s", extraNodeSeq.Add(1), name))
	pg, err := localnode.StartPostgres(ctx, dir, name, localnode.PostgresOptions{Fast: true, Settings: settings})
	if err != nil {
		t.Fatalf("start node %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := pg.Stop(); err != nil {
			t.Logf("stop node %s: %v", name, err)
		}
	})
	return pg
}

// nodeRow is one row of lattice_nodes().
type nodeRow struct {
	Node, DSN, State   string
	Catalog, Reachable bool
	Shards, Slots      int32
	Bytes              *int64
	Added              time.Time
}

func listNodes(t testing.TB, c *pgx.Conn) []nodeRow {
	t.Helper()
	rows, err := c.Query(context.Background(), `SELECT * FROM lattice_nodes()`)
	if err != nil {
		t.Fatalf("lattice_nodes: %v", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[nodeRow])
	if err != nil {
		t.Fatalf("lattice_nodes: %v", err)
	}
	return out
}

func nodeNames(rows []nodeRow) string {
	names := make([]string, len(rows))
	for i, r := range rows {
		names[i] = r.Node
	}
	return strings.Join(names, ",")
}

// waitNodes waits until the proxy behind c lists exactly names (comma
// separated), each reachable: lattice_nodes lists the registry, and probes
// each node through the proxy's own node set, so a node the proxy has not
// applied yet reads as unreachable.
func waitNodes(t *testing.T, c *pgx.Conn, names string) {
	t.Helper()
	pollUntil(t, 30*time.Second, "the proxy to use nodes "+names, func() (bool, error) {
		rows := listNodes(t, c)
		for _, r := range rows {
			if !r.Reachable {
				return false, nil
			}
		}
		return nodeNames(rows) == names, nil
	})
}

// TestNodeRegistryAcrossProxies adds a node through one proxy and uses it
// through another, neither restarted: a tree created afterwards places
// shards on it, both proxies read and write them, lattice_nodes reports
// them, the node cannot be removed while it holds them, and once the tree
// is dropped it is removed from both.
func TestNodeRegistryAcrossProxies(t *testing.T) {
	resetNodes(t)
	ctx := context.Background()
	n4 := startExtraNode(t, "n4", nil)
	a := startProxy(t, 2)
	b := startProxy(t, 2)
	ca := connect(t, a.DSN("lattice"))
	cb := connect(t, b.DSN("lattice"))

	if got := nodeNames(listNodes(t, cb)); got != "n1,n2" {
		t.Fatalf("nodes before = %s, want the seed n1,n2", got)
	}
	var msg string
	if err := ca.QueryRow(ctx, `SELECT lattice_add_node('n4', $1)`, n4.DSN("lattice")).Scan(&msg); err != nil {
		t.Fatalf("lattice_add_node: %v", err)
	}
	t.Log(msg)
	if got := nodeNames(listNodes(t, ca)); got != "n1,n2,n4" {
		t.Fatalf("nodes on the adding proxy right after = %s", got)
	}
	waitNodes(t, cb, "n1,n2,n4")

	// A tree created through b after the change: a third of its shards on n4.
	mustExec(t, cb, `CREATE TABLE grown (k int8 PRIMARY KEY, v text)`)
	mustExec(t, cb, `SELECT lattice_create_tree('grown', 'k', shard_count => 6)`)
	for i := 0; i < 300; i++ {
		c := ca
		if i%2 == 1 {
			c = cb
		}
		mustExec(t, c, `INSERT INTO grown VALUES ($1, $2)`, i, fmt.Sprint("v", i))
	}
	for _, c := range []*pgx.Conn{ca, cb} {
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM grown`).Scan(&n); err != nil || n != 300 {
			t.Fatalf("count through a proxy = %d, %v; want 300", n, err)
		}
	}
	direct := connect(t, n4.DSN("lattice"))
	var onN4 int
	if err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'lattice\_s%'`).Scan(&onN4); err != nil || onN4 != 2 {
		t.Fatalf("shard schemas on n4 = %d, %v; want 2", onN4, err)
	}

	rows := listNodes(t, cb)
	for _, r := range rows {
		// 4096 slots over 6 shards: 682 or 683 each, two shards per node.
		if !r.Reachable || r.State != "active" || r.Shards != 2 || r.Slots < 1364 || r.Slots > 1366 {
			t.Errorf("lattice_nodes row %+v", r)
		}
		if r.Bytes == nil || *r.Bytes <= 0 {
			t.Errorf("node %s: bytes %v, want > 0", r.Node, r.Bytes)
		}
		if r.Catalog != (r.Node == "n1") {
			t.Errorf("node %s: catalog = %v", r.Node, r.Catalog)
		}
		if strings.Contains(r.DSN, "password") {
			t.Errorf("node %s: DSN %q shows a password", r.Node, r.DSN)
		}
	}
	// It composes like lattice_shards.
	var total int64
	if err := cb.QueryRow(ctx, `SELECT sum(slots) FROM lattice_nodes() n WHERE n.reachable`).Scan(&total); err != nil || total != 4096 {
		t.Fatalf("composed sum(slots) = %d, %v", total, err)
	}

	_, err := cb.Exec(ctx, `SELECT lattice_remove_node('n4')`)
	if sqlState(err) != "55000" || !strings.Contains(err.Error(), "holds 2 shards") {
		t.Fatalf("remove of a node with shards: %v, want 55000", err)
	}
	if got := nodeNames(listNodes(t, ca)); got != "n1,n2,n4" {
		t.Fatalf("a refused removal changed the nodes: %s", got)
	}

	mustExec(t, ca, `DROP TABLE grown`)
	if _, err := cb.Exec(ctx, `SELECT lattice_remove_node('n4')`); err != nil {
		t.Fatalf("remove of an empty node: %v", err)
	}
	if got := nodeNames(listNodes(t, cb)); got != "n1,n2" {
		t.Fatalf("nodes on the removing proxy right after = %s", got)
	}
	waitNodes(t, ca, "n1,n2")
	// Trees created now use n1 and n2 only.
	mustExec(t, ca, `CREATE TABLE after (k int8 PRIMARY KEY)`)
	mustExec(t, ca, `SELECT lattice_create_tree('after', 'k', shard_count => 4)`)
	var nodes string
	if err := cb.QueryRow(ctx, `SELECT string_agg(DISTINCT node, ',' ORDER BY node) FROM lattice_shards('after')`).Scan(&nodes); err != nil || nodes != "n1,n2" {
		t.Fatalf("shards of a tree created after the removal on %q, %v", nodes, err)
	}
}
