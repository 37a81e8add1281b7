package integration

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

const ddlShards = 16

// ddlTables lists, on every node, the tables named name in public (the
// template, on the catalog node n1) and in the shard schemas, as
// "node/schema".
func ddlTables(t *testing.T, nodes []*pgx.Conn, name string) []string {
	t.Helper()
	var out []string
	for i, c := range nodes {
		rows, err := queryStrings(t, c, `SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = $1 AND c.relkind = 'r' AND (n.nspname = 'public' OR n.nspname LIKE 'lattice\_s%') ORDER BY 1`, name)
		if err != nil {
			t.Fatalf("node n%d: %v", i+1, err)
		}
		for _, s := range rows {
			out = append(out, fmt.Sprintf("n%d/%s", i+1, s))
		}
	}
	return out
}

// ddlDefOf is the definition of one table as the catalog shows it, with the
// schema left out so that the template and every shard compare equal:
// columns (information_schema), constraints, indexes (pg_indexes) and the
// count of invalid indexes.
const ddlDefOf = `SELECT
  (SELECT coalesce(string_agg(column_name || ' ' || data_type || ' default=' || coalesce(column_default, '-') || ' null=' || is_nullable, ', ' ORDER BY ordinal_position), '')
     FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2)
  || E'\nconstraints: ' ||
  (SELECT coalesce(string_agg(conname || ' ' || pg_get_constraintdef(oid), ', ' ORDER BY conname), '')
     FROM pg_constraint WHERE conrelid = (quote_ident($1) || '.' || quote_ident($2))::regclass)
  || E'\nindexes: ' ||
  (SELECT coalesce(string_agg(indexname || ' ' || replace(indexdef, ' ON ' || quote_ident($1) || '.', ' ON '), ', ' ORDER BY indexname), '')
     FROM pg_indexes WHERE schemaname = $1 AND tablename = $2)
  || E'\ninvalid: ' ||
  (SELECT count(*) FROM pg_index WHERE indrelid = (quote_ident($1) || '.' || quote_ident($2))::regclass AND NOT indisvalid)`

// ddlDef checks that the template and all shards of tree name have one
// definition, and returns it.
func ddlDef(t *testing.T, nodes []*pgx.Conn, name string) string {
	t.Helper()
	tables := ddlTables(t, nodes, name)
	if len(tables) != ddlShards+1 {
		t.Fatalf("tables of %s: %v, want the template and %d shards", name, tables, ddlShards)
	}
	var def, first string
	for _, tb := range tables {
		var node int
		var schema string
		if _, err := fmt.Sscanf(strings.Replace(tb, "/", " ", 1), "n%d %s", &node, &schema); err != nil {
			t.Fatal(err)
		}
		var d string
		if err := nodes[node-1].QueryRow(context.Background(), ddlDefOf, schema, name).Scan(&d); err != nil {
			t.Fatalf("%s: %v", tb, err)
		}
		if def == "" {
			def, first = d, tb
			continue
		}
		if d != def {
			t.Fatalf("definitions differ:\n%s:\n%s\n%s:\n%s", first, def, tb, d)
		}
	}
	return def
}

