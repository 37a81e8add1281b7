package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/localnode"
	"github.com/lattice-db/lattice/shardmap"
)

// faultCluster is a test's own PostgreSQL nodes and redis-server, for the
// fault tests that stop, kill or restart servers: the package's shared
// cluster stays healthy for the other tests.
type faultCluster struct {
	nodes []*localnode.Postgres
	redis *localnode.Redis
	store *shardmap.RedisStore // the test's view of the shard map
}

var faultSeq atomic.Int64

// startFaultCluster starts n nodes and a redis-server under the harness dir
// and stops them (and removes their files, unless LATTICE_TEST_KEEP=1) when
// the test ends.
func startFaultCluster(t *testing.T, n int) *faultCluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := filepath.Join(harness.dir, fmt.Sprintf("fault-%02d-%s", faultSeq.Add(1), sanitize(t.Name())))
	// PostgreSQL runs as the unprivileged postgres user when we are root:
	// it must be able to enter the dir.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	nodes, rd, err := startCluster(ctx, dir, n)
	fc := &faultCluster{nodes: nodes, redis: rd}
	t.Cleanup(func() {
		if fc.store != nil {
			fc.store.Close()
		}
		for _, p := range fc.nodes {
			if p != nil {
				if err := p.Stop(); err != nil {
					t.Errorf("stop %s: %v", p.Name, err)
				}
			}
		}
		if fc.redis != nil {
			if err := fc.redis.Stop(); err != nil {
				t.Errorf("stop redis: %v", err)
			}
		}
		if os.Getenv("LATTICE_TEST_KEEP") != "1" {
			os.RemoveAll(dir)
		}
	})
	if err != nil {
		t.Fatalf("start the test's own servers: %v", err)
	}
	if fc.store, err = shardmap.OpenRedis(ctx, rd.URL()); err != nil {
		t.Fatal(err)
	}
	return fc
}

func (fc *faultCluster) nodeDSN(i int) string { return fc.nodes[i].DSN("lattice") }

// lockShard locks one shard table of tree in mode, on its node, from a
// transaction that takes no transaction id (so it does not hold back a
// replication slot's snapshot), until the returned release is called; the
// test's end releases it too. A migration of that shard waits at the step
// that needs a conflicting lock: SHARE UPDATE EXCLUSIVE holds CREATE
// PUBLICATION (the copy), ROW EXCLUSIVE makes the fence's CREATE TRIGGER
// time out, so freezes roll back to the drain. Reads and writes go through.
func (fc *faultCluster) lockShard(t *testing.T, ctx context.Context, tree string, shard int, mode string) (release func()) {
	t.Helper()
	_, m, err := fc.shardMap(ctx, tree)
	if err != nil {
		t.Fatal(err)
	}
	return lockTable(t, ctx, fc.nodeDSN(int(m.Shards[shard].Node[1]-'1')), shardmap.SchemaName(shard)+"."+tree, mode)
}

// lockTable locks table on the node at dsn in mode, as lockShard does,
// until the returned release is called or the test ends.
func lockTable(t *testing.T, ctx context.Context, dsn, table, mode string) (release func()) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("LOCK TABLE %s IN %s MODE", table, mode)); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			// Not ctx: it may have ended by the time the test's cleanup runs.
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tx.Rollback(rctx); err != nil {
				t.Errorf("release the lock on %s: %v", table, err)
			}
			_ = conn.Close(rctx)
		})
	}
	t.Cleanup(release)
	return release
}

func (fc *faultCluster) nodeDSNs() []string {
	out := make([]string, len(fc.nodes))
	for i := range fc.nodes {
		out[i] = fc.nodeDSN(i)
	}
	return out
}

// proxy starts `lattice serve` over every node of the cluster.
func (fc *faultCluster) proxy(t *testing.T, env []string, args ...string) *proxyProc {
	t.Helper()
	return startProxyOn(t, fc.redis.URL(), fc.nodeDSNs(), env, args...)
}

// shardMap reads tree's map and definition from the cluster's redis.
func (fc *faultCluster) shardMap(ctx context.Context, tree string) (*shardmap.Tree, *shardmap.Map, error) {
	tr, err := fc.store.Tree(ctx, "lattice", tree)
	if err != nil {
		return nil, nil, err
	}
	m, err := fc.store.Map(ctx, "lattice", tr.MapName())
	return tr, m, err
}

