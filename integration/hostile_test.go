package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// TestHostileClient runs, as a user of tenant A, each attack that reaches
// outside the tenant (issue 17, items 1 and 2) while tenant B runs a small
// ledger workload on the same nodes. Each is refused twice: by the proxy,
// with 42501 and a hint (the router's wall), and by the node, when A's
// role runs it there directly (the role's wall). B sees no error, and its
// ledger keeps its total.
func TestHostileClient(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const nodes = 3
	const dbA, dbB = "lattice_hostile_a", "lattice_hostile_b"
	admin := connect(t, testNodeDSN(t, 0))
	drop := func() {
		for i := 0; i < nodes; i++ {
			if c, err := pgx.Connect(context.Background(), testNodeDSN(t, i)); err == nil {
				for _, db := range []string{dbA, dbB} {
					c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)")
				}
				c.Close(context.Background())
			}
		}
	}
	drop()
	t.Cleanup(drop)
	// The catalog node's tenant databases are the operator's; Lattice makes
	// the others, and both roles, on first use.
	mustExec(t, admin, "CREATE DATABASE "+dbA)
	mustExec(t, admin, "CREATE DATABASE "+dbB)

	users := filepath.Join(t.TempDir(), "users")
	lines := runLattice(t, "passwd mallory "+dbA, "mallory-pw") + runLattice(t, "passwd bob "+dbB, "bob-pw")
	if err := os.WriteFile(users, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, nodes, "--users-file", users)
	dsn := func(user, password, db string) string {
		return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", user, password, p.Addr, db)
	}
	mallory := connect(t, dsn("mallory", "mallory-pw", dbA))
	bob := connect(t, dsn("bob", "bob-pw", dbB))

	// B's ledger: transfers between accounts on different shards, each a
	// transaction across nodes, so that B's decision log is in use.
	const accounts, balance = 16, 1000
	mustExec(t, bob, `CREATE TABLE ledger (id bigint PRIMARY KEY, balance bigint NOT NULL)`)
	mustExec(t, bob, fmt.Sprintf(`INSERT INTO ledger SELECT i, %d FROM generate_series(1, %d) i`, balance, accounts))
	mustExec(t, bob, `SELECT lattice_create_tree('ledger', 'id', shard_count => 4)`)
	a := hostileTenant{db: dbA, client: mallory, cluster: ctCluster(t, 1)}
	a.setup(t, ctx)

	var done atomic.Int64
	var bErr atomic.Pointer[error]
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			from, to := 1+i%accounts, 1+(i*7+3)%accounts
			if from == to {
				continue
			}
			err := pgx.BeginFunc(ctx, bob, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `UPDATE ledger SET balance = balance - 1 WHERE id = $1`, from); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE ledger SET balance = balance + 1 WHERE id = $1`, to)
				return err
			})
			if err != nil {
				bErr.Store(&err)
				return
			}
			done.Add(1)
		}
	})
	waitUntil(t, ctx, "B's workload to start", func() bool { return done.Load() >= 5 || bErr.Load() != nil })

	// A's role straight on the catalog node: the second wall.
	a.direct = connect(t, fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", pgshard.TenantRole(dbA), testNode(t, 0).Port, dbA))
	a.attack(t, ctx, dbB, pgshard.TenantRole(dbB))

	// B's SQL is not A's to read: A sees B's backends, not their queries.
	for _, c := range []struct {
		name string
		conn *pgx.Conn
	}{{"through the proxy", mallory}, {"on the node", a.direct}} {
		var backends, visible int
		if err := c.conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE query IS DISTINCT FROM '<insufficient privilege>')
			FROM pg_stat_activity WHERE datname = $1`, dbB).Scan(&backends, &visible); err != nil || backends == 0 || visible != 0 {
			t.Errorf("pg_stat_activity %s: %d of B's backends, %d with their SQL visible, %v; want some, none", c.name, backends, visible, err)
		}
	}

	waitUntil(t, ctx, "B's workload to run on", func() bool { return done.Load() >= 20 || bErr.Load() != nil })
	close(stop)
	wg.Wait()
	if e := bErr.Load(); e != nil {
		t.Fatalf("tenant B saw an error: %v", *e)
	}
	// B's new connections still work (its role and database are intact),
	// and every transfer kept the total.
	fresh := connect(t, dsn("bob", "bob-pw", dbB))
	var n, sum int64
	if err := fresh.QueryRow(ctx, `SELECT count(*), sum(balance) FROM ledger`).Scan(&n, &sum); err != nil || n != accounts || sum != accounts*balance {
		t.Fatalf("B's ledger after the attacks: %d rows, total %d, %v; want %d, %d", n, sum, err, accounts, accounts*balance)
	}
}