// TestDDLTree runs DDL on a tree of 16 shards over 3 nodes through the
// proxy, in the simple and the extended protocol, and checks on every node
// that the template and every shard table have the same, expected
// definition; then that refused DDL changes nothing, that the DDL log
// builds the same table for a new shard, TRUNCATE, and DROP TABLE with the
// name reused.
func TestDDLTree(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	nodes := make([]*pgx.Conn, 3)
	for i := range nodes {
		nodes[i] = connect(t, testNodeDSN(t, i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	mustExec(t, c, `CREATE TABLE items (id bigint PRIMARY KEY, name text, price numeric(10,2), qty integer)`)
	mustExec(t, c, `INSERT INTO items SELECT i, 'item ' || i, i / 10.0, i % 7 FROM generate_series(1, 500) i`)
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('items', 'id', shard_count => %d)`, ddlShards))
	ddlDef(t, nodes, "items")

	simple := pgx.QueryExecModeSimpleProtocol
	extended := pgx.QueryExecModeDescribeExec
	steps := []struct {
		sql     string
		mode    pgx.QueryExecMode
		has     []string // in the definition afterwards
		hasNot  []string // not in it
		wantTag string
	}{
		{sql: `ALTER TABLE items ADD COLUMN color text DEFAULT 'red'`, mode: simple, has: []string{"color text default='red'::text null=YES"}, wantTag: "ALTER TABLE"},
		{sql: `ALTER TABLE public.items ALTER COLUMN qty TYPE bigint`, mode: extended, has: []string{"qty bigint"}},
		{sql: `ALTER TABLE items ALTER COLUMN price SET DEFAULT 0`, mode: simple, has: []string{"price numeric default=0 null=YES"}},
		{sql: `ALTER TABLE items ALTER COLUMN name SET NOT NULL`, mode: extended, has: []string{"name text default=- null=NO"}},
		{sql: `ALTER TABLE items ADD CONSTRAINT price_nonneg CHECK (price >= 0)`, mode: simple, has: []string{"price_nonneg CHECK ((price >= (0)::numeric))"}},
		{sql: `ALTER TABLE items ADD CONSTRAINT items_id_name UNIQUE (id, name)`, mode: extended,
			has: []string{"items_id_name UNIQUE (id, name)", "items_id_name CREATE UNIQUE INDEX items_id_name ON items USING btree (id, name)"}},
		{sql: `ALTER TABLE items DROP CONSTRAINT items_id_name`, mode: simple, hasNot: []string{"items_id_name"}},
		{sql: `ALTER TABLE items RENAME COLUMN color TO colour`, mode: extended, has: []string{"colour text"}, hasNot: []string{"color text"}},
		{sql: `ALTER TABLE items DROP COLUMN colour`, mode: simple, hasNot: []string{"colour"}},
		{sql: `CREATE INDEX items_name ON items (name)`, mode: simple, has: []string{"items_name CREATE INDEX items_name ON items USING btree (name)"}, wantTag: "CREATE INDEX"},
		{sql: `CREATE INDEX CONCURRENTLY items_qty ON items (qty) WHERE qty > 0`, mode: simple, has: []string{"items_qty CREATE INDEX items_qty ON items USING btree (qty) WHERE (qty > 0)", "invalid: 0"}},
		{sql: `CREATE UNIQUE INDEX items_name_id ON items (name, id)`, mode: extended, has: []string{"items_name_id CREATE UNIQUE INDEX items_name_id ON items USING btree (name, id)"}},
		{sql: `DROP INDEX items_name`, mode: simple, hasNot: []string{"items_name "}, wantTag: "DROP INDEX"},
		{sql: `DROP INDEX CONCURRENTLY public.items_name_id`, mode: extended, hasNot: []string{"items_name_id"}},
	}
	for _, st := range steps {
		t.Run(st.sql, func(t *testing.T) {
			tag, err := c.Exec(ctx, st.sql, st.mode)
			if err != nil {
				t.Fatalf("through the proxy: %v", err)
			}
			if st.wantTag != "" && tag.String() != st.wantTag {
				t.Errorf("tag %q, want %q", tag.String(), st.wantTag)
			}
			def := ddlDef(t, nodes, "items")
			for _, h := range st.has {
				if !strings.Contains(def, h) {
					t.Errorf("definition lacks %q:\n%s", h, def)
				}
			}
			for _, h := range st.hasNot {
				if strings.Contains(def, h) {
					t.Errorf("definition still has %q:\n%s", h, def)
				}
			}
		})
	}
	if t.Failed() {
		return
	}
	def := ddlDef(t, nodes, "items")

	// The rows are still there, and the new column list routes INSERT
	// without a column list.
	if ids, err := queryStrings(t, c, `SELECT id FROM items WHERE price >= 0`); err != nil || len(ids) != 500 {
		t.Fatalf("%d rows, %v; want 500", len(ids), err)
	}
	mustExec(t, c, `INSERT INTO items VALUES (1001, 'new', 1.5, 3)`)

	t.Run("refused", func(t *testing.T) {
		cases := []struct{ sql, code string }{
			{`ALTER TABLE items DROP COLUMN id`, "0A000"},
			{`ALTER TABLE items ALTER COLUMN id TYPE text`, "0A000"},
			{`ALTER TABLE items RENAME COLUMN id TO ident`, "0A000"},
			{`ALTER TABLE items RENAME TO goods`, "0A000"},
			{`ALTER TABLE items SET SCHEMA lattice_meta`, "0A000"},
			{`ALTER TABLE items ADD CONSTRAINT name_uq UNIQUE (name)`, "42P16"},
			{`CREATE UNIQUE INDEX name_uq ON items (name)`, "42P16"},
			{`ALTER TABLE items ADD CONSTRAINT ex EXCLUDE USING btree (name WITH =)`, "42P16"},
			{`ALTER TABLE items ADD COLUMN n bigserial`, "0A000"},
			{`ALTER TABLE items ADD COLUMN other_id int REFERENCES other.nothing (id)`, "0A000"},
			{`ALTER TABLE items ADD COLUMN other_id int REFERENCES lattice_meta.nothing (id)`, "42501"},
			// On the key it is allowed, for lattice_create_tree to colocate
			// the table (TestCreateTreeForeignKeys); on another column never.
			{`CREATE TABLE lines (item_id bigint REFERENCES items (name))`, "0A000"},
			{`ALTER TABLE items ENABLE ROW LEVEL SECURITY`, "0A000"},
			{`TRUNCATE items, lines`, "0A000"},
			{`ALTER INDEX items_pkey RENAME TO items_key`, "0A000"},
			{`DROP INDEX items_pkey, no_such_index`, "0A000"},
			// Only the catalog knows this is the primary key: checked on the
			// template inside the statement's transaction.
			{`ALTER TABLE items DROP CONSTRAINT items_pkey`, "42P16"},
			// PostgreSQL rejects it on the template: nothing changes anywhere.
			{`ALTER TABLE items ADD COLUMN name text`, "42701"},
			{`ALTER TABLE items ALTER COLUMN price SET DEFAULT 'x'`, "22P02"},
		}
		for _, tc := range cases {
			_, err := c.Exec(ctx, tc.sql, simple)
			if got := pgCode(err); got != tc.code {
				t.Errorf("%s: error %v (SQLSTATE %q), want SQLSTATE %s", tc.sql, err, got, tc.code)
			}
		}
		// Inside a transaction block: refused, and the transaction is aborted.
		mustExec(t, c, `BEGIN`)
		_, err := c.Exec(ctx, `ALTER TABLE items ADD COLUMN x int`, simple)
		if pgCode(err) != "25001" {
			t.Errorf("ALTER TABLE in a transaction block: %v, want SQLSTATE 25001", err)
		}
		mustExec(t, c, `ROLLBACK`)
		if got := ddlDef(t, nodes, "items"); got != def {
			t.Errorf("refused DDL changed the tree:\n%s\nwas:\n%s", got, def)
		}
	})

	t.Run("pipeline", func(t *testing.T) {
		// In one batch after a write that holds an implicit transaction on
		// a shard, DDL on the tree would wait for it: refused.
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO items (id, name, price, qty) VALUES ($1, 'p', 1, 1)`, 2001)
		b.Queue(`ALTER TABLE items ADD COLUMN z int`)
		err := c.SendBatch(ctx, b).Close()
		if pgCode(err) != "0A000" {
			t.Errorf("DDL after a write in one pipeline: %v, want SQLSTATE 0A000", err)
		}
		if got := ddlDef(t, nodes, "items"); got != def {
			t.Errorf("refused pipeline changed the tree:\n%s", got)
		}
	})

	t.Run("log replays to a new shard", func(t *testing.T) {
		store := harnessStore(t)
		tree, err := store.Tree(ctx, "lattice", "items")
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"id", "name", "price", "qty"}; strings.Join(tree.Columns, ",") != strings.Join(want, ",") {
			t.Errorf("registry columns %v, want %v", tree.Columns, want)
		}
		cl := ctCluster(t, 3)
		const idx = 999
		if err := cl.CreateShard(ctx, tree, idx, "n2", nil, 1); err != nil {
			t.Fatalf("create shard from the DDL log %q: %v", tree.DDL, err)
		}
		defer func() {
			if err := cl.DropShard(context.Background(), tree, idx, "n2"); err != nil {
				t.Error(err)
			}
		}()
		var got string
		if err := nodes[1].QueryRow(ctx, ddlDefOf, shardmap.SchemaName(idx), "items").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != def {
			t.Errorf("shard built from the DDL log:\n%s\nwant (template and shards):\n%s\nlog: %q", got, def, tree.DDL)
		}
	})

	t.Run("truncate", func(t *testing.T) {
		tag, err := c.Exec(ctx, `TRUNCATE items`)
		if err != nil {
			t.Fatal(err)
		}
		if tag.String() != "TRUNCATE TABLE" {
			t.Errorf("tag %q", tag.String())
		}
		total := 0
		for _, tb := range ddlTables(t, nodes, "items") {
			var node int
			var schema string
			fmt.Sscanf(strings.Replace(tb, "/", " ", 1), "n%d %s", &node, &schema)
			var k int
			if err := nodes[node-1].QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "items"}.Sanitize()).Scan(&k); err != nil {
				t.Fatal(err)
			}
			total += k
		}
		if total != 0 {
			t.Errorf("%d rows left after TRUNCATE", total)
		}
	})

	t.Run("drop and create again", func(t *testing.T) {
		tag, err := c.Exec(ctx, `DROP TABLE items`)
		if err != nil {
			t.Fatal(err)
		}
		if tag.String() != "DROP TABLE" {
			t.Errorf("tag %q", tag.String())
		}
		if left := ddlTables(t, nodes, "items"); len(left) != 0 {
			t.Fatalf("tables left after DROP TABLE: %v", left)
		}
		trees, err := queryStrings(t, c, `SELECT * FROM lattice_trees()`)
		if err != nil {
			t.Fatal(err)
		}
		if len(trees) != 0 {
			t.Fatalf("lattice_trees() after DROP TABLE: %v", trees)
		}
		mustExec(t, c, `CREATE TABLE items (id text PRIMARY KEY, v int)`)
		mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('items', 'id', shard_count => %d)`, ddlShards))
		mustExec(t, c, `INSERT INTO items (id, v) VALUES ('a', 1), ('b', 2)`)
		var v int
		if err := c.QueryRow(ctx, `SELECT v FROM items WHERE id = 'b'`).Scan(&v); err != nil || v != 2 {
			t.Fatalf("read back from the re-created tree: %d, %v", v, err)
		}
		if def := ddlDef(t, nodes, "items"); !strings.Contains(def, "id text") {
			t.Errorf("re-created tree: %s", def)
		}
	})
}

// TestDDLCreateIndexConcurrentlyFailure: CREATE INDEX CONCURRENTLY that fails
// on one shard (its expression fails on a row there) leaves no index, valid or
// invalid, on any table of the tree, and nothing in the DDL log.
func TestDDLCreateIndexConcurrentlyFailure(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	nodes := make([]*pgx.Conn, 3)
	for i := range nodes {
		nodes[i] = connect(t, testNodeDSN(t, i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	mustExec(t, c, `CREATE TABLE dup (id bigint PRIMARY KEY, v int)`)
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('dup', 'id', shard_count => %d)`, ddlShards))
	before := ddlDef(t, nodes, "dup")
	// One row in one shard makes the index expression fail there only; the
	// template (empty) and other shards get the index first.
	for _, row := range []string{"(1, 5)", "(2, 7)", "(7777, 0)"} {
		mustExec(t, c, `INSERT INTO dup (id, v) VALUES `+row)
	}
	_, err := c.Exec(ctx, `CREATE INDEX CONCURRENTLY dup_bad ON dup ((10 / v))`)
	if pgCode(err) != "22012" {
		t.Fatalf("CREATE INDEX CONCURRENTLY over a division by zero: %v, want SQLSTATE 22012", err)
	}
	if got := ddlDef(t, nodes, "dup"); got != before {
		t.Errorf("after the failed CREATE INDEX CONCURRENTLY:\n%s\nwant:\n%s", got, before)
	}
	store := harnessStore(t)
	tree, err := store.Tree(ctx, "lattice", "dup")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range tree.DDL {
		if strings.Contains(s, "dup_bad") {
			t.Errorf("failed index in the DDL log: %q", tree.DDL)
		}
	}
}

