package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/localnode"
	"github.com/lattice-db/lattice/pgshard"
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
	pg, err := localnode.StartPostgres(ctx, dir, name, localnode.PostgresOptions{Fast: true, Settings: settings, Template: nodeTemplate()})
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
	// A proxy started now with other --node flags follows the registry: the
	// flags seed it only when it is empty.
	late := startProxy(t, 3)
	waitNodes(t, connect(t, late.DSN("lattice")), "n1,n2,n4")

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

// TestAddNodeBadInput: each bad lattice_add_node or lattice_remove_node
// gets its own SQLSTATE and a hint, and the registry does not change.
func TestAddNodeBadInput(t *testing.T) {
	resetNodes(t)
	ctx := context.Background()
	replica := startExtraNode(t, "replica", map[string]string{"wal_level": "replica", "max_wal_senders": "10"})
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE held (k int8 PRIMARY KEY)`)
	mustExec(t, c, `SELECT lattice_create_tree('held', 'k', shard_count => 2)`)

	free, err := localnode.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	n2 := testNode(t, 1)
	withPassword := strings.Replace(replica.DSN("lattice"), "lattice@", "lattice:s3cret@", 1)
	for _, tc := range []struct {
		name, sql string
		args      []any
		code      string
		message   string // part of the message
		hint      string // part of the hint
	}{
		{"password in the DSN", `SELECT lattice_add_node('n9', $1)`, []any{withPassword},
			"22023", "carries a password", "--pgpass"},
		{"password keyword", `SELECT lattice_add_node('n9', $1)`, []any{fmt.Sprintf("host=127.0.0.1 port=%d user=lattice password=x dbname=lattice", replica.Port)},
			"22023", "carries a password", "--pgpass"},
		{"unreachable", `SELECT lattice_add_node('n9', $1)`, []any{fmt.Sprintf("postgres://lattice@127.0.0.1:%d/lattice?sslmode=disable", free)},
			"08001", "cannot connect to node n9", "server runs"},
		{"wal_level=replica", `SELECT lattice_add_node('n9', $1)`, []any{replica.DSN("lattice")},
			"55000", "wal_level=replica", "wal_level = logical"},
		{"duplicate name", `SELECT lattice_add_node('n2', $1)`, []any{replica.DSN("lattice")},
			"42710", "node n2 already exists", "another name"},
		{"server already a node", `SELECT lattice_add_node('n9', $1)`, []any{n2.DSN("lattice")},
			"42710", "is node n2 already", "separate PostgreSQL server"},
		{"bad name", `SELECT lattice_add_node('N 9', $1)`, []any{replica.DSN("lattice")},
			"22023", "invalid node name", "lower-case"},
		{"remove a node with shards", `SELECT lattice_remove_node('n2')`, nil,
			"55000", "holds 1 shards", "lattice_drain_node"},
		{"remove the catalog node", `SELECT lattice_remove_node('n1')`, nil,
			"55000", "catalog node", "physical replica"},
		{"remove an unknown node", `SELECT lattice_remove_node('n9')`, nil,
			"42704", "does not exist", "lattice_nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Exec(ctx, tc.sql, tc.args...)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				t.Fatalf("err = %v, want SQLSTATE %s", err, tc.code)
			}
			if pgErr.Code != tc.code || !strings.Contains(pgErr.Message, tc.message) || !strings.Contains(pgErr.Hint, tc.hint) {
				t.Fatalf("got %s %q (hint %q), want %s with %q and a hint with %q", pgErr.Code, pgErr.Message, pgErr.Hint, tc.code, tc.message, tc.hint)
			}
			if strings.Contains(pgErr.Message+pgErr.Hint, "s3cret") {
				t.Fatalf("the error repeats the password: %q / %q", pgErr.Message, pgErr.Hint)
			}
			if got := nodeNames(listNodes(t, c)); got != "n1,n2" {
				t.Fatalf("nodes after a refused call = %s, want n1,n2", got)
			}
		})
	}
	// Nothing reached Redis with a password, either.
	rc, err := redisClient(testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	raw, err := rc.HGet(ctx, "lattice:nodes", "nodes").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(raw, "s3cret") || strings.Contains(raw, "password") {
		t.Fatalf("the registry holds a password: %s", raw)
	}
}

// TestNodePoolsFollowRegistry: a session's open transaction spans a node's
// addition and removal undisturbed and commits across nodes, and once the
// node is removed the proxies hold no session on it (request pools,
// control pools and presence sessions all closed), without a restart.
func TestNodePoolsFollowRegistry(t *testing.T) {
	resetNodes(t)
	ctx := context.Background()
	n4 := startExtraNode(t, "n4", nil)
	a := startProxy(t, 2)
	b := startProxy(t, 2)
	ca := connect(t, a.DSN("lattice"))
	cb := connect(t, b.DSN("lattice"))
	mustExec(t, ca, `CREATE TABLE spans (k int8 PRIMARY KEY, v text)`)
	mustExec(t, ca, `SELECT lattice_create_tree('spans', 'k', shard_count => 4)`)

	// The session in flight: a transaction with backends on n1 and n2.
	inflight := connect(t, b.DSN("lattice"))
	mustExec(t, inflight, `BEGIN`)
	for i := 0; i < 20; i++ {
		mustExec(t, inflight, `INSERT INTO spans VALUES ($1, 'in flight')`, i)
	}

	mustExec(t, ca, `SELECT lattice_add_node('n4', $1)`, n4.DSN("lattice"))
	waitNodes(t, cb, "n1,n2,n4")
	// Both proxies use n4: a tree on it, read and written through each.
	mustExec(t, cb, `CREATE TABLE onfour (k int8 PRIMARY KEY)`)
	mustExec(t, cb, `SELECT lattice_create_tree('onfour', 'k', shard_count => 3)`)
	for i := 0; i < 30; i++ {
		mustExec(t, []*pgx.Conn{ca, cb}[i%2], `INSERT INTO onfour VALUES ($1)`, i)
	}
	direct := connect(t, n4.DSN("lattice"))
	sessions := func() (int, error) {
		var n int
		err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n)
		return n, err
	}
	if n, err := sessions(); err != nil || n == 0 {
		t.Fatalf("sessions on n4 while it serves = %d, %v; want some", n, err)
	}

	mustExec(t, inflight, `INSERT INTO spans VALUES (100, 'after the add')`)
	mustExec(t, ca, `DROP TABLE onfour`)
	mustExec(t, ca, `SELECT lattice_remove_node('n4')`)
	waitNodes(t, cb, "n1,n2")
	pollUntil(t, 60*time.Second, "the proxies to close every session on the removed node", func() (bool, error) {
		n, err := sessions()
		return n == 0, err
	})

	mustExec(t, inflight, `INSERT INTO spans VALUES (101, 'after the removal')`)
	mustExec(t, inflight, `COMMIT`)
	for _, c := range []*pgx.Conn{ca, cb} {
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM spans`).Scan(&n); err != nil || n != 22 {
			t.Fatalf("rows of the transaction in flight = %d, %v; want 22", n, err)
		}
	}
}