// waitUntil polls cond until it holds, or fails the test when ctx ends.
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// hostileTenant is the tenant whose user runs the attacks of issue 17,
// against the harness's proxy (TestHostileClient) or a running one
// (TestHostileClientExternal).
type hostileTenant struct {
	db     string
	client *pgx.Conn // a user of tenant db, through the proxy
	// direct is the tenant's role on the catalog node, for the second
	// wall; nil skips it.
	direct *pgx.Conn
	// cluster reaches the catalog node, n1, as the control role, to arm a
	// slot fence; nil skips the fence's attack.
	cluster *pgshard.Cluster
}

// The tables the attacks use, made by setup.
const hostileTree, hostilePlain = "hostile_t", "hostile_plain"

// setup makes the attacks' tables, a transaction across nodes (so that the
// tenant's decision log exists), and runtime_set, a function that makes a
// setting whose name it is given at run time, out of the router's sight.
func (h *hostileTenant) setup(t *testing.T, ctx context.Context) {
	t.Helper()
	// Clients are their tenant's role, which is no superuser.
	var who string
	var super bool
	if err := h.client.QueryRow(ctx, `SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&who, &super); err != nil || who != pgshard.TenantRole(h.db) || super {
		t.Errorf("tenant %s's sessions run as %q (superuser %v, %v), want %q, no superuser", h.db, who, super, err, pgshard.TenantRole(h.db))
	}
	// A tree is dropped in a statement of its own.
	drop := []string{`DROP TABLE IF EXISTS ` + hostileTree, `DROP TABLE IF EXISTS ` + hostilePlain, `DROP FUNCTION IF EXISTS runtime_set(text, text)`}
	for _, q := range drop {
		mustExec(t, h.client, q)
	}
	for _, q := range []string{
		`CREATE TABLE ` + hostileTree + ` (id bigint PRIMARY KEY, v text)`,
		`INSERT INTO ` + hostileTree + ` SELECT i, 'v' || i FROM generate_series(1, 8) i`,
		`SELECT lattice_create_tree('` + hostileTree + `', 'id', shard_count => 4)`,
		`CREATE TABLE ` + hostilePlain + ` (line text)`,
		`CREATE OR REPLACE FUNCTION runtime_set(name text, value text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config(name, value, false);
    RETURN true;
END
$$`,
	} {
		mustExec(t, h.client, q)
	}
	t.Cleanup(func() {
		for _, q := range drop {
			if _, err := h.client.Exec(context.Background(), q); err != nil {
				t.Errorf("clean up: %s: %v", q, err)
			}
		}
	})
	if err := pgx.BeginFunc(ctx, h.client, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE `+hostileTree+` SET v = 'x' WHERE id = ANY('{1,2,3,4,5,6,7,8}')`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// hostileAttacks are the statements that reach outside the tenant, each
// with the node's SQLSTATE when the tenant's role runs it itself: 42501
// but for dblink, which cannot be there (its CREATE EXTENSION is refused
// to the role). other is another tenant's database, otherRole a role with
// backends on the catalog node that is not the tenant's.
func hostileAttacks(other, otherRole string) []struct{ name, sql, direct string } {
	return []struct{ name, sql, direct string }{
		{"COPY TO PROGRAM", `COPY (SELECT 1) TO PROGRAM 'id'`, "42501"},
		{"server file COPY", `COPY ` + hostilePlain + ` FROM '/etc/hostname'`, "42501"},
		{"CREATE EXTENSION dblink", `CREATE EXTENSION dblink`, "42501"},
		{"dblink into another tenant", `SELECT * FROM dblink('dbname=` + other + `', 'SELECT 1') AS r(n int)`, "42883"},
		{"DROP DATABASE", `DROP DATABASE ` + other, "42501"},
		{"ALTER ROLE CURRENT_USER", `ALTER ROLE CURRENT_USER CONNECTION LIMIT 0`, "42501"},
		{"pg_terminate_backend of another role", `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ` + quoteLiteral(otherRole), "42501"},
		{"pg_read_file on a tree", `SELECT * FROM ` + hostileTree + ` WHERE id = 1 AND v = (SELECT pg_read_file('/etc/hostname'))`, "42501"},
		{"UPDATE the decision log", `UPDATE lattice_meta.commit_decisions SET state = 'aborted'`, "42501"},
		{"DELETE the decision log", `DELETE FROM lattice_meta.commit_decisions`, "42501"},
		{"INSERT into the decision log", `INSERT INTO lattice_meta.commit_decisions (gid, state, participants) VALUES ('lattice_0_1_1', 'committed', '{}')`, "42501"},
		{"decide another backend's gid", `SELECT lattice_meta.decide_commit('lattice_0_1_1', '{n2}')`, "42501"},
	}
}

// attack runs every attack: each refused by the proxy with its own 42501
// and a hint (the router's wall) and, when direct is set, by the node
// (the role's wall); then the settings a function makes at run time.
func (h *hostileTenant) attack(t *testing.T, ctx context.Context, other, otherRole string) {
	for _, a := range hostileAttacks(other, otherRole) {
		t.Run(a.name, func(t *testing.T) {
			var nodeErr error
			if h.direct != nil {
				if _, nodeErr = h.direct.Exec(ctx, a.sql); pgCode(nodeErr) != a.direct {
					t.Errorf("as the tenant's role on the node: %v, want %s", nodeErr, a.direct)
				}
			}
			_, err := h.client.Exec(ctx, a.sql)
			var pe, ne *pgconn.PgError
			// The proxy's refusal is its own, with a hint that names the
			// fix: not the node's error relayed, which would mean only the
			// second wall held.
			if !errors.As(err, &pe) || pe.Code != "42501" || pe.Hint == "" ||
				errors.As(nodeErr, &ne) && ne.Message == pe.Message && ne.Hint == pe.Hint {
				t.Errorf("through the proxy: %v, want the proxy's 42501 with a hint", err)
			}
		})
	}
	t.Run("settings that change key parsing, made in a function", func(t *testing.T) { h.parsingSettings(t, ctx) })
	t.Run("the migrator's setting, made in a function", func(t *testing.T) { h.fenceBypass(t, ctx) })
}

// parsingSettings: a function that turns standard_conforming_strings off,
// or changes client_encoding, on its backend fails its statement with the
// proxy's 0A000 and a hint (PostgreSQL reports the change in
// ParameterStatus), and the backend is closed: the session's next
// statements run with standard strings again.
func (h *hostileTenant) parsingSettings(t *testing.T, ctx context.Context) {
	for _, c := range [][2]string{{"standard_conforming_strings", "off"}, {"client_encoding", "LATIN1"}} {
		for _, inTx := range []bool{false, true} {
			sql := fmt.Sprintf(`SELECT runtime_set('%s', '%s')`, c[0], c[1])
			if inTx {
				mustExec(t, h.client, "BEGIN")
			}
			_, err := h.client.Exec(ctx, sql)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "0A000" || !strings.Contains(pe.Message, c[0]) || pe.Hint == "" {
				t.Errorf("%s (in a transaction: %v): %v, want the proxy's 0A000 naming %s, with a hint", sql, inTx, err, c[0])
			}
			if inTx {
				mustExec(t, h.client, "ROLLBACK")
			}
			for i := 0; i < 4; i++ { // every backend of the pool it may get
				var scs, enc string
				if err := h.client.QueryRow(ctx, `SELECT current_setting('standard_conforming_strings'), current_setting('client_encoding')`,
					pgx.QueryExecModeSimpleProtocol).Scan(&scs, &enc); err != nil || scs != "on" || enc != "UTF8" {
					t.Fatalf("after %s: standard_conforming_strings %q, client_encoding %q, %v; want on, UTF8", sql, scs, enc, err)
				}
			}
		}
	}
}

// fenceBypass: lattice.migrator, made by a function (SET and set_config of
// it are refused by name), does not let the tenant's writes past an armed
// slot fence, through the proxy or on the node: the fence lets only the
// control role's sessions pass.
func (h *hostileTenant) fenceBypass(t *testing.T, ctx context.Context) {
	if h.cluster == nil {
		t.Skip("no control role on the catalog node to arm a fence")
	}
	var slots int32
	if err := h.client.QueryRow(ctx, `SELECT slot_count FROM lattice_trees() WHERE tree = '`+hostileTree+`'`).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	var shard int32
	if err := h.client.QueryRow(ctx, `SELECT shard FROM lattice_shards('`+hostileTree+`') WHERE node = 'n1' ORDER BY shard LIMIT 1`).Scan(&shard); err != nil {
		t.Fatalf("a shard of %s on the catalog node: %v", hostileTree, err)
	}
	tree := &shardmap.Tree{Tenant: h.db, Name: hostileTree, KeyColumn: "id", KeyType: shardmap.KeyInt, SlotCount: int(slots)}
	control, err := h.cluster.Admin(ctx, "n1", h.db)
	if err != nil {
		t.Fatal(err)
	}
	table := pgshard.ShardTable(tree, int(shard))
	var id int64
	var before string
	if err := control.QueryRow(ctx, `SELECT id, v FROM `+table+` ORDER BY id LIMIT 1`).Scan(&id, &before); err != nil {
		t.Fatalf("a row of %s: %v", table, err)
	}
	fence := pgshard.SlotFence{Migration: "hostile", Tree: tree, Shard: int(shard), Slots: [][2]int{{0, int(slots) - 1}}, Target: 99, Epoch: 1}
	if err := h.cluster.InstallSlotFence(ctx, "n1", fence); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := h.cluster.DropSlotFence(context.WithoutCancel(ctx), "n1", fence); err != nil {
			t.Error(err)
		}
	}()

	// Through the proxy: the function, then the write, on the one backend
	// of the transaction on the catalog node.
	err = pgx.BeginFunc(ctx, h.client, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT runtime_set('lattice' || '.migrator', 'on')`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE `+hostileTree+` SET v = 'past the fence' WHERE id = $1`, id)
		return err
	})
	if pgCode(err) != "LT001" {
		t.Errorf("through the proxy, a write past the fence after the function: %v, want LT001", err)
	}
	if h.direct != nil {
		_, err := h.direct.Exec(ctx, `SELECT set_config('lattice.migrator', 'on', false); UPDATE `+table+` SET v = 'past the fence' WHERE id = `+strconv.FormatInt(id, 10))
		if pgCode(err) != "LT001" {
			t.Errorf("on the node, as the tenant's role with lattice.migrator on: %v, want LT001", err)
		}
	}
	var after string
	if err := control.QueryRow(ctx, `SELECT v FROM `+table+` WHERE id = $1`, id).Scan(&after); err != nil || after != before {
		t.Errorf("the fenced row is %q (%v), want %q", after, err, before)
	}
	// The control role's own write passes, as the migrator's does.
	if err := pgx.BeginFunc(ctx, control, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SET LOCAL `+pgshard.MigratorSetting+` = 'on'; UPDATE `+table+` SET v = v WHERE id = `+strconv.FormatInt(id, 10))
		return err
	}); err != nil {
		t.Errorf("the control role's write with the migrator's setting: %v", err)
	}
}