// TestDDLCatalogQueries runs psql's \d family and the catalog queries
// drivers run at connect through the proxy: a tree shows as one ordinary
// table (its template) with its indexes, and neither it nor a reference
// table shows Lattice's fence, which still refuses a direct write.
func TestDDLCatalogQueries(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Skip("psql is not installed")
	}
	resetNodes(t)
	p := startProxy(t, 3)
	c := connect(t, p.DSN("lattice"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	mustExec(t, c, `CREATE TABLE cat (id uuid PRIMARY KEY, title text NOT NULL, n int DEFAULT 3)`)
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('cat', 'id', shard_count => %d)`, ddlShards))
	mustExec(t, c, `CREATE INDEX cat_title ON cat (title)`)
	mustExec(t, c, `CREATE TABLE plain (x int)`)
	mustExec(t, c, `CREATE TABLE kinds (k int PRIMARY KEY, name text)`)
	mustExec(t, c, `SELECT lattice_create_reference_table('kinds')`)

	run := func(t *testing.T, cmd string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, psql, "-X", "-v", "ON_ERROR_STOP=1", "-d", p.DSN("lattice"), "-c", cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("psql -c %q: %v\n%s", cmd, err, out)
		}
		return string(out)
	}
	cases := []struct {
		cmd    string
		has    []string
		hasNot []string
	}{
		{cmd: `\d`, has: []string{"public | cat", "public | plain"}, hasNot: []string{"lattice_s"}},
		{cmd: `\dt`, has: []string{"public | cat   | table", "public | plain | table"}, hasNot: []string{"lattice_s", "lattice_owner"}},
		{cmd: `\d cat`, has: []string{`Table "public.cat"`, "id", "uuid", "title", "not null", "n      | integer", "Default", "| 3",
			`"cat_pkey" PRIMARY KEY, btree (id)`, `"cat_title" btree (title)`}, hasNot: []string{"lattice", "Triggers"}},
		{cmd: `\d+ cat`, has: []string{`Table "public.cat"`, "Storage", `"cat_title" btree (title)`, "Access method: heap"},
			hasNot: []string{"lattice", "Triggers"}},
		{cmd: `\d kinds`, has: []string{`Table "public.kinds"`, `"kinds_pkey" PRIMARY KEY, btree (k)`}, hasNot: []string{"lattice", "Triggers"}},
		{cmd: `\di`, has: []string{"cat_pkey", "cat_title"}, hasNot: []string{"lattice_s"}},
		{cmd: `\l`, has: []string{"lattice"}},
		{cmd: `\dn`, has: []string{"public", "lattice_meta"}},
	}
	for _, tc := range cases {
		t.Run(tc.cmd, func(t *testing.T) {
			out := run(t, tc.cmd)
			t.Logf("psql %s:\n%s", tc.cmd, out)
			for _, h := range tc.has {
				if !strings.Contains(out, h) {
					t.Errorf("psql %s lacks %q", tc.cmd, h)
				}
			}
			for _, h := range tc.hasNot {
				if strings.Contains(out, h) {
					t.Errorf("psql %s shows %q", tc.cmd, h)
				}
			}
		})
	}

	t.Run("fences", func(t *testing.T) {
		// Clients other than psql (pgAdmin, DBeaver) filter on tgisinternal
		// as psql does.
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
			var n int
			if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid IN ('cat'::regclass, 'kinds'::regclass) AND NOT tgisinternal`,
				mode).Scan(&n); err != nil || n != 0 {
				t.Errorf("triggers of cat and kinds that are not internal: %d, %v, want 0", n, err)
			}
		}
		// The tenant's role owns both tables on the catalog node: it may
		// disable its own triggers of the template, which must leave the
		// fence on (the reference guard refuses DDL on kinds outright).
		owner := connect(t, fmt.Sprintf("postgres://%s@127.0.0.1:%d/lattice?sslmode=disable", pgshard.TenantRole("lattice"), testNode(t, 0).Port))
		for _, table := range []string{"cat", "kinds"} {
			write := `DELETE FROM ` + table
			if _, err := owner.Exec(ctx, write); pgCode(err) != sqlstate.SlotMoved {
				t.Errorf("%s on the catalog node: %v, want %s", write, err, sqlstate.SlotMoved)
			}
			if _, err := owner.Exec(ctx, `ALTER TABLE `+table+` DISABLE TRIGGER ALL`); pgCode(err) != sqlstate.InsufficientPrivilege {
				t.Errorf("ALTER TABLE %s DISABLE TRIGGER ALL as its owner: %v, want %s", table, err, sqlstate.InsufficientPrivilege)
			}
			if table == "kinds" {
				continue
			}
			mustExec(t, owner, `ALTER TABLE `+table+` DISABLE TRIGGER USER`)
			if _, err := owner.Exec(ctx, write); pgCode(err) != sqlstate.SlotMoved {
				t.Errorf("%s after DISABLE TRIGGER USER: %v, want %s", write, err, sqlstate.SlotMoved)
			}
			mustExec(t, owner, `ALTER TABLE `+table+` ENABLE TRIGGER USER`)
		}
	})

	t.Run("index of an ordinary table", func(t *testing.T) {
		// ALTER and DROP INDEX of an index that is not a tree's run on the
		// catalog node unchanged, in both protocols.
		mustExec(t, c, `CREATE INDEX plain_x ON plain (x)`)
		if _, err := c.Exec(ctx, `ALTER INDEX plain_x RENAME TO plain_y`, pgx.QueryExecModeDescribeExec); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `DROP INDEX plain_y, public.no_such_index`, pgx.QueryExecModeSimpleProtocol); pgCode(err) != "42704" {
			t.Fatalf("DROP INDEX of a missing index: %v, want SQLSTATE 42704", err)
		}
		if _, err := c.Exec(ctx, `DROP INDEX plain_y`, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
		n1 := connect(t, testNodeDSN(t, 0))
		left, err := queryStrings(t, n1, `SELECT indexname FROM pg_indexes WHERE tablename = 'plain'`)
		if err != nil || len(left) != 0 {
			t.Fatalf("indexes of plain on n1: %v, %v", left, err)
		}
	})

	t.Run("driver queries", func(t *testing.T) {
		queries := []struct{ sql, want string }{
			{`SELECT version()`, "PostgreSQL 15"},
			{`SHOW server_version`, "15"},
			{`SELECT typname FROM pg_type WHERE oid = 'uuid'::regtype`, "uuid"},
			{`SELECT nspname FROM pg_namespace WHERE nspname = current_schema()`, "public"},
			{`SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM information_schema.columns WHERE table_schema = 'public' AND table_name = 'cat'`, "id,title,n"},
			{`SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public' AND table_name = 'cat'`, "1"},
		}
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
			for _, q := range queries {
				var got string
				if err := c.QueryRow(ctx, q.sql, mode).Scan(&got); err != nil {
					t.Fatalf("%s: %v", q.sql, err)
				}
				if !strings.Contains(got, q.want) {
					t.Errorf("%s = %q, want %q", q.sql, got, q.want)
				}
			}
		}
		// pgx loads a user-defined type's OID and structure from pg_type.
		mustExec(t, c, `CREATE TYPE mood AS ENUM ('ok', 'meh')`)
		typ, err := c.LoadType(ctx, "mood")
		if err != nil {
			t.Fatalf("pgx LoadType through the proxy: %v", err)
		}
		c.TypeMap().RegisterType(typ)
		var m string
		if err := c.QueryRow(ctx, `SELECT 'meh'::mood`).Scan(&m); err != nil || m != "meh" {
			t.Fatalf("enum round trip: %q, %v", m, err)
		}
	})
}