// keysOn returns n keys "prefix<i>" of tree whose owning shard matches.
func keysOn(t *testing.T, tr *shardmap.Tree, m *shardmap.Map, prefix string, n int, match func(slot int, sh shardmap.Shard) bool) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n; i++ {
		if i > 1_000_000 {
			t.Fatalf("no %d keys of %s match", n, prefix)
		}
		k := prefix + strconv.Itoa(i)
		slot, err := shardmap.SlotForText(tr.KeyType, []byte(k), tr.SlotCount)
		if err != nil {
			t.Fatal(err)
		}
		if match(slot, m.Owner(slot)) {
			out = append(out, k)
		}
	}
	return out
}

// pollUntil calls cond every 50ms until it returns true, failing the test
// with what after timeout. cond's error fails the test at once.
func pollUntil(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// insertLedger records what insert-only writers were told. Each key is
// written once: acked keys must be in the tree after any fault; a key whose
// insert failed may or may not be (the failure may have come after the
// commit), but nothing else may.
type insertLedger struct {
	mu        sync.Mutex
	acked     map[string]int64
	uncertain map[string]int64
	failures  map[string]int // SQLSTATE (or "io") -> count
}

func newInsertLedger() *insertLedger {
	return &insertLedger{acked: map[string]int64{}, uncertain: map[string]int64{}, failures: map[string]int{}}
}

func (l *insertLedger) record(k string, v int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		l.acked[k] = v
		return
	}
	l.uncertain[k] = v
	code := sqlState(err)
	if code == "" {
		code = "io"
	}
	l.failures[code]++
}

// recordCut records an insert the end of the run cut off: it may have
// committed, and it is not a failure of the system under test.
func (l *insertLedger) recordCut(k string, v int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.uncertain[k] = v
}

// failed returns the number of failures with SQLSTATE code ("io" for none).
func (l *insertLedger) failed(code string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failures[code]
}

func (l *insertLedger) counts() (acked, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked), len(l.uncertain)
}

// insertWriter inserts new keys "prefix-<n>" through pool until ctx ends,
// pausing pause between inserts. Each statement is bounded by stmtTimeout so
// that a hang shows up as an error in the ledger rather than a stuck test.
func insertWriter(ctx context.Context, pool *pgxpool.Pool, tree, prefix string, l *insertLedger, pause, stmtTimeout time.Duration) {
	for n := 0; ctx.Err() == nil; n++ {
		k := prefix + "-" + strconv.Itoa(n)
		v := int64(n)
		sctx, cancel := context.WithTimeout(ctx, stmtTimeout)
		_, err := pool.Exec(sctx, "INSERT INTO "+tree+" (k, v) VALUES ($1, $2)", k, v)
		cancel()
		if err != nil && ctx.Err() != nil {
			l.recordCut(k, v) // cut off by the end of the run: outcome unknown
			return
		}
		l.record(k, v, err)
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
	}
}

// treeRow is one row of a test tree as stored on a node.
type treeRow struct {
	v     int64
	shard int
	node  int
}

