package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// composeShard is one row of SELECT * FROM lattice_shards(...).
type composeShard struct {
	shard               int32
	node, schema, slots string
	slotCount           int32
	state               string
	rows                int64
}

// composeValue prints a value as the expectations are written: numerics
// as integers (every numeric here is a sum of integers).
func composeValue(v any) string {
	if n, ok := v.(pgtype.Numeric); ok {
		i, err := n.Int64Value()
		if err == nil && i.Valid {
			return fmt.Sprint(i.Int64)
		}
	}
	return fmt.Sprint(v)
}

// composeQuery runs sql and returns its columns (name:oid) and rows, each
// row's values printed with composeValue and joined by "|".
func composeQuery(ctx context.Context, c *pgx.Conn, sql string, args ...any) (string, []string, error) {
	rows, err := c.Query(ctx, sql, args...)
	if err != nil {
		return "", nil, err
	}
	defer rows.Close()
	var head []string
	for _, f := range rows.FieldDescriptions() {
		head = append(head, fmt.Sprintf("%s:%d", f.Name, f.DataTypeOID))
	}
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return "", nil, err
		}
		parts := make([]string, len(vals))
		for i, v := range vals {
			parts[i] = composeValue(v)
		}
		out = append(out, strings.Join(parts, "|"))
	}
	return strings.Join(head, ","), out, rows.Err()
}

