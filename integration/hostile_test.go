package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/pgshard"
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

	// Clients are their tenant's role, which is no superuser.
	var who string
	var super bool
	if err := mallory.QueryRow(ctx, `SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&who, &super); err != nil || who != pgshard.TenantRole(dbA) || super {
		t.Errorf("tenant A's sessions run as %q (superuser %v, %v), want %q, no superuser", who, super, err, pgshard.TenantRole(dbA))
	}

	// B's ledger: transfers between accounts on different shards, each a
	// transaction across nodes, so that B's decision log is in use.
	const accounts, balance = 16, 1000
	mustExec(t, bob, `CREATE TABLE ledger (id bigint PRIMARY KEY, balance bigint NOT NULL)`)
	mustExec(t, bob, fmt.Sprintf(`INSERT INTO ledger SELECT i, %d FROM generate_series(1, %d) i`, balance, accounts))
	mustExec(t, bob, `SELECT lattice_create_tree('ledger', 'id', shard_count => 4)`)
	mustExec(t, mallory, `CREATE TABLE t (id bigint PRIMARY KEY, v text)`)
	mustExec(t, mallory, `INSERT INTO t SELECT i, 'v' || i FROM generate_series(1, 8) i`)
	mustExec(t, mallory, `SELECT lattice_create_tree('t', 'id', shard_count => 4)`)
	mustExec(t, mallory, `CREATE TABLE plain (line text)`)
	// A transaction of A's across nodes makes A's decision log.
	if err := pgx.BeginFunc(ctx, mallory, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE t SET v = 'x' WHERE id = ANY('{1,2,3,4,5,6,7,8}')`)
		return err
	}); err != nil {
		t.Fatal(err)
	}

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
	direct := connect(t, fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", pgshard.TenantRole(dbA), testNode(t, 0).Port, dbA))

	// direct is the node's SQLSTATE when A's role runs the attack itself:
	// 42501 but for dblink, which cannot be there (its CREATE EXTENSION is
	// refused to the role).
	attacks := []struct{ name, sql, direct string }{
		{"COPY TO PROGRAM", `COPY (SELECT 1) TO PROGRAM 'id'`, "42501"},
		{"server file COPY", `COPY plain FROM '/etc/hostname'`, "42501"},
		{"CREATE EXTENSION dblink", `CREATE EXTENSION dblink`, "42501"},
		{"dblink into B", `SELECT * FROM dblink('dbname=` + dbB + `', 'SELECT count(*) FROM ledger') AS r(n bigint)`, "42883"},
		{"DROP DATABASE", `DROP DATABASE ` + dbB, "42501"},
		{"ALTER ROLE CURRENT_USER", `ALTER ROLE CURRENT_USER CONNECTION LIMIT 0`, "42501"},
		{"pg_terminate_backend of B", `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '` + pgshard.TenantRole(dbB) + `'`, "42501"},
		{"pg_read_file on a tree", `SELECT * FROM t WHERE id = 1 AND v = (SELECT pg_read_file('/etc/hostname'))`, "42501"},
		{"UPDATE the decision log", `UPDATE lattice_meta.commit_decisions SET state = 'aborted'`, "42501"},
		{"DELETE the decision log", `DELETE FROM lattice_meta.commit_decisions`, "42501"},
		{"INSERT into the decision log", `INSERT INTO lattice_meta.commit_decisions (gid, state, participants) VALUES ('lattice_0_1_1', 'committed', '{}')`, "42501"},
		{"decide another backend's gid", `SELECT lattice_meta.decide_commit('lattice_0_1_1', '{n2}')`, "42501"},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			_, nodeErr := direct.Exec(ctx, a.sql)
			if pgCode(nodeErr) != a.direct {
				t.Errorf("as the tenant's role on the node: %v, want %s", nodeErr, a.direct)
			}
			_, err := mallory.Exec(ctx, a.sql)
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

	// B's SQL is not A's to read: A sees B's backends, not their queries.
	for _, c := range []struct {
		name string
		conn *pgx.Conn
	}{{"through the proxy", mallory}, {"on the node", direct}} {
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
