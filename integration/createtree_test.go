package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/lattice-db/lattice/btreeindex"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// ctCluster is a pgshard cluster over the first n harness nodes.
func ctCluster(t *testing.T, n int) *pgshard.Cluster {
	t.Helper()
	nodes := make([]pgshard.Node, n)
	for i := range nodes {
		nodes[i] = pgshard.Node{Name: fmt.Sprintf("n%d", i+1), DSN: testNodeDSN(t, i)}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := pgshard.NewCluster(nodes, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// ctStore is a shard map store of its own for these tests of pgshard
// alone: database 1 of the harness's redis-server, emptied, under a prefix
// (and so an event channel) no proxy listens to.
func ctStore(t *testing.T) shardmap.Store {
	t.Helper()
	opts, err := redis.ParseURL(testRedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opts.DB = 1
	client := redis.NewClient(opts)
	if err := client.FlushDB(context.Background()).Err(); err != nil {
		t.Fatalf("redis FLUSHDB: %v", err)
	}
	s := shardmap.NewRedisStore(client, "lattice_ct")
	t.Cleanup(func() { s.Close() })
	return s
}

func ctConnect(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func ctExec(t *testing.T, ctx context.Context, conn *pgx.Conn, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

// ctFingerprint is the row count and an order-independent checksum of the
// rows' text form.
const ctFingerprint = `SELECT count(*), coalesce(sum(hashtextextended(x::text, 0)::numeric), 0)::text FROM %s x`

// TestCreateTreeDistributesRows turns tables with rows into trees of 8 shards
// over 2 nodes, for every supported key type, and checks every row landed in
// the shard whose slots contain the key's slot as the proxy computes it, that
// nothing was lost or changed, and that the template is empty and fenced.
func TestCreateTreeDistributesRows(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cat := ctConnect(t, ctx, testNodeDSN(t, 0))
	c := ctCluster(t, 2)
	store := ctStore(t)

	for _, tc := range []struct {
		table, key string
		kt         shardmap.KeyType
		setup      []string
	}{
		{"catalogue", "sku", shardmap.KeyText, []string{
			`CREATE TABLE catalogue (
				sku text PRIMARY KEY,
				name varchar(200) COLLATE "C" NOT NULL DEFAULT 'unnamed',
				qty int CHECK (qty >= 0),
				price numeric(10,2),
				tags text[],
				doubled int GENERATED ALWAYS AS (qty * 2) STORED,
				created timestamptz DEFAULT now(),
				UNIQUE (sku, name)
			) WITH (fillfactor = 90)`,
			`CREATE INDEX "catalogue by name" ON catalogue (lower(name)) WHERE qty > 0`,
			`INSERT INTO catalogue (sku, name, qty, price, tags)
			 SELECT 'sku-' || i, 'item ' || i, i % 50, i * 1.25, ARRAY['t' || (i % 7), NULL]
			 FROM generate_series(1, 3000) i`,
			`INSERT INTO catalogue (sku, qty) VALUES (''::text, 1), ('ключ-π-🙂', 2), (repeat('long', 500), 3), (E'tab\tnew\nline', 4)`,
		}},
		{"events", "id", shardmap.KeyInt, []string{
			`CREATE TABLE events (id bigint PRIMARY KEY, payload jsonb NOT NULL DEFAULT '{}')`,
			`INSERT INTO events SELECT i * 7919 - 5000000, jsonb_build_object('i', i) FROM generate_series(1, 2000) i`,
			`INSERT INTO events (id) VALUES (0), (-1), (9223372036854775807), (-9223372036854775808)`,
		}},
		{"counters", "n", shardmap.KeyInt, []string{
			`CREATE TABLE counters (n smallint PRIMARY KEY, v int)`,
			`INSERT INTO counters SELECT i, i FROM generate_series(-32768, 32767, 37) i`,
		}},
		{"sessions", "id", shardmap.KeyUUID, []string{
			`CREATE TABLE sessions (id uuid PRIMARY KEY, data bytea)`,
			`INSERT INTO sessions SELECT gen_random_uuid(), decode(md5(i::text), 'hex') FROM generate_series(1, 2000) i`,
			`INSERT INTO sessions VALUES ('00000000-0000-0000-0000-000000000000', NULL), ('ffffffff-ffff-ffff-ffff-ffffffffffff', NULL)`,
		}},
		{"orders", "customer", shardmap.KeyText, []string{
			`CREATE TABLE orders (customer varchar(20), order_no int, amount int, PRIMARY KEY (customer, order_no))`,
			`CREATE UNIQUE INDEX orders_amount ON orders (amount, customer)`,
			`INSERT INTO orders SELECT 'c' || (i % 300), i, i FROM generate_series(1, 2000) i`,
		}},
	} {
		t.Run(tc.table, func(t *testing.T) {
			ctExec(t, ctx, cat, tc.setup...)
			var rows int64
			var sum string
			if err := cat.QueryRow(ctx, fmt.Sprintf(ctFingerprint, tc.table)).Scan(&rows, &sum); err != nil {
				t.Fatal(err)
			}
			var templateIndexes int
			if err := cat.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = 'public' AND tablename = $1`, tc.table).Scan(&templateIndexes); err != nil {
				t.Fatal(err)
			}

			tree, m, err := c.CreateTree(ctx, store, pgshard.TreeSpec{Table: tc.table, KeyColumn: tc.key, ShardCount: 8})
			if err != nil {
				t.Fatalf("CreateTree: %v", err)
			}
			t.Logf("DDL log:\n%s", strings.Join(tree.DDL, ";\n"))
			if tree.Tenant != "lattice" || tree.KeyType != tc.kt || tree.SlotCount != 4096 || tree.ShardCount != 8 || len(tree.DDL) == 0 {
				t.Fatalf("tree %+v", tree)
			}
			if m.Epoch != 1 || len(m.Shards) != 8 || m.DistinctShards() != 8 {
				t.Fatalf("map epoch %d, %d shards", m.Epoch, len(m.Shards))
			}
			for i := 0; i < 8; i++ {
				if want := fmt.Sprintf("n%d", i%2+1); m.Shards[i].Node != want {
					t.Errorf("shard %d on %s, want %s", i, m.Shards[i].Node, want)
				}
			}
			if got, err := store.Tree(ctx, "lattice", tc.table); err != nil || got.KeyColumn != tc.key || !slices.Equal(got.DDL, tree.DDL) {
				t.Errorf("stored tree %+v, %v", got, err)
			}
			if got, err := store.Map(ctx, "lattice", tc.table); err != nil || !slices.Equal(got.Slots, m.Slots) {
				t.Errorf("stored map: %v", err)
			}

			// Every row is in the shard that owns its slot, by the Go hash,
			// and SQL on the node agrees.
			var gotRows int64
			var sums []string
			for idx := 0; idx < 8; idx++ {
				node := 0
				if m.Shards[idx].Node == "n2" {
					node = 1
				}
				conn := ctConnect(t, ctx, testNodeDSN(t, node))
				shard := pgshard.ShardTable(tree, idx)
				keys, err := conn.Query(ctx, "SELECT "+pgx.Identifier{tc.key}.Sanitize()+"::text FROM "+shard)
				if err != nil {
					t.Fatal(err)
				}
				ks, err := pgx.CollectRows(keys, pgx.RowTo[string])
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range ks {
					slot, err := shardmap.SlotForText(tree.KeyType, []byte(k), tree.SlotCount)
					if err != nil {
						t.Fatal(err)
					}
					if m.Slots[slot] != idx {
						t.Fatalf("key %q (slot %d) is in shard %d, the map says %d", k, slot, idx, m.Slots[slot])
					}
				}
				var misplaced int64
				q := "SELECT count(*) FROM " + shard + " WHERE NOT " + btreeindex.SlotPredicate(tree, "", m.SlotRanges(idx))
				if err := conn.QueryRow(ctx, q).Scan(&misplaced); err != nil || misplaced != 0 {
					t.Errorf("shard %d: %d rows outside its slots by SQL, %v", idx, misplaced, err)
				}
				var n int64
				var s string
				if err := conn.QueryRow(ctx, fmt.Sprintf(ctFingerprint, shard)).Scan(&n, &s); err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					t.Errorf("shard %d is empty", idx)
				}
				gotRows += n
				sums = append(sums, s)
				var indexes int
				if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = $2`,
					shardmap.SchemaName(idx), tc.table).Scan(&indexes); err != nil || indexes != templateIndexes {
					t.Errorf("shard %d has %d indexes, the template %d (%v)", idx, indexes, templateIndexes, err)
				}
				if _, err := conn.Exec(ctx, "ANALYZE "+shard); err != nil {
					t.Fatal(err)
				}
			}
			if gotRows != rows {
				t.Errorf("%d rows in the shards, %d in the table before", gotRows, rows)
			}
			var total string
			if err := cat.QueryRow(ctx, `SELECT sum(s::numeric)::text FROM unnest($1::text[]) s`, sums).Scan(&total); err != nil || total != sum {
				t.Errorf("checksum of the shards %s, of the table before %s (%v)", total, sum, err)
			}

			// The template is empty and every kind of write is fenced.
			var left int64
			if err := cat.QueryRow(ctx, "SELECT count(*) FROM "+tc.table).Scan(&left); err != nil || left != 0 {
				t.Errorf("template holds %d rows, %v", left, err)
			}
			for _, w := range []string{
				"INSERT INTO " + tc.table + " DEFAULT VALUES",
				"UPDATE " + tc.table + " SET " + tc.key + " = " + tc.key,
				"DELETE FROM " + tc.table,
				"TRUNCATE " + tc.table,
			} {
				_, err := cat.Exec(ctx, w)
				var pgErr *pgconn.PgError
				want := fmt.Sprintf(`lattice: relation "%s" is a tree now`, tc.table)
				if !errors.As(err, &pgErr) || pgErr.Code != sqlstate.SlotMoved || pgErr.Message != want {
					t.Errorf("%s: %v, want %s %q", w, err, sqlstate.SlotMoved, want)
				}
			}

			own, err := c.ReadOwnership(ctx, "lattice")
			if err != nil {
				t.Fatal(err)
			}
			if len(own[tc.table]) != 8 {
				t.Fatalf("ownership records: %+v", own[tc.table])
			}
			for i, o := range own[tc.table] {
				if o.Shard != i || o.Node != m.Shards[i].Node || o.Epoch != 1 || !slices.Equal(o.Slots, m.SlotRanges(i)) {
					t.Errorf("ownership %+v, want shard %d on %s owning %v at epoch 1", o, i, m.Shards[i].Node, m.SlotRanges(i))
				}
			}

			est, err := c.TreeRowCount(ctx, tree, m)
			if err != nil {
				t.Fatal(err)
			}
			var estTotal int64
			for _, n := range est {
				estTotal += n
			}
			if len(est) != 8 || estTotal != rows {
				t.Errorf("row estimates %v (total %d), want 8 shards and %d rows", est, estTotal, rows)
			}

			_, _, err = c.CreateTree(ctx, store, pgshard.TreeSpec{Table: tc.table, KeyColumn: tc.key, ShardCount: 8})
			if code := ctCode(err); code != "42P07" {
				t.Errorf("second CreateTree: %v, want 42P07", err)
			}
			// A registry that lost the tree: the template's fence, an
			// internal trigger, still marks it a tree.
			_, _, err = c.CreateTree(ctx, ctStore(t), pgshard.TreeSpec{Table: tc.table, KeyColumn: tc.key, ShardCount: 8})
			if code := ctCode(err); code != "42P07" {
				t.Errorf("CreateTree with a registry that lacks the tree: %v, want 42P07", err)
			}
		})
	}
}

func ctCode(err error) string {
	var e *sqlstate.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return fmt.Sprint(err)
}

// ctNoShards fails the test if any node holds a shard schema.
func ctNoShards(t *testing.T, ctx context.Context, nodes int) {
	t.Helper()
	for i := 0; i < nodes; i++ {
		conn := ctConnect(t, ctx, testNodeDSN(t, i))
		var schemas []string
		rows, err := conn.Query(ctx, `SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'lattice\_s%'`)
		if err == nil {
			schemas, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil || len(schemas) > 0 {
			t.Errorf("node %d holds shard schemas %v (%v)", i, schemas, err)
		}
	}
}

// TestCreateTreeRules checks each rule a tree must meet gives its SQLSTATE
// and leaves nothing behind.
func TestCreateTreeRules(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cat := ctConnect(t, ctx, testNodeDSN(t, 0))
	c := ctCluster(t, 2)
	store := ctStore(t)

	for _, tc := range []struct {
		name  string
		setup []string
		spec  pgshard.TreeSpec
		code  string
	}{
		{"missing table", nil, pgshard.TreeSpec{Table: "nope", KeyColumn: "id"}, "42P01"},
		{"missing column", []string{`CREATE TABLE r1 (id int PRIMARY KEY)`},
			pgshard.TreeSpec{Table: "r1", KeyColumn: "sku"}, "42703"},
		{"serial key", []string{`CREATE TABLE r2 (id serial PRIMARY KEY)`},
			pgshard.TreeSpec{Table: "r2", KeyColumn: "id"}, "0A000"},
		{"identity key", []string{`CREATE TABLE r3 (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY)`},
			pgshard.TreeSpec{Table: "r3", KeyColumn: "id"}, "0A000"},
		{"serial column", []string{`CREATE TABLE r4 (id int PRIMARY KEY, n bigserial)`},
			pgshard.TreeSpec{Table: "r4", KeyColumn: "id"}, "0A000"},
		{"numeric key", []string{`CREATE TABLE r5 (id numeric PRIMARY KEY)`},
			pgshard.TreeSpec{Table: "r5", KeyColumn: "id"}, "0A000"},
		{"key not in primary key", []string{`CREATE TABLE r6 (id int PRIMARY KEY, k text)`},
			pgshard.TreeSpec{Table: "r6", KeyColumn: "k"}, "42P16"},
		{"no primary key", []string{`CREATE TABLE r7 (k text)`},
			pgshard.TreeSpec{Table: "r7", KeyColumn: "k"}, "42P16"},
		{"unique index without key", []string{`CREATE TABLE r8 (k text PRIMARY KEY, email text)`, `CREATE UNIQUE INDEX r8_email ON r8 (email)`},
			pgshard.TreeSpec{Table: "r8", KeyColumn: "k"}, "42P16"},
		{"unique constraint without key", []string{`CREATE TABLE r9 (k text PRIMARY KEY, email text UNIQUE)`},
			pgshard.TreeSpec{Table: "r9", KeyColumn: "k"}, "42P16"},
		{"foreign key out", []string{`CREATE TABLE r10p (id int PRIMARY KEY)`, `CREATE TABLE r10 (k text PRIMARY KEY, p int REFERENCES r10p)`},
			pgshard.TreeSpec{Table: "r10", KeyColumn: "k"}, "0A000"},
		{"foreign key in", []string{`CREATE TABLE r11 (k text PRIMARY KEY)`, `CREATE TABLE r11c (id int PRIMARY KEY, k text REFERENCES r11)`},
			pgshard.TreeSpec{Table: "r11", KeyColumn: "k"}, "0A000"},
		{"view", []string{`CREATE VIEW r12 AS SELECT 1 AS k`},
			pgshard.TreeSpec{Table: "r12", KeyColumn: "k"}, "42809"},
		{"unlogged", []string{`CREATE UNLOGGED TABLE r13 (k text PRIMARY KEY)`},
			pgshard.TreeSpec{Table: "r13", KeyColumn: "k"}, "0A000"},
		{"not valid check", []string{`CREATE TABLE r14 (k text PRIMARY KEY, n int)`, `ALTER TABLE r14 ADD CHECK (n > 0) NOT VALID`},
			pgshard.TreeSpec{Table: "r14", KeyColumn: "k"}, "55000"},
		{"trigger", []string{`CREATE TABLE r15 (k text PRIMARY KEY)`,
			`CREATE FUNCTION r15_noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$`,
			`CREATE TRIGGER r15_t BEFORE INSERT ON r15 FOR EACH ROW EXECUTE FUNCTION r15_noop()`},
			pgshard.TreeSpec{Table: "r15", KeyColumn: "k"}, "0A000"},
		{"partitioned", []string{`CREATE TABLE r16 (k text PRIMARY KEY) PARTITION BY HASH (k)`},
			pgshard.TreeSpec{Table: "r16", KeyColumn: "k"}, "0A000"},
		// On the catalog node they would read the empty template.
		{"read by a view", []string{`CREATE TABLE r18 (k text PRIMARY KEY)`, `CREATE VIEW r18v AS SELECT count(*) FROM r18`},
			pgshard.TreeSpec{Table: "r18", KeyColumn: "k"}, "2BP01"},
		{"read by a function body", []string{`CREATE TABLE r19 (k text PRIMARY KEY)`,
			`CREATE FUNCTION r19n() RETURNS bigint LANGUAGE sql BEGIN ATOMIC SELECT count(*) FROM r19; END`},
			pgshard.TreeSpec{Table: "r19", KeyColumn: "k"}, "2BP01"},
		{"read by another table's policy", []string{`CREATE TABLE r20 (k text PRIMARY KEY)`, `CREATE TABLE r20o (k text PRIMARY KEY)`,
			`CREATE POLICY r20p ON r20o USING (EXISTS (SELECT 1 FROM r20 WHERE r20.k = r20o.k))`},
			pgshard.TreeSpec{Table: "r20", KeyColumn: "k"}, "2BP01"},
		{"shard count", []string{`CREATE TABLE r17 (k text PRIMARY KEY)`},
			pgshard.TreeSpec{Table: "r17", KeyColumn: "k", ShardCount: 5000}, "22023"},
		{"slot count", nil, pgshard.TreeSpec{Table: "r17", KeyColumn: "k", SlotCount: 3000}, "22023"},
		{"reserved name", nil, pgshard.TreeSpec{Table: "lattice_owner", KeyColumn: "k"}, "42939"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctExec(t, ctx, cat, tc.setup...)
			_, _, err := c.CreateTree(ctx, store, tc.spec)
			var e *sqlstate.Error
			if !errors.As(err, &e) || e.Code != tc.code {
				t.Fatalf("CreateTree: %v, want SQLSTATE %s", err, tc.code)
			}
			t.Logf("%s: %s; detail %q; hint %q", e.Code, e.Message, e.Detail, e.Hint)
			if _, err := store.Tree(ctx, "lattice", tc.spec.Table); !errors.Is(err, shardmap.ErrNotFound) {
				t.Errorf("tree registered after a refusal: %v", err)
			}
		})
	}
	ctNoShards(t, ctx, 2)
}

// failingStore refuses to register trees, as Redis being down would.
type failingStore struct{ shardmap.Store }

func (failingStore) CreateTree(context.Context, *shardmap.Tree, *shardmap.Map) error {
	return errors.New("redis is down")
}

// TestCreateTreeRollsBack checks that a tree whose registration fails leaves
// the table as it was and no shard behind.
func TestCreateTreeRollsBack(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cat := ctConnect(t, ctx, testNodeDSN(t, 0))
	c := ctCluster(t, 2)
	ctExec(t, ctx, cat, `CREATE TABLE items (sku text PRIMARY KEY, n int)`,
		`INSERT INTO items SELECT 's' || i, i FROM generate_series(1, 500) i`)

	_, _, err := c.CreateTree(ctx, failingStore{ctStore(t)}, pgshard.TreeSpec{Table: "items", KeyColumn: "sku", ShardCount: 4})
	if err == nil || !strings.Contains(err.Error(), "redis is down") {
		t.Fatalf("CreateTree: %v, want the store's error", err)
	}
	var n int64
	if err := cat.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n); err != nil || n != 500 {
		t.Errorf("items holds %d rows after the rollback, %v", n, err)
	}
	ctExec(t, ctx, cat, `INSERT INTO items VALUES ('new', 1)`) // not fenced
	ctNoShards(t, ctx, 2)

	// The same table can then become a tree.
	if _, _, err := c.CreateTree(ctx, ctStore(t), pgshard.TreeSpec{Table: "items", KeyColumn: "sku", ShardCount: 4}); err != nil {
		t.Fatalf("CreateTree after a rollback: %v", err)
	}
}

// TestCreateTreeCopyFailureRollsBack checks that a failed row copy leaves
// the table as it was and no shard behind. The copy into node 2 fails on a
// check constraint whose function node 2 defines differently.
func TestCreateTreeCopyFailureRollsBack(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cat := ctConnect(t, ctx, testNodeDSN(t, 0))
	other := ctConnect(t, ctx, testNodeDSN(t, 1))
	ctExec(t, ctx, other, `CREATE OR REPLACE FUNCTION ct_ok(int) RETURNS bool IMMUTABLE LANGUAGE sql AS 'SELECT false'`)
	ctExec(t, ctx, cat, `CREATE OR REPLACE FUNCTION ct_ok(int) RETURNS bool IMMUTABLE LANGUAGE sql AS 'SELECT true'`,
		`CREATE TABLE checked (id int PRIMARY KEY, n int CHECK (ct_ok(n)))`,
		`INSERT INTO checked SELECT i, i FROM generate_series(1, 200) i`)
	c := ctCluster(t, 2)
	store := ctStore(t)
	_, _, err := c.CreateTree(ctx, store, pgshard.TreeSpec{Table: "checked", KeyColumn: "id", ShardCount: 2})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		t.Fatalf("CreateTree: %v, want the check violation on node 2", err)
	}
	var n int64
	if err := cat.QueryRow(ctx, "SELECT count(*) FROM checked").Scan(&n); err != nil || n != 200 {
		t.Errorf("checked holds %d rows after the rollback, %v", n, err)
	}
	ctExec(t, ctx, cat, `INSERT INTO checked VALUES (0, 0)`) // not fenced
	ctNoShards(t, ctx, 2)
	if _, err := store.Tree(ctx, "lattice", "checked"); !errors.Is(err, shardmap.ErrNotFound) {
		t.Errorf("tree registered after a failure: %v", err)
	}
}

// commitKillingStore registers the tree, then ends the catalog session that
// is about to commit, so the commit fails after the tree is published.
type commitKillingStore struct {
	shardmap.Store
	t *testing.T
}

func (s commitKillingStore) CreateTree(ctx context.Context, tree *shardmap.Tree, m *shardmap.Map) error {
	if err := s.Store.CreateTree(ctx, tree, m); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, testNodeDSN(s.t, 0))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE relation = to_regclass('public.' || quote_ident($1)) AND mode = 'AccessExclusiveLock' AND granted`, tree.Name).Scan(&n)
	if err == nil && n != 1 {
		err = fmt.Errorf("terminated %d sessions, want 1", n)
	}
	return err
}

// TestCreateTreeCommitLost checks that when the catalog commit fails after
// the tree was registered, CreateTree finishes forwards: the rows stay on the
// shards and the template is emptied and fenced again.
func TestCreateTreeCommitLost(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cat := ctConnect(t, ctx, testNodeDSN(t, 0))
	c := ctCluster(t, 2)
	ctExec(t, ctx, cat, `CREATE TABLE parts (sku text PRIMARY KEY, n int)`,
		`INSERT INTO parts SELECT 's' || i, i FROM generate_series(1, 400) i`)
	store := ctStore(t)
	tree, _, err := c.CreateTree(ctx, commitKillingStore{store, t}, pgshard.TreeSpec{Table: "parts", KeyColumn: "sku", ShardCount: 2})
	if err != nil {
		t.Fatalf("CreateTree: %v", err)
	}
	if _, err := store.Tree(ctx, "lattice", "parts"); err != nil {
		t.Errorf("tree not registered: %v", err)
	}
	var left int64
	if err := cat.QueryRow(ctx, "SELECT count(*) FROM parts").Scan(&left); err != nil || left != 0 {
		t.Errorf("template holds %d rows, %v", left, err)
	}
	var pgErr *pgconn.PgError
	if _, err := cat.Exec(ctx, "INSERT INTO parts VALUES ('x', 1)"); !errors.As(err, &pgErr) || pgErr.Code != sqlstate.SlotMoved {
		t.Errorf("write to the template: %v, want %s", err, sqlstate.SlotMoved)
	}
	est := 0
	for i := 0; i < 2; i++ {
		var n int
		if err := ctConnect(t, ctx, testNodeDSN(t, i)).QueryRow(ctx, "SELECT count(*) FROM "+pgshard.ShardTable(tree, i)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		est += n
	}
	if est != 400 {
		t.Errorf("shards hold %d rows, want 400", est)
	}
}

// TestCreateTreeWaitsForWriters checks that a write committed while
// CreateTree waits for the table lock is moved, and one queued behind the
// lock is fenced afterwards rather than lost.
func TestCreateTreeWaitsForWriters(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cat := ctConnect(t, ctx, testNodeDSN(t, 0))
	c := ctCluster(t, 2)
	store := ctStore(t)
	ctExec(t, ctx, cat, `CREATE TABLE stock (sku text PRIMARY KEY, n int)`,
		`INSERT INTO stock SELECT 's' || i, i FROM generate_series(1, 100) i`)

	early := ctEarlyWrite(t, ctx, cat)
	created := make(chan error, 1)
	go func() {
		_, _, err := c.CreateTree(ctx, store, pgshard.TreeSpec{Table: "stock", KeyColumn: "sku", ShardCount: 2})
		created <- err
	}()
	ctWaitLock(t, ctx, cat, "ExclusiveLock")

	late := ctConnect(t, ctx, testNodeDSN(t, 0))
	lateErr := make(chan error, 1)
	go func() {
		_, err := late.Exec(ctx, `INSERT INTO stock VALUES ('late', 1)`)
		lateErr <- err
	}()
	ctWaitLock(t, ctx, cat, "RowExclusiveLock")
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-created; err != nil {
		t.Fatalf("CreateTree: %v", err)
	}
	var pgErr *pgconn.PgError
	if err := <-lateErr; !errors.As(err, &pgErr) || pgErr.Code != sqlstate.SlotMoved {
		t.Errorf("late write: %v, want %s", err, sqlstate.SlotMoved)
	}
	var found int
	for i := 0; i < 2; i++ {
		conn := ctConnect(t, ctx, testNodeDSN(t, i))
		var n int
		for idx := i; idx < 2; idx += 2 {
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+shardmap.SchemaName(idx)+`.stock WHERE sku = 'early'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			found += n
		}
	}
	if found != 1 {
		t.Errorf("the early write is in %d shards, want 1", found)
	}
}