// TestComposedFunctions runs lattice functions composed into larger SELECTs
// (aggregates, GROUP BY, WHERE and ORDER BY, a join of two functions, a
// CTE, a value in an expression, Bind parameters) through the proxy in the
// simple and extended protocols, in and out of a transaction block, and
// compares each with the rows expected from SELECT * FROM lattice_shards
// and lattice_trees computed in Go.
func TestComposedFunctions(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE cf (id bigint PRIMARY KEY, v text)`)
	mustExec(t, c, `INSERT INTO cf SELECT i, 'v' || i FROM generate_series(1, 2000) i`)
	mustExec(t, c, `SELECT lattice_create_tree('cf', 'id', shard_count => 8)`)
	mustExec(t, c, `CREATE TABLE cf_audit (n int)`)
	// A tree name with a quote, a double quote and a backslash: the rows
	// reach PostgreSQL as array literals.
	mustExec(t, c, `CREATE TABLE "q'u""o\te" (id bigint PRIMARY KEY)`)
	mustExec(t, c, `SELECT lattice_create_tree('"q''u""o\te"', 'id', shard_count => 2)`)
	// Exact, stable statistics: rows_estimate must not change between the
	// reads of the test (autovacuum does not analyse unchanged tables).
	for i := range 2 {
		n := connect(t, testNodeDSN(t, i))
		mustExec(t, n, `ANALYZE`)
	}

	var shards []composeShard
	rows, err := c.Query(ctx, `SELECT * FROM lattice_shards('cf')`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s composeShard
		var group *string                  // a tree alone: NULL
		var reads, writes, written float64 // no statement on cf's slots: 0
		if err := rows.Scan(&s.shard, &s.node, &s.schema, &s.slots, &s.slotCount, &s.state, &s.rows, &group, &reads, &writes, &written); err != nil {
			t.Fatal(err)
		}
		shards = append(shards, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(shards) != 8 {
		t.Fatalf("%d shards, want 8", len(shards))
	}
	// A call of no rows composes in both protocols (the extended one read
	// a first row that was not there and took the proxy down).
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM lattice_reference_tables() r WHERE r.nodes IS NOT NULL`, mode).Scan(&n); err != nil || n != 0 {
			t.Fatalf("a composed call of no rows (%v): %d, %v; want 0", mode, n, err)
		}
	}
	var keyColumn string
	var shardCount int32
	if err := c.QueryRow(ctx, `SELECT key_column, shard_count FROM (SELECT * FROM lattice_trees()) t WHERE tree = 'cf'`).Scan(&keyColumn, &shardCount); err != nil {
		t.Fatal(err)
	}

	// The expectations, from the plain function's rows.
	var all, active, joined, byNodeShard []string
	perNode := map[string]int64{}
	var total, slotSum int64
	for _, s := range shards {
		all = append(all, fmt.Sprintf("%d|%s|%s|%s|%d|%s|%d|<nil>|0|0|0", s.shard, s.node, s.schema, s.slots, s.slotCount, s.state, s.rows))
		if s.state == "active" {
			active = append(active, fmt.Sprint(s.shard))
		}
		joined = append(joined, fmt.Sprintf("%s|%d", keyColumn, s.shard))
		perNode[s.node] += s.rows
		total += s.rows
		slotSum += int64(s.slotCount)
	}
	var nodeSums []string
	for node, sum := range perNode {
		nodeSums = append(nodeSums, fmt.Sprintf("%s|%d", node, sum))
	}
	slices.Sort(nodeSums)
	node := shards[0].node
	for _, s := range shards {
		if s.node == node {
			byNodeShard = append(byNodeShard, fmt.Sprintf("%d|%d", s.shard, s.rows))
		}
	}
	var ordinal []string
	for i, s := range shards {
		ordinal = append(ordinal, fmt.Sprintf("%d|%d", s.shard, i+1))
	}
	const shardHead = "shard:23,node:25,schema:25,slot_ranges:25,slot_count:23,state:25,rows_estimate:20,colocation_group:25,reads_per_s:701,writes_per_s:701,rows_written_per_s:701"

	cases := []struct {
		sql     string
		args    []any
		head    string
		want    []string
		ordered bool
	}{
		{sql: `SELECT count(*) FROM lattice_shards('cf')`, head: "count:20", want: []string{"8"}},
		{sql: `SELECT node, sum(rows_estimate) FROM lattice_shards('cf') GROUP BY node ORDER BY node`, head: "node:25,sum:1700", want: nodeSums, ordered: true},
		{sql: `SELECT shard FROM lattice_shards('cf') WHERE state = 'active' ORDER BY 1`, head: "shard:23", want: active, ordered: true},
		{sql: `SELECT * FROM lattice_shards('cf') AS s WHERE s.slot_count > 0`, head: shardHead, want: all},
		{sql: `SELECT t.key_column, s.shard FROM lattice_trees() t JOIN lattice_shards('cf') s ON t.tree = 'cf' ORDER BY s.shard`,
			head: "key_column:25,shard:23", want: joined, ordered: true},
		{sql: `WITH s AS (SELECT * FROM lattice_shards('cf')) SELECT count(*), sum(slot_count), sum(rows_estimate) FROM s`,
			head: "count:20,sum:20,sum:1700", want: []string{fmt.Sprintf("8|%d|%d", slotSum, total)}},
		{sql: `SELECT lattice_reshard_complete('cf') AND true`, head: "?column?:16", want: []string{"true"}},
		{sql: `SELECT lattice_reshard_complete('cf'), 1 AS one`, head: "lattice_reshard_complete:16,one:23", want: []string{"true|1"}},
		{sql: `SELECT * FROM lattice_reshard_complete('cf') AS done`, head: "done:16", want: []string{"true"}},
		{sql: `SELECT (SELECT lattice_reshard_complete('cf')), (SELECT count(*) FROM lattice_shards('cf'))`,
			head: "lattice_reshard_complete:16,count:20", want: []string{"true|8"}},
		{sql: `SELECT shard, ordinality FROM lattice_shards('cf') WITH ORDINALITY ORDER BY ordinality`, head: "shard:23,ordinality:20", want: ordinal, ordered: true},
		{sql: `SELECT * FROM lattice_shards($1)`, args: []any{"cf"}, head: shardHead, want: all},
		{sql: `SELECT shard, rows_estimate FROM lattice_shards($1) WHERE node = $2 ORDER BY shard`, args: []any{"cf", node},
			head: "shard:23,rows_estimate:20", want: byNodeShard, ordered: true},
		{sql: `SELECT count(*) FROM lattice_shards(tree => $1) s JOIN lattice_shards($1) r USING (shard) WHERE s.node = r.node`, args: []any{"cf"},
			head: "count:20", want: []string{"8"}},
		{sql: `SELECT count(*) FROM lattice_shards('cf'), cf_audit`, head: "count:20", want: []string{"0"}},
		{sql: `SELECT tree, shard_count FROM lattice_trees() ORDER BY tree COLLATE "C"`, head: "tree:25,shard_count:23",
			want: []string{fmt.Sprintf("cf|%d", shardCount), `q'u"o\te|2`}, ordered: true},
		{sql: `SELECT count(*) FROM lattice_trees() t JOIN lattice_shards($1) s ON t.tree = $1`, args: []any{`q'u"o\te`},
			head: "count:20", want: []string{"2"}},
	}
	modes := []struct {
		name string
		mode pgx.QueryExecMode
	}{
		{"simple", pgx.QueryExecModeSimpleProtocol},
		{"extended", pgx.QueryExecModeCacheStatement},
		{"describe", pgx.QueryExecModeDescribeExec},
		{"exec", pgx.QueryExecModeExec},
	}
	check := func(t *testing.T, mode pgx.QueryExecMode, sql string, args []any, head string, want []string, ordered bool) {
		t.Helper()
		gotHead, got, err := composeQuery(ctx, c, sql, append([]any{mode}, args...)...)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		if !ordered {
			slices.Sort(got)
			want = slices.Sorted(slices.Values(want))
		}
		if gotHead != head || !slices.Equal(got, want) {
			t.Fatalf("%s:\ngot  %s %q\nwant %s %q", sql, gotHead, got, head, want)
		}
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			for _, tc := range cases {
				check(t, m.mode, tc.sql, tc.args, tc.head, tc.want, tc.ordered)
			}
		})
		// Inside a transaction block, after a write on the catalog node
		// that the statement then reads, and rolled back.
		t.Run(m.name+"/transaction", func(t *testing.T) {
			mustExec(t, c, `BEGIN`)
			if _, err := c.Exec(ctx, `INSERT INTO cf_audit VALUES (1), (2)`, m.mode); err != nil {
				t.Fatal(err)
			}
			check(t, m.mode, `SELECT count(*) FROM lattice_shards('cf'), cf_audit`, nil, "count:20", []string{"16"}, false)
			check(t, m.mode, `SELECT shard FROM lattice_shards($1) WHERE state = 'active' ORDER BY 1`, []any{"cf"}, "shard:23", active, true)
			mustExec(t, c, `ROLLBACK`)
			check(t, m.mode, `SELECT count(*) FROM lattice_shards('cf'), cf_audit`, nil, "count:20", []string{"0"}, false)
		})
	}

	// Refusals, in both protocols: a mix with the tree, a function that
	// changes the cluster, an argument the proxy cannot evaluate.
	for _, m := range modes {
		for _, r := range []struct{ sql, code, hint string }{
			{`SELECT * FROM lattice_shards('cf') s JOIN cf ON cf.id = s.shard`, "0A000", "separate statements"},
			{`SELECT lattice_reshard('cf', 4), 1`, "0A000", "statement of its own"},
			{`SELECT * FROM lattice_trees() t WHERE lattice_reshard_complete(t.tree)`, "0A000", "constants or $n"},
			{`SELECT count(*) FROM lattice_shards('nope')`, "42P01", ""},
		} {
			_, _, err := composeQuery(ctx, c, r.sql, m.mode)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != r.code || !strings.Contains(pe.Hint, r.hint) {
				t.Fatalf("%s %s: %v (hint %q), want %s with a hint naming %q", m.name, r.sql, err, composeHint(pe), r.code, r.hint)
			}
		}
	}

	// Describing a statement runs no function: a prepared lattice_reshard
	// starts nothing until it is executed.
	if _, err := c.Prepare(ctx, "reshard", `SELECT lattice_reshard($1, $2)`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Prepare(ctx, "composed", `SELECT count(*) FROM lattice_shards($1) WHERE lattice_reshard_complete($1)`); err != nil {
		t.Fatal(err)
	}
	var phase string
	if err := c.QueryRow(ctx, `SELECT phase FROM lattice_reshard_status('cf')`).Scan(&phase); err != nil || phase != "idle" {
		t.Fatalf("after Describe of lattice_reshard: phase %q, %v; want idle", phase, err)
	}
	check(t, pgx.QueryExecModeCacheStatement, "composed", []any{"cf"}, "count:20", []string{"8"}, false)
}