// TestNodesAdminAPIAndCLI: the node functions through the admin API and
// the CLI, which run the SQL functions' code: the same checks, with the
// SQLSTATE, hint and HTTP status of each refusal.
func TestNodesAdminAPIAndCLI(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n4 := startExtraNode(t, "n4", nil)
	p := startProxy(t, 2)
	run := func(args ...string) (string, string, int) { return p.RunCLI(t, ctx, args...) }

	withPassword := strings.Replace(n4.DSN("lattice"), "lattice@", "lattice:s3cret@", 1)
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		answer                   string
	}{
		{"password", "POST", "/api/nodes", fmt.Sprintf(`{"name":"n4","dsn":%q}`, withPassword), 400, `"sqlstate":"22023"`},
		{"duplicate", "POST", "/api/nodes", fmt.Sprintf(`{"name":"n2","dsn":%q}`, n4.DSN("lattice")), 409, `"sqlstate":"42710"`},
		{"no dsn", "POST", "/api/nodes", `{"name":"n4"}`, 400, `"sqlstate":"22023"`},
		{"remove with shards", "DELETE", "/api/nodes/n1", "", 409, `"sqlstate":"55000"`},
		{"remove unknown", "DELETE", "/api/nodes/n9", "", 404, `"sqlstate":"42704"`},
	} {
		a := adminCall(t, ctx, p, tc.method, tc.path, tc.body)
		if a.status != tc.status || !strings.Contains(string(a.body), tc.answer) || !strings.Contains(string(a.body), `"hint":`) {
			t.Errorf("%s: %s %s = %d %s; want %d with %s and a hint", tc.name, tc.method, tc.path, a.status, a.body, tc.status, tc.answer)
		}
		if strings.Contains(string(a.body), "s3cret") {
			t.Errorf("%s: the answer repeats the password: %s", tc.name, a.body)
		}
	}

	out, errOut, code := run("node", "add", "n4", n4.DSN("lattice"))
	if code != 0 || !strings.Contains(out, "node n4 added") {
		t.Fatalf("lattice node add: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = run("nodes")
	if code != 0 {
		t.Fatalf("lattice nodes: exit %d\n%s", code, errOut)
	}
	t.Logf("lattice nodes:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[1], "n1 ") || !strings.Contains(lines[1], "catalog") || !strings.HasPrefix(lines[3], "n4 ") || !strings.Contains(lines[3], " yes ") {
		t.Fatalf("lattice nodes printed:\n%s", out)
	}
	var nodes []struct {
		Name      string `json:"name"`
		Reachable bool   `json:"reachable"`
	}
	adminGet(t, ctx, p, "/api/nodes", &nodes)
	if len(nodes) != 3 || nodes[2].Name != "n4" || !nodes[2].Reachable {
		t.Fatalf("GET /api/nodes = %+v", nodes)
	}
	_, errOut, code = run("node", "add", "n5", withPassword)
	if code == 0 || !strings.Contains(errOut, "SQLSTATE 22023") || !strings.Contains(errOut, "hint: ") {
		t.Fatalf("lattice node add with a password: exit %d, %s", code, errOut)
	}
	out, errOut, code = run("node", "remove", "n4")
	if code != 0 || !strings.Contains(out, "node n4 removed") {
		t.Fatalf("lattice node remove: exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code = run("node", "remove", "n1")
	if code == 0 || !strings.Contains(errOut, "SQLSTATE 55000") {
		t.Fatalf("lattice node remove n1: exit %d, %s", code, errOut)
	}
}

// TestNodePasswordFromPgpass: a node that wants a password is added with a
// DSN that has none; the proxy given --pgpass logs in with the file's
// password, creates the tenant's role there with the file's password for
// it, and serves shards there, a proxy without it is refused (28P01,
// with a hint naming --pgpass) and lists the node as unreachable.
func TestNodePasswordFromPgpass(t *testing.T) {
	resetNodes(t)
	ctx := context.Background()
	n4 := startExtraNode(t, "n4", nil)
	direct := connect(t, n4.DSN("lattice"))
	mustExec(t, direct, `ALTER ROLE lattice PASSWORD 'n4-secret'`)
	hba := "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(filepath.Join(n4.Dir, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	mustExec(t, direct, `SELECT pg_reload_conf()`)
	pollUntil(t, 30*time.Second, "n4 to ask for a password", func() (bool, error) {
		c, err := pgx.Connect(ctx, n4.DSN("lattice"))
		if err == nil {
			c.Close(ctx)
			return false, nil
		}
		return sqlState(err) == "28P01", nil
	})

	pgpass := filepath.Join(t.TempDir(), "pgpass")
	// The control role's password, and the tenant role's, which Lattice
	// gives the role it creates on n4.
	line := fmt.Sprintf("127.0.0.1:%d:*:lattice:n4-secret\n127.0.0.1:%d:lattice:%s:tenant-secret\n", n4.Port, n4.Port, pgshard.TenantRole("lattice"))
	if err := os.WriteFile(pgpass, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	with := startProxy(t, 2, "--pgpass", pgpass)
	without := startProxy(t, 2)
	cw := connect(t, with.DSN("lattice"))
	co := connect(t, without.DSN("lattice"))

	_, err := co.Exec(ctx, `SELECT lattice_add_node('n4', $1)`, n4.DSN("lattice"))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "28P01" || !strings.Contains(pgErr.Hint, "--pgpass") {
		t.Fatalf("add through the proxy without the password: %v, want 28P01 with a hint naming --pgpass", err)
	}
	mustExec(t, cw, `SELECT lattice_add_node('n4', $1)`, n4.DSN("lattice"))
	mustExec(t, cw, `CREATE TABLE guarded (k int8 PRIMARY KEY)`)
	mustExec(t, cw, `SELECT lattice_create_tree('guarded', 'k', shard_count => 3)`)
	for i := 0; i < 30; i++ {
		mustExec(t, cw, `INSERT INTO guarded VALUES ($1)`, i)
	}
	var n int
	if err := cw.QueryRow(ctx, `SELECT count(*) FROM guarded`).Scan(&n); err != nil || n != 30 {
		t.Fatalf("count through the proxy with --pgpass = %d, %v", n, err)
	}
	for _, r := range listNodes(t, co) {
		if r.Node == "n4" && r.Reachable {
			t.Fatal("the proxy without the password reaches n4")
		}
	}
}
