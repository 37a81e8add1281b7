package integration

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/shardmap"
)

// apiLoad is GET /api/trees/{tree}/load.
type apiLoad struct {
	Writes []float64 `json:"writes_per_s"`
	Reads  []float64 `json:"reads_per_s"`
	Rows   []float64 `json:"rows_written_per_s"`
	Shards []struct {
		Index  int     `json:"index"`
		Node   string  `json:"node"`
		Reads  float64 `json:"reads_per_s"`
		Writes float64 `json:"writes_per_s"`
		Rows   float64 `json:"rows_written_per_s"`
	} `json:"shards"`
	Nodes []struct {
		Node   string  `json:"node"`
		Writes float64 `json:"writes_per_s"`
	} `json:"nodes"`
}

// counted turns a rate of the load window back into the statements it
// counts: rates are rounded to two decimals, so over 30 s a count is
// exact to within 0.15.
func counted(rate float64) int { return int(math.Round(rate * shardmap.LoadWindow.Seconds())) }

// TestLoadSignal drives writes skewed onto one shard of a 4-shard tree
// through two counting proxies (one in the extended protocol, one in the
// simple) and a third that does not count (--load-stats=false), and reads
// the rates back: lattice_shards, the admin API per shard, per slot and
// per node, /metrics and the page's heat view all show the hot shard's
// writes, summed over both counting proxies and over nothing else.
// Fan-out reads, UPDATE and DELETE without the key, and a Query of several
// statements count too: one statement on each shard they touch.
func TestLoadSignal(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fast := []string{"--load-publish-interval", "300ms"}
	a := startProxy(t, 2, fast...)
	b := startProxy(t, 2, append(fast, "--coordinator=false")...)
	off := startProxy(t, 2, "--coordinator=false", "--load-stats=false")

	ca := connect(t, a.DSN("lattice"))
	mustExec(t, ca, `CREATE TABLE hot (id bigint PRIMARY KEY, v int NOT NULL)`)
	mustExec(t, ca, `SELECT lattice_create_tree('hot', 'id', shard_count => 4)`)
	var m apiMap
	adminGet(t, ctx, a, "/api/trees/hot/map", &m)

	// Keys by owning shard; the hot shard is 2.
	const hot = 2
	keys := map[int][]int{}
	for k := 1; len(keys[hot]) < 226 || len(keys[0]) < 22 || len(keys[1]) < 22 || len(keys[3]) < 22; k++ {
		slot, err := shardmap.SlotForText(shardmap.KeyInt, []byte(strconv.Itoa(k)), len(m.Slots))
		if err != nil {
			t.Fatal(err)
		}
		sh := m.Slots[slot]
		keys[sh] = append(keys[sh], k)
	}

	// Proxy a, extended protocol: 120 inserts on the hot shard, 6 on each
	// other shard, and 10 point selects on each other shard.
	want := map[int]struct{ reads, writes, rows int }{}
	for i, k := range keys[hot][:120] {
		mustExec(t, ca, `INSERT INTO hot (id, v) VALUES ($1, $2)`, k, i)
	}
	for _, sh := range []int{0, 1, 3} {
		for _, k := range keys[sh][:6] {
			mustExec(t, ca, `INSERT INTO hot (id, v) VALUES ($1, 0)`, k)
		}
		for _, k := range keys[sh][:10] {
			var v int
			if err := ca.QueryRow(ctx, `SELECT v FROM hot WHERE id = $1`, k).Scan(&v); err != nil && err != pgx.ErrNoRows {
				t.Fatal(err)
			}
		}
		want[sh] = struct{ reads, writes, rows int }{10, 6, 6}
	}
	// Proxy b, simple protocol: 60 updates of one row each on the hot shard.
	cb := connect(t, b.DSN("lattice"))
	for _, k := range keys[hot][:60] {
		if _, err := cb.Exec(ctx, `UPDATE hot SET v = v + 1 WHERE id = $1`, pgx.QueryExecModeSimpleProtocol, k); err != nil {
			t.Fatal(err)
		}
	}
	// One INSERT of ten rows over every shard: six on the hot shard, two on
	// shard 0, one on each other. It is split, so its rows count on their
	// slots but as no write statement of one slot.
	var values []string
	split := append(append(append(append([]int(nil), keys[hot][220:226]...), keys[0][20:22]...), keys[1][20]), keys[3][20])
	for _, k := range split {
		values = append(values, fmt.Sprintf("(%d, 0)", k))
	}
	mustExec(t, ca, `INSERT INTO hot (id, v) VALUES `+strings.Join(values, ", "))
	// Statements over every shard count one statement on each: 5 fan-out
	// aggregates in the simple protocol and 3 sorted fan-outs in the
	// extended one read every shard; an UPDATE without the key (simple:
	// one Query per node, one CommandComplete per shard) writes every shard
	// and its 10 rows on the hot one (v 100..109 are the hot shard's keys
	// 100..109), and a DELETE without the key (extended) writes every
	// shard and no row.
	for range 5 {
		var n int64
		if err := cb.QueryRow(ctx, `SELECT count(*) FROM hot`, pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		rows, err := ca.Query(ctx, `SELECT id FROM hot WHERE v = $1 ORDER BY id`, -7)
		if err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if tag, err := cb.Exec(ctx, `UPDATE hot SET v = -1 WHERE v >= 100 AND v < 110`, pgx.QueryExecModeSimpleProtocol); err != nil || tag.RowsAffected() != 10 {
		t.Fatalf("keyless UPDATE: %v, %v", tag, err)
	}
	mustExec(t, ca, `DELETE FROM hot WHERE v = -2`)
	// One Query of three statements on the hot shard's node: an UPDATE of
	// one row, a statement on no tree and a point select, each counted by
	// its own CommandComplete.
	multi := fmt.Sprintf(`UPDATE hot SET v = v WHERE id = %d; SELECT 1; SELECT v FROM hot WHERE id = %d`, keys[hot][0], keys[hot][1])
	if _, err := cb.PgConn().Exec(ctx, multi).ReadAll(); err != nil {
		t.Fatalf("%s: %v", multi, err)
	}
	want[hot] = struct{ reads, writes, rows int }{9, 183, 197}
	want[0] = struct{ reads, writes, rows int }{18, 8, 8}
	want[1] = struct{ reads, writes, rows int }{18, 8, 7}
	want[3] = struct{ reads, writes, rows int }{18, 8, 7}
	// The proxy that does not count: 100 more inserts on the hot shard,
	// which no rate may show.
	co := connect(t, off.DSN("lattice"))
	for _, k := range keys[hot][120:220] {
		mustExec(t, co, `INSERT INTO hot (id, v) VALUES ($1, 0)`, k)
	}

	// lattice_shards shows every counted statement once the buckets that
	// hold them are complete (within LoadBucket and a publication).
	type seen struct{ reads, writes, rows int }
	var last, most map[int]seen // most: the read that counted the most, for the failure message
	total := func(m map[int]seen) (n int) {
		for _, s := range m {
			n += s.reads + s.writes + s.rows
		}
		return n
	}
	deadline := time.Now().Add(time.Minute)
	for !func() bool {
		rows, err := ca.Query(ctx, `SELECT shard, reads_per_s, writes_per_s, rows_written_per_s FROM lattice_shards('hot') WHERE slot_count > 0`)
		if err != nil {
			t.Fatal(err)
		}
		last = map[int]seen{}
		for rows.Next() {
			var sh int32
			var r, w, n float64
			if err := rows.Scan(&sh, &r, &w, &n); err != nil {
				t.Fatal(err)
			}
			last[int(sh)] = seen{counted(r), counted(w), counted(n)}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if total(last) >= total(most) {
			most = last
		}
		for sh, w := range want {
			if s := last[sh]; s.reads > w.reads || s.writes > w.writes || s.rows > w.rows {
				// Counts only grow until they age out, 30 s after the writes.
				t.Fatalf("lattice_shards counts more than was sent through the counting proxies: shard %d %+v, want %+v; all %+v", sh, s, w, last)
			}
			if last[sh] != (seen{w.reads, w.writes, w.rows}) {
				return false
			}
		}
		return true
	}() {
		if time.Now().After(deadline) {
			t.Fatalf("lattice_shards never showed the counted statements %+v; at most %+v", want, most)
		}
		time.Sleep(200 * time.Millisecond) // each read asks the nodes for row estimates
	}
	t.Logf("lattice_shards, statements counted in the window per shard: %+v (hot shard %d)", last, hot)

	// The admin API of either proxy: per shard, per node, and per slot.
	for _, p := range []*proxyProc{a, b} {
		var l apiLoad
		adminGet(t, ctx, p, "/api/trees/hot/load", &l)
		if len(l.Shards) != 4 {
			t.Fatalf("load API: %d shards", len(l.Shards))
		}
		for _, s := range l.Shards {
			if got, w := counted(s.Writes), want[s.Index].writes; got != w {
				t.Errorf("load API shard %d: %d writes counted, want %d", s.Index, got, w)
			}
		}
		// Per slot: the hot keys' slots hold the 180 writes by key and the
		// multi-statement UPDATE; the two keyless statements each count on
		// one slot of the shard, which may be one of them.
		hotSlots, shardSlots := 0.0, 0.0
		for slot, sh := range m.Slots {
			if sh == hot {
				shardSlots += l.Writes[slot]
			}
		}
		for _, k := range keys[hot][:120] {
			slot, _ := shardmap.SlotForText(shardmap.KeyInt, []byte(strconv.Itoa(k)), len(m.Slots))
			hotSlots += l.Writes[slot]
			l.Writes[slot] = 0 // a slot holding several keys counts once
		}
		if got, all := counted(hotSlots), counted(shardSlots); got < 181 || got > 183 || all != 183 {
			t.Errorf("load API: the hot keys' slots have %d writes and the hot shard's slots %d, want 181 to 183 and 183", got, all)
		}
		nodeWrites := 0.0
		for _, n := range l.Nodes {
			nodeWrites += n.Writes
		}
		if got := counted(nodeWrites); got != 207 {
			t.Errorf("load API: %d writes over the nodes, want 207", got)
		}
		var shards []struct {
			Index int `json:"index"`
			Load  *struct {
				Writes float64 `json:"writes_per_s"`
			} `json:"load"`
		}
		adminGet(t, ctx, p, "/api/trees/hot/shards", &shards)
		if len(shards) != 4 || shards[hot].Load == nil || counted(shards[hot].Load.Writes) != 183 {
			t.Errorf("shard list: %+v", shards)
		}
	}

	// /metrics: one series per shard, the hot shard's the largest.
	metricWrites := scrapeShardWrites(t, ctx, a, "hot")
	if len(metricWrites) != 4 || counted(metricWrites[hot]) != 183 {
		t.Errorf("/metrics lattice_shard_writes_per_second of tree hot: %v", metricWrites)
	}

	t.Run("page", func(t *testing.T) {
		// The counts above age out 30 s after their writes, and a browser
		// can take that long to start on a loaded machine: keep the hot
		// shard hot through the counting proxy while the page loads.
		hotCtx, stopHot := context.WithCancel(ctx)
		hotDone := make(chan struct{})
		go func() {
			defer close(hotDone)
			for i := 0; ; i++ {
				if _, err := ca.Exec(hotCtx, `UPDATE hot SET v = v + 1 WHERE id = $1`, keys[hot][i%120]); err != nil {
					return
				}
				select {
				case <-hotCtx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		}()
		defer func() { stopHot(); <-hotDone }()
		browser := openPage(t, ctx, chromiumPath(t), a)
		const read = `(() => { const s = document.querySelector('section.tree[data-tree="hot"]');
  return s && s.querySelector('canvas.heat') ? String(s.dataset.hottest) : 'none'; })()`
		var got string
		waitUntil(t, ctx, "the page's heat view", func() bool {
			var err error
			if got, err = chromedp.Run(browser, chromedp.Evaluate[string](read)); err != nil {
				t.Fatalf("read the page: %v", err)
			}
			return got == strconv.Itoa(hot)
		})
	})
}

// scrapeShardWrites reads lattice_shard_writes_per_second of tree from
// p's /metrics, by shard.
func scrapeShardWrites(t *testing.T, ctx context.Context, p *proxyProc, tree string) map[int]float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.AdminAddr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[int]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "lattice_shard_writes_per_second{") || !strings.Contains(line, fmt.Sprintf("tree=%q", tree)) {
			continue
		}
		_, rest, _ := strings.Cut(line, `shard="`)
		num, _, _ := strings.Cut(rest, `"`)
		sh, err := strconv.Atoi(num)
		if err != nil {
			t.Fatalf("metric line %q", line)
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q", line)
		}
		out[sh] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