func composeHint(pe *pgconn.PgError) string {
	if pe == nil {
		return ""
	}
	return pe.Hint
}

// TestFunctionsInTransaction: lattice_create_tree is refused inside a
// transaction block (25001), and lattice_reshard acts at once there and is
// not undone by ROLLBACK (DESIGN section 7).
func TestFunctionsInTransaction(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	ctx := context.Background()
	c := connect(t, p.DSN("lattice"))
	mustExec(t, c, `CREATE TABLE cf_tx (id bigint PRIMARY KEY)`)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		mustExec(t, c, `BEGIN`)
		mustExec(t, c, `INSERT INTO cf_tx VALUES (1)`)
		// Without the refusal it would wait for the transaction's own lock.
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := c.Exec(cctx, `SELECT lattice_create_tree('cf_tx', 'id', shard_count => 2)`, mode)
		cancel()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "25001" || pe.Hint == "" {
			t.Fatalf("lattice_create_tree in a transaction block: %v, want 25001 with a hint", err)
		}
		mustExec(t, c, `ROLLBACK`)
	}
	mustExec(t, c, `SELECT lattice_create_tree('cf_tx', 'id', shard_count => 2)`)
	mustExec(t, c, `BEGIN`)
	mustExec(t, c, `SELECT lattice_reshard('cf_tx', 4)`)
	mustExec(t, c, `ROLLBACK`)
	var phase string
	var owning int64
	const status = `SELECT s.phase, (SELECT count(*) FROM lattice_shards('cf_tx') WHERE slot_count > 0) FROM lattice_reshard_status('cf_tx') s`
	if err := c.QueryRow(ctx, status).Scan(&phase, &owning); err != nil || phase == "idle" && owning != 4 {
		t.Fatalf("after ROLLBACK: phase %q, %d shards own slots (%v): lattice_reshard was undone", phase, owning, err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for phase != "idle" || owning != 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the reshard did not finish: phase %q, %d shards own slots", phase, owning)
		}
		time.Sleep(200 * time.Millisecond)
		if err := c.QueryRow(ctx, status).Scan(&phase, &owning); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRowEstimateBeforeAnalyse: a shard that was never analysed
// (pg_class.reltuples = -1) is estimated by the live rows the statistics
// system counts, in lattice_shards and in the migrator's placement, which
// share pgshard.ShardSizes.
func TestRowEstimateBeforeAnalyse(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 2)
	c := connect(t, p.DSN("lattice"))
	// Autovacuum would analyse the shards at its own time and hide the
	// fallback.
	mustExec(t, c, `CREATE TABLE fresh (id bigint PRIMARY KEY) WITH (autovacuum_enabled = false)`)
	mustExec(t, c, `SELECT lattice_create_tree('fresh', 'id', shard_count => 2)`)
	ids := make([][]any, 300)
	for i := range ids {
		ids[i] = []any{int64(i + 1)}
	}
	if _, err := c.CopyFrom(context.Background(), pgx.Identifier{"fresh"}, []string{"id"}, pgx.CopyFromRows(ids)); err != nil {
		t.Fatal(err)
	}
	// An idle backend reports its counts to the statistics system about
	// 10 s after its transaction's end (PGSTAT_IDLE_INTERVAL).
	var sum int64
	for deadline := time.Now().Add(40 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err := c.QueryRow(context.Background(), `SELECT coalesce(sum(rows_estimate), 0) FROM lattice_shards('fresh')`).Scan(&sum); err != nil {
			t.Fatal(err)
		}
		if sum == 300 {
			return
		}
	}
	t.Fatalf("the unanalysed shards' row estimates add up to %d, want the 300 live rows", sum)
}