// readTreeRows reads every row of tree straight from every shard table on
// every node (not through a proxy), and fails the test on a key stored
// twice or a row on a shard that does not own its slot under m.
func readTreeRows(t *testing.T, ctx context.Context, fc *faultCluster, tr *shardmap.Tree, m *shardmap.Map) map[string]treeRow {
	t.Helper()
	rows := map[string]treeRow{}
	var dups []string
	for i := range fc.nodes {
		conn, err := pgx.Connect(ctx, fc.nodeDSN(i))
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		schemas, err := func() ([]string, error) {
			rs, err := conn.Query(ctx, `SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
				WHERE c.relname = $1 AND c.relkind = 'r' AND n.nspname ~ '^lattice_s[0-9]{4}$' ORDER BY 1`, tr.Name)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rs, pgx.RowTo[string])
		}()
		if err != nil {
			conn.Close(ctx)
			t.Fatalf("node %d: %v", i, err)
		}
		for _, s := range schemas {
			idx, _ := strconv.Atoi(strings.TrimPrefix(s, "lattice_s"))
			rs, err := conn.Query(ctx, fmt.Sprintf("SELECT k, v FROM %s.%s", s, pgx.Identifier{tr.Name}.Sanitize()))
			if err != nil {
				conn.Close(ctx)
				t.Fatalf("node %d, %s: %v", i, s, err)
			}
			var k string
			var v int64
			_, err = pgx.ForEachRow(rs, []any{&k, &v}, func() error {
				if old, dup := rows[k]; dup {
					dups = append(dups, fmt.Sprintf("%s (shard %d on node %d and shard %d on node %d)", k, old.shard, old.node, idx, i))
				}
				rows[k] = treeRow{v: v, shard: idx, node: i}
				return nil
			})
			if err != nil {
				conn.Close(ctx)
				t.Fatalf("node %d, %s: %v", i, s, err)
			}
		}
		conn.Close(ctx)
	}
	if len(dups) > 0 {
		t.Fatalf("%d keys stored twice, e.g. %v", len(dups), dups[:min(5, len(dups))])
	}
	var misplaced []string
	for k, r := range rows {
		slot, err := shardmap.SlotForText(tr.KeyType, []byte(k), tr.SlotCount)
		if err != nil {
			t.Fatal(err)
		}
		if owner := m.Slots[slot]; owner != r.shard {
			misplaced = append(misplaced, fmt.Sprintf("%s in shard %d, owner %d", k, r.shard, owner))
		}
	}
	if len(misplaced) > 0 {
		t.Fatalf("%d rows on a shard that does not own their slot, e.g. %v", len(misplaced), misplaced[:min(5, len(misplaced))])
	}
	return rows
}

// checksum is a digest of the rows' keys and values in key order.
func checksum(rows map[string]int64) string {
	keys := make([]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%s\x00%d\n", k, rows[k])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// checkTreeAgainst checks the stored rows of tree against initial rows and
// the ledger: every initial row and acked insert present with its value,
// nothing else but inserts of unknown outcome. It returns the row count.
func checkTreeAgainst(t *testing.T, ctx context.Context, fc *faultCluster, tree string, initial map[string]int64, l *insertLedger) int {
	t.Helper()
	tr, m, err := fc.shardMap(ctx, tree)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Frozen) > 0 {
		t.Errorf("slots still frozen after the reshard: %v", m.Frozen)
	}
	stored := readTreeRows(t, ctx, fc, tr, m)
	want := map[string]int64{}
	for k, v := range initial {
		want[k] = v
	}
	l.mu.Lock()
	for k, v := range l.acked {
		want[k] = v
	}
	got := map[string]int64{}
	var lost, extra []string
	for k, v := range want {
		r, ok := stored[k]
		if !ok || r.v != v {
			lost = append(lost, k)
			continue
		}
		got[k] = r.v
	}
	for k, r := range stored {
		if _, ok := want[k]; ok {
			continue
		}
		if v, ok := l.uncertain[k]; !ok || v != r.v {
			extra = append(extra, k)
		}
	}
	l.mu.Unlock()
	if len(lost) > 0 {
		slices.Sort(lost)
		t.Errorf("%d acknowledged rows lost or changed, e.g. %v", len(lost), lost[:min(10, len(lost))])
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		t.Errorf("%d rows nobody wrote, e.g. %v", len(extra), extra[:min(10, len(extra))])
	}
	if cw, cg := checksum(want), checksum(got); cw != cg {
		t.Errorf("checksum of the acknowledged rows: %s, want %s", cg, cw)
	}
	return len(stored)
}

// waitNoShadowLeft waits until no node has a replication slot or a
// checkResharded is what every fault test checks once its reshard is done:
// the tree has shards distinct shards, every acknowledged row is stored
// exactly once (checkTreeAgainst), count(*) through pool agrees, and no
// migration's slot or publication is left.
func checkResharded(t *testing.T, ctx context.Context, fc *faultCluster, pool *pgxpool.Pool, tree string, shards int, initial map[string]int64, l *insertLedger) {
	t.Helper()
	_, m, err := fc.shardMap(ctx, tree)
	if err != nil {
		t.Fatal(err)
	}
	if n := m.DistinctShards(); n != shards {
		t.Errorf("%d shards after the reshard, want %d", n, shards)
	}
	// A write cut off by the end of the run (of unknown outcome) may still
	// commit through the proxy after the writers stopped: count once the
	// tree has stopped changing, so the stored rows and the count agree.
	last := -1
	pollUntil(t, 30*time.Second, "the tree to stop changing", func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tree).Scan(&n)
		same := n == last
		last = n
		if !same {
			time.Sleep(300 * time.Millisecond)
		}
		return same, err
	})
	stored := checkTreeAgainst(t, ctx, fc, tree, initial, l)
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tree).Scan(&n); err != nil || n != stored {
		t.Errorf("count(*) through the proxy = %d, %v; %d rows stored", n, err, stored)
	}
	waitNoShadowLeft(t, ctx, fc)
}