// TestDDLConcurrent runs DDL on one tree from several sessions of two
// proxies at once: every statement succeeds (they are serialised per tree),
// every table gets every change, and the DDL log holds all of them, so a
// shard built from it matches.
func TestDDLConcurrent(t *testing.T) {
	resetNodes(t)
	proxies := []*proxyProc{startProxy(t, 3), startProxy(t, 3)}
	nodes := make([]*pgx.Conn, 3)
	for i := range nodes {
		nodes[i] = connect(t, testNodeDSN(t, i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := connect(t, proxies[0].DSN("lattice"))
	mustExec(t, c, `CREATE TABLE conc (id bigint PRIMARY KEY)`)
	mustExec(t, c, fmt.Sprintf(`SELECT lattice_create_tree('conc', 'id', shard_count => %d)`, ddlShards))

	const sessions = 4
	conns := make([]*pgx.Conn, sessions)
	for i := range conns {
		conns[i] = connect(t, proxies[i%2].DSN("lattice"))
	}
	errs := make(chan error, sessions*2)
	for i, sc := range conns {
		go func() {
			_, err := sc.Exec(ctx, fmt.Sprintf(`ALTER TABLE conc ADD COLUMN c%d int`, i))
			if err == nil {
				_, err = sc.Exec(ctx, fmt.Sprintf(`CREATE INDEX conc_c%d ON conc (c%d)`, i, i))
			}
			errs <- err
		}()
	}
	for range conns {
		if err := <-errs; err != nil {
			t.Errorf("concurrent DDL: %v", err)
		}
	}
	def := ddlDef(t, nodes, "conc")
	for i := range sessions {
		for _, h := range []string{fmt.Sprintf("c%d integer", i), fmt.Sprintf("conc_c%d CREATE INDEX", i)} {
			if !strings.Contains(def, h) {
				t.Errorf("definition lacks %q:\n%s", h, def)
			}
		}
	}
	store := harnessStore(t)
	tree, err := store.Tree(ctx, "lattice", "conc")
	if err != nil {
		t.Fatal(err)
	}
	if len(tree.DDL) != 1+2*sessions || len(tree.Columns) != 1+sessions {
		t.Fatalf("registry after %d sessions: DDL %q, columns %v", sessions, tree.DDL, tree.Columns)
	}
	cl := ctCluster(t, 3)
	if err := cl.CreateShard(ctx, tree, 998, "n3", nil, 1); err != nil {
		t.Fatal(err)
	}
	defer cl.DropShard(context.Background(), tree, 998, "n3")
	// The columns come in the order the DDL ran, which the log keeps; the
	// template's order is the same.
	var got string
	if err := nodes[2].QueryRow(ctx, ddlDefOf, shardmap.SchemaName(998), "conc").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != def {
		t.Errorf("shard from the log:\n%s\nwant:\n%s", got, def)
	}
}