// TestCreateTreeRetriesStaleWrites: writes through a proxy that planned
// them before the table became a tree (here, while they waited for the
// creation's lock; in TestNodePoolsFollowRegistry, just after another
// proxy made the tree) get LT001 from the template's fence. The proxy
// routes them again on its refreshed map, in both protocols, so each lands
// once in the tree and the client sees no error.
func TestCreateTreeRetriesStaleWrites(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	writer, creator := startProxy(t, 2), startProxy(t, 2)
	cw := connect(t, writer.DSN("lattice"))
	mustExec(t, cw, `CREATE TABLE stock (sku text PRIMARY KEY, n int)`)
	mustExec(t, cw, `INSERT INTO stock SELECT 's' || i, i FROM generate_series(1, 10) i`)
	// Each writer's statement is prepared before the creation: a Parse of
	// the INSERT would wait for its lock and so be planned afterwards.
	modes := map[string]pgx.QueryExecMode{"simple": pgx.QueryExecModeSimpleProtocol, "extended": pgx.QueryExecModeCacheStatement}
	writers := map[string]*pgx.Conn{}
	for name, mode := range modes {
		writers[name] = connect(t, writer.DSN("lattice"))
		mustExec(t, writers[name], `INSERT INTO stock VALUES ($1, $2)`, mode, name+" before", 1)
	}
	// A prepared statement that becomes one for several shards cannot be
	// bound again behind the client's back: it gets LT001 with a hint.
	many := connect(t, writer.DSN("lattice"))
	mustExec(t, many, `DELETE FROM stock WHERE n = $1`, 99)
	cat := ctConnect(t, ctx, testNodeDSN(t, 0))
	early := ctEarlyWrite(t, ctx, cat)
	created := make(chan error, 1)
	go func() {
		_, err := connect(t, creator.DSN("lattice")).Exec(ctx, `SELECT lattice_create_tree('stock', 'sku', shard_count => 2)`)
		created <- err
	}()
	ctWaitLock(t, ctx, cat, "ExclusiveLock")

	late := make(chan error, len(modes))
	for name, mode := range modes {
		go func() {
			_, err := writers[name].Exec(ctx, `INSERT INTO stock VALUES ($1, $2)`, mode, name, 0)
			if err != nil {
				err = fmt.Errorf("%s protocol: %w", name, err)
			}
			late <- err
		}()
	}
	manyErr := make(chan error, 1)
	go func() {
		_, err := many.Exec(ctx, `DELETE FROM stock WHERE n = $1`, 99)
		manyErr <- err
	}()
	pollUntil(t, time.Minute, "the writes to wait for the creation's lock", func() (bool, error) {
		var n int
		err := cat.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'relation' AND mode = 'RowExclusiveLock'`).Scan(&n)
		return n == len(modes)+1, err
	})
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-created; err != nil {
		t.Fatalf("lattice_create_tree: %v", err)
	}
	for range modes {
		if err := <-late; err != nil {
			t.Errorf("a write planned before the table was a tree: %v, want it routed again", err)
		}
	}
	var pgErr *pgconn.PgError
	if err := <-manyErr; !errors.As(err, &pgErr) || pgErr.Code != sqlstate.SlotMoved || !strings.Contains(pgErr.Hint, "run it again") {
		t.Errorf("a prepared write for several shards: %v, want LT001 with a hint to run it again", err)
	}
	mustExec(t, many, `DELETE FROM stock WHERE n = $1`, 99)
	for _, p := range []*proxyProc{writer, creator} {
		var n int
		c := connect(t, p.DSN("lattice"))
		if err := c.QueryRow(ctx, `SELECT count(*) FROM stock`).Scan(&n); err != nil || n != 15 {
			t.Errorf("rows of the tree = %d, %v; want 15", n, err)
		}
		rows, _ := c.Query(ctx, `SELECT sku FROM stock WHERE n = 0 ORDER BY sku`)
		if late, err := pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || !slices.Equal(late, []string{"extended", "simple"}) {
			t.Errorf("late rows of the tree = %v, %v; want the two writes", late, err)
		}
	}
}

// TestCreateTreeWaitsForProxies: lattice_create_tree returns once every
// proxy routes by the new tree, so that a statement through any proxy
// after it reads the tree, not the emptied template. Proxy A is stopped
// (SIGSTOP) while B makes the tree: A can neither learn of it nor
// acknowledge, so B's call waits until A runs again. Before, it returned
// at once, and a read through A before A's cache caught up found no rows.
// A tree joining a colocation group is waited for under its own name: its
// group's map, and so its epoch, A knows already.
func TestCreateTreeWaitsForProxies(t *testing.T) {
	for _, tc := range []struct{ name, create string }{
		{"alone", `SELECT lattice_create_tree('stock', 'sku', shard_count => 2)`},
		{"colocated", `SELECT lattice_create_tree('stock', 'sku', colocate_with => 'anchor')`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resetNodes(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			a, b := startProxy(t, 2), startProxy(t, 2)
			ca := connect(t, a.DSN("lattice"))
			mustExec(t, ca, `CREATE TABLE anchor (sku text PRIMARY KEY)`)
			mustExec(t, ca, `SELECT lattice_create_tree('anchor', 'sku', shard_count => 2)`)
			mustExec(t, ca, `CREATE TABLE stock (sku text PRIMARY KEY, n int)`)
			mustExec(t, ca, `INSERT INTO stock SELECT 's' || i, i FROM generate_series(1, 100) i`)
			store, err := shardmap.OpenRedis(ctx, testRedisURL(t))
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()

			pid := a.cmd.Process.Pid
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					_ = syscall.Kill(pid, syscall.SIGCONT)
				}
			}
			defer resume()
			created := make(chan error, 1)
			go func() {
				_, err := connect(t, b.DSN("lattice")).Exec(ctx, tc.create)
				created <- err
			}()
			pollUntil(t, time.Minute, "the tree to be registered", func() (bool, error) {
				_, err := store.Tree(ctx, "lattice", "stock")
				return err == nil, nil
			})
			select {
			case err := <-created:
				t.Fatalf("lattice_create_tree returned (%v) while proxy A could not know the tree", err)
			case <-time.After(2 * time.Second):
			}
			resume()
			if err := <-created; err != nil {
				t.Fatalf("lattice_create_tree: %v", err)
			}
			var n int
			if err := ca.QueryRow(ctx, `SELECT count(*) FROM stock`).Scan(&n); err != nil || n != 100 {
				t.Errorf("through proxy A after the creation: %d rows, %v; want 100", n, err)
			}
		})
	}
}

// TestStaleRetryNotAfterRows: a statement whose LT001 comes after some of
// its rows reached the client is not routed again: the client would get
// those rows twice. Here a SELECT on the catalog node sends two rows and
// then calls a function that writes to a tree's fenced template, which
// stands for any statement that finds a template fenced midway.
func TestStaleRetryNotAfterRows(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := connect(t, startProxy(t, 2).DSN("lattice"))
	mustExec(t, c, `CREATE TABLE fenced (k int PRIMARY KEY)`)
	mustExec(t, c, `SELECT lattice_create_tree('fenced', 'k', shard_count => 2)`)
	// Made on the node: the proxy refuses a function whose body uses a
	// tree (router/body.go).
	mustExec(t, connect(t, testNodeDSN(t, 0)), `CREATE FUNCTION write_template(g int) RETURNS int LANGUAGE sql AS
		'INSERT INTO public.fenced VALUES (g) RETURNING k'`)
	for name, mode := range map[string]pgx.QueryExecMode{"simple": pgx.QueryExecModeSimpleProtocol, "extended": pgx.QueryExecModeCacheStatement} {
		rows, _ := c.Query(ctx, `SELECT CASE WHEN g < 3 THEN g ELSE write_template(g) END FROM generate_series(1, 5) g`, mode)
		var got []int32
		for rows.Next() {
			var g int32
			if err := rows.Scan(&g); err != nil {
				t.Fatal(err)
			}
			got = append(got, g)
		}
		err := rows.Err()
		if pgCode(err) != sqlstate.SlotMoved || !slices.Equal(got, []int32{1, 2}) {
			t.Errorf("%s protocol: rows %v, %v; want 1 and 2 once, then LT001", name, got, err)
		}
	}
}

// ctEarlyWrite opens a transaction on the catalog node that has written
// the row 'early' to stock, so that a creation of the tree waits for it.
func ctEarlyWrite(t *testing.T, ctx context.Context, cat *pgx.Conn) pgx.Tx {
	t.Helper()
	early, err := cat.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := early.Exec(ctx, `INSERT INTO stock VALUES ('early', 1)`); err != nil {
		t.Fatal(err)
	}
	return early
}

// ctWaitLock waits until some session waits for a lock of mode on a table.
func ctWaitLock(t *testing.T, ctx context.Context, conn *pgx.Conn, mode string) {
	t.Helper()
	for {
		var waiting bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND locktype = 'relation' AND mode = $1)`, mode).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no session waits for %s", mode)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestCreateTreeNewTenant checks that a tenant database missing on a node
// is created there when a tree of that tenant is.
func TestCreateTreeNewTenant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const tenant = "lattice_ct_tenant"
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for i := 0; i < 2; i++ {
			conn, err := pgx.Connect(ctx, testNodeDSN(t, i))
			if err != nil {
				t.Fatal(err)
			}
			_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+tenant+" WITH (FORCE)")
			conn.Close(ctx)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	drop()
	c := ctCluster(t, 2)
	t.Cleanup(func() { c.Close(); drop() })
	ctExec(t, ctx, ctConnect(t, ctx, testNodeDSN(t, 0)), "CREATE DATABASE "+tenant)
	dsn0, err := c.TenantDSN("n1", tenant)
	if err != nil {
		t.Fatal(err)
	}
	ctExec(t, ctx, ctConnect(t, ctx, dsn0), `CREATE TABLE accounts (id uuid PRIMARY KEY, owner text)`,
		`INSERT INTO accounts SELECT gen_random_uuid(), 'o' || i FROM generate_series(1, 300) i`)

	tree, m, err := c.CreateTree(ctx, ctStore(t), pgshard.TreeSpec{Tenant: tenant, Table: "accounts", KeyColumn: "id", ShardCount: 2})
	if err != nil {
		t.Fatalf("CreateTree: %v", err)
	}
	if tree.Tenant != tenant || m.Tenant != tenant {
		t.Errorf("tenant %q / %q", tree.Tenant, m.Tenant)
	}
	dsn1, err := c.TenantDSN("n2", tenant)
	if err != nil {
		t.Fatal(err)
	}
	var n1, n2 int64
	if err := ctConnect(t, ctx, dsn0).QueryRow(ctx, "SELECT count(*) FROM lattice_s0000.accounts").Scan(&n1); err != nil {
		t.Fatal(err)
	}
	if err := ctConnect(t, ctx, dsn1).QueryRow(ctx, "SELECT count(*) FROM lattice_s0001.accounts").Scan(&n2); err != nil {
		t.Fatal(err)
	}
	if n1+n2 != 300 || n1 == 0 || n2 == 0 {
		t.Errorf("shards hold %d + %d rows, want 300 over both", n1, n2)
	}
	own, err := c.ReadOwnership(ctx, tenant)
	if err != nil || len(own["accounts"]) != 2 {
		t.Errorf("ownership %+v, %v", own, err)
	}
	// A tenant with no database anywhere but the catalog has no shards.
	if own, err := c.ReadOwnership(ctx, "lattice_ct_nowhere"); err != nil || len(own) != 0 {
		t.Errorf("ownership of a missing tenant: %+v, %v", own, err)
	}
}

// TestShardLifecycle checks CreateShard is idempotent, WriteOwnership never
// lowers the epoch, and DropShard drops the schema with its last shard only.
func TestShardLifecycle(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := ctCluster(t, 2)
	a := &shardmap.Tree{Tenant: "lattice", Name: "a", KeyColumn: "k", KeyType: shardmap.KeyText, SlotCount: 4096,
		DDL: []string{"CREATE TABLE {{table}} (k text PRIMARY KEY, v int)", "CREATE INDEX a_v ON {{table}} (v)"}}
	b := &shardmap.Tree{Tenant: "lattice", Name: "b", KeyColumn: "k", KeyType: shardmap.KeyInt, SlotCount: 4096,
		DDL: []string{"CREATE TABLE {{table}} (k int PRIMARY KEY)"}}
	conn := ctConnect(t, ctx, testNodeDSN(t, 1))
	ownership := func(tree string) (int64, string) {
		var epoch int64
		var slots string
		err := conn.QueryRow(ctx, `SELECT epoch, slots::text FROM lattice_s0003.lattice_owner WHERE tree = $1`, tree).Scan(&epoch, &slots)
		if err != nil {
			t.Fatal(err)
		}
		return epoch, slots
	}

	if err := c.CreateShard(ctx, a, 3, "n2", [][2]int{{0, 1023}}, 1); err != nil {
		t.Fatal(err)
	}
	ctExec(t, ctx, conn, `INSERT INTO lattice_s0003.a VALUES ('x', 1)`)
	if err := c.CreateShard(ctx, a, 3, "n2", [][2]int{{0, 511}, {2048, 2049}}, 2); err != nil {
		t.Fatalf("CreateShard again: %v", err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM lattice_s0003.a").Scan(&n); err != nil || n != 1 {
		t.Errorf("re-created shard holds %d rows, %v", n, err)
	}
	if e, s := ownership("a"); e != 2 || s != "{[0,512),[2048,2050)}" {
		t.Errorf("ownership epoch %d slots %s", e, s)
	}
	if err := c.WriteOwnership(ctx, a, 3, "n2", [][2]int{{0, 4095}}, 1); err != nil {
		t.Fatal(err)
	}
	if e, s := ownership("a"); e != 2 || s != "{[0,512),[2048,2050)}" {
		t.Errorf("an older epoch overwrote the record: epoch %d slots %s", e, s)
	}
	if err := c.WriteOwnership(ctx, a, 3, "n2", nil, 5); err != nil {
		t.Fatal(err)
	}
	if e, s := ownership("a"); e != 5 || s != "{}" {
		t.Errorf("ownership epoch %d slots %s, want 5 {}", e, s)
	}

	if err := c.CreateShard(ctx, b, 3, "n2", [][2]int{{1024, 2047}}, 7); err != nil {
		t.Fatal(err)
	}
	own, err := c.ReadOwnership(ctx, "lattice")
	if err != nil {
		t.Fatal(err)
	}
	if got := own["b"]; len(got) != 1 || got[0].Shard != 3 || got[0].Node != "n2" || got[0].Epoch != 7 || !slices.Equal(got[0].Slots, [][2]int{{1024, 2047}}) {
		t.Errorf("ownership of b: %+v", got)
	}
	if got := own["a"]; len(got) != 1 || got[0].Epoch != 5 || len(got[0].Slots) != 0 {
		t.Errorf("ownership of a: %+v", got)
	}

	schemaExists := func() bool {
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT to_regnamespace('lattice_s0003') IS NOT NULL`).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if err := c.DropShard(ctx, a, 3, "n2"); err != nil {
		t.Fatal(err)
	}
	if !schemaExists() {
		t.Fatal("DropShard of a dropped the schema b's shard lives in")
	}
	if err := c.DropShard(ctx, b, 3, "n2"); err != nil {
		t.Fatal(err)
	}
	if schemaExists() {
		t.Error("the schema outlived its last shard")
	}
	if err := c.DropShard(ctx, b, 3, "n2"); err != nil {
		t.Errorf("DropShard of a shard that is gone: %v", err)
	}
	if err := c.DropShard(ctx, b, 9, "n1"); err != nil {
		t.Errorf("DropShard of a shard never created: %v", err)
	}
}

// TestEnsureTenantConcurrent creates one tenant's database on a node from
// several clusters at once, as proxies placing shards at the same moment
// would: each call succeeds, whichever CREATE DATABASE wins, and a second
// round finds the database there.
func TestEnsureTenantConcurrent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const tenant = "lattice_ensure_tenant"
	admin := ctConnect(t, ctx, testNodeDSN(t, 1))
	drop := func() { ctExec(t, ctx, admin, "DROP DATABASE IF EXISTS "+tenant+" WITH (FORCE)") }
	for round := 0; round < 5; round++ {
		drop()
		clusters := make([]*pgshard.Cluster, 8)
		for i := range clusters {
			clusters[i] = ctCluster(t, 2)
		}
		errs := make([]error, len(clusters))
		var wg sync.WaitGroup
		for i, c := range clusters {
			wg.Go(func() { errs[i] = c.EnsureTenant(ctx, "n2", tenant) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, cluster %d: %v", round, i, err)
			}
		}
		if err := clusters[0].EnsureTenant(ctx, "n2", tenant); err != nil {
			t.Fatalf("round %d, again: %v", round, err)
		}
	}
	drop()
}