// publication left by a migration.
func waitNoShadowLeft(t *testing.T, ctx context.Context, fc *faultCluster) {
	t.Helper()
	pollUntil(t, 30*time.Second, "the migrations' slots and publications to be dropped", func() (bool, error) {
		for i := range fc.nodes {
			conn, err := pgx.Connect(ctx, fc.nodeDSN(i))
			if err != nil {
				return false, err
			}
			var n int
			err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots) + (SELECT count(*) FROM pg_publication)`).Scan(&n)
			conn.Close(ctx)
			if err != nil {
				return false, err
			}
			if n > 0 {
				return false, nil
			}
		}
		return true, nil
	})
}

// createFaultTree creates tree (k text primary key, v bigint, pad text) with
// rows k-0 .. k-(rows-1) through the proxy and returns them.
func createFaultTree(t *testing.T, ctx context.Context, conn *pgx.Conn, tree string, rows, shards int) map[string]int64 {
	t.Helper()
	for _, q := range []string{
		fmt.Sprintf("CREATE TABLE %s (k text PRIMARY KEY, v bigint NOT NULL, pad text)", tree),
		fmt.Sprintf("INSERT INTO %s SELECT 'k-' || g, g, repeat('x', 100) FROM generate_series(0, %d) g", tree, rows-1),
		fmt.Sprintf("SELECT lattice_create_tree('%s', 'k', shard_count => %d)", tree, shards),
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	initial := make(map[string]int64, rows)
	for g := 0; g < rows; g++ {
		initial["k-"+strconv.Itoa(g)] = int64(g)
	}
	return initial
}

// waitReshardComplete polls lattice_reshard_complete through conn.
func waitReshardComplete(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tree string, timeout time.Duration) {
	t.Helper()
	pollUntil(t, timeout, "the reshard of "+tree+" to complete", func() (bool, error) {
		var done bool
		err := pool.QueryRow(ctx, "SELECT lattice_reshard_complete($1)", tree).Scan(&done)
		switch sqlState(err) {
		case "57P03", "58000":
			// After an outage of redis: the proxy re-registers, and its
			// client dials redis again after a pause.
			return false, nil
		}
		return done, err
	})
}

// endPresence ends, on the node at dsn, the presence sessions of the proxies
// of deployment cluster (pgshard.Presence), as a node restart or an
// operator would, and fails the test if there were none.
func endPresence(t *testing.T, ctx context.Context, dsn, cluster string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE $1`,
		"lattice proxy "+cluster+"/%").Scan(&n)
	if err != nil || n == 0 {
		t.Fatalf("end the presence sessions of deployment %s: %d ended (%v)", cluster, n, err)
	}
}

// proxyPool is a pgx pool on p's lattice database, closed when the test
// ends, on which the setup statements have run, in order.
func proxyPool(t *testing.T, ctx context.Context, p *proxyProc, setup ...string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, q := range setup {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return pool
}

// createFaultTreeIn is createFaultTree on a connection of pool.
func createFaultTreeIn(t *testing.T, ctx context.Context, pool *pgxpool.Pool, tree string, rows, shards int) map[string]int64 {
	t.Helper()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	return createFaultTree(t, ctx, conn.Conn(), tree, rows, shards)
}
