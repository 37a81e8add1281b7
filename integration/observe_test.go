package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// observedTree creates tree items (rows rows, shards shards) through c.
func observedTree(t *testing.T, c *pgx.Conn, rows, shards int) {
	t.Helper()
	mustExec(t, c, `CREATE TABLE items (k text PRIMARY KEY, v int NOT NULL, pad text)`)
	mustExec(t, c, `INSERT INTO items SELECT 'k' || g, g, repeat('x', 50) FROM generate_series(1, $1::int) g`, rows)
	mustExec(t, c, `SELECT lattice_create_tree('items', 'k', shard_count => $1::int)`, shards)
}

// reshardAndWait asks for n shards through c and waits until the reshard
// reports complete.
func reshardAndWait(t *testing.T, c *pgx.Conn, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mustExec(t, c, `SELECT lattice_reshard('items', $1::int)`, n)
	for {
		var done bool
		if err := c.QueryRow(ctx, `SELECT lattice_reshard_complete('items')`).Scan(&done); err != nil {
			t.Fatalf("reshard to %d: %v", n, err)
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("reshard to %d did not complete", n)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func sqlStateOf(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// scrape reads the proxy's /metrics.
func scrape(t *testing.T, p *proxyProc) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + p.AdminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// TestReshardMetrics runs a split and a fold through a proxy, with refused
// requests and queries of several route kinds, then checks that /metrics
// has every instrument of the specification (Telemetry) with exactly its
// tags, the migrator's and the proxy's, with plausible values.
func TestReshardMetrics(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 3, "--reshard-tick", "100ms")
	c := connect(t, p.DSN("lattice"))
	ctx := context.Background()
	observedTree(t, c, 5000, 4)

	for _, n := range []int{1, 5000} { // reasons argument_out_of_range_min and _max
		if _, err := c.Exec(ctx, `SELECT lattice_reshard('items', $1::int)`, n); sqlStateOf(err) != "22023" {
			t.Fatalf("lattice_reshard(items, %d): %v, want SQLSTATE 22023", n, err)
		}
	}
	reshardAndWait(t, c, 8) // four splits
	// Route kinds: single, fan-out, multi-row insert, catalog, a refused
	// statement; extended protocol (parameters) and simple (QueryExecModeSimpleProtocol).
	var v int
	if err := c.QueryRow(ctx, `SELECT v FROM items WHERE k = $1`, "k7").Scan(&v); err != nil || v != 7 {
		t.Fatalf("single-shard read: %d, %v", v, err)
	}
	if err := c.QueryRow(ctx, `SELECT count(*) FROM items`, pgx.QueryExecModeSimpleProtocol).Scan(&v); err != nil || v != 5000 {
		t.Fatalf("fan-out count: %d, %v", v, err)
	}
	mustExec(t, c, `INSERT INTO items (k, v) VALUES ('n1', 1), ('n2', 2), ('n3', 3), ('n4', 4)`)
	mustExec(t, c, `SELECT 1`)
	if _, err := c.Exec(ctx, `SELECT * FROM no_such_table`); sqlStateOf(err) != "42P01" {
		t.Fatalf("missing table: %v, want 42P01", err)
	}
	reshardAndWait(t, c, 3) // five folds

	tt := []string{"tenant", "tree"}
	checkMetrics(t, p, []metricCase{
		// The specification's instruments (dots as underscores).
		{"lattice_shard_root_reshard_initiated_total", tt, map[string]string{"tree": "items", "tenant": "lattice"}, eq(2), "2 reshards"},
		{"lattice_shard_root_reshard_completed_total", tt, map[string]string{"tree": "items", "tenant": "lattice"}, eq(2), "2 reshards"},
		{"lattice_shard_root_reshard_rejected_total", []string{"reason", "tenant", "tree"}, map[string]string{"tree": "items", "reason": "argument_out_of_range_min"}, eq(1), "1"},
		{"lattice_shard_root_reshard_rejected_total", []string{"reason", "tenant", "tree"}, map[string]string{"tree": "items", "reason": "argument_out_of_range_max"}, eq(1), "1"},
		{"lattice_shard_root_reshard_in_flight", tt, map[string]string{"tree": "items"}, eq(4), "4 lattice_reshard calls"},
		{"lattice_shard_consolidations_committed_total", []string{"shard", "tenant", "tree"}, map[string]string{"tree": "items"}, eq(5), "5 folds (8 -> 3)"},
		{"lattice_coordinator_completed_total", []string{"kind", "tenant", "tree"}, map[string]string{"tree": "items", "kind": "reshard"}, eq(2), "2"},
		// The migrator's.
		{"lattice_migrator_rows_copied_total", tt, map[string]string{"tree": "items"}, gt(2000), "> 2000 (the splits alone move about half of 5000 rows)"},
		{"lattice_migrator_bytes_copied_total", tt, map[string]string{"tree": "items"}, gt(2000 * 50), "> the padding of 2000 rows"},
		{"lattice_migrator_freeze_seconds", []string{"outcome", "tenant", "tree"}, map[string]string{"tree": "items", "outcome": "flipped"}, eq(9), "9 flips (4 splits, 5 folds)"},
		{"lattice_migrator_migrations_in_flight", tt, map[string]string{"tree": "items"}, eq(0), "0 once done"},
		{"lattice_migrator_replication_lag_bytes", tt, map[string]string{"tree": "items"}, eq(0), "0 once done"},
		// The proxy's.
		{"lattice_proxy_client_connections", nil, nil, gt(0), "> 0"},
		{"lattice_proxy_client_connections_total", []string{"outcome"}, map[string]string{"outcome": "accepted"}, gt(0), "> 0"},
		{"lattice_proxy_query_duration_seconds", []string{"kind"}, map[string]string{"kind": "single"}, gt(0), "> 0"},
		{"lattice_proxy_query_duration_seconds", []string{"kind"}, map[string]string{"kind": "fanout"}, gt(0), "> 0"},
		{"lattice_proxy_query_duration_seconds", []string{"kind"}, map[string]string{"kind": "insert_split"}, gt(0), "> 0"},
		{"lattice_proxy_query_duration_seconds", []string{"kind"}, map[string]string{"kind": "catalog"}, gt(0), "> 0"},
		{"lattice_proxy_query_duration_seconds", []string{"kind"}, map[string]string{"kind": "function"}, gt(0), "> 0"},
		{"lattice_proxy_errors_sent_total", []string{"sqlstate"}, map[string]string{"sqlstate": "22023"}, eq(2), "2 refused reshards"},
		{"lattice_proxy_errors_sent_total", []string{"sqlstate"}, map[string]string{"sqlstate": "42P01"}, eq(1), "1"},
		{"lattice_pool_backends_in_use", []string{"node", "tenant"}, map[string]string{"node": "n3"}, ge(0), "present"},
		{"lattice_pool_backends_idle", []string{"node", "tenant"}, map[string]string{"node": "n1"}, gt(0), "> 0"},
		{"lattice_pool_backends_waiting", []string{"node", "tenant"}, map[string]string{"node": "n2"}, eq(0), "0"},
	})
}

// metricCase is an instrument a test expects on /metrics: every series of
// name has exactly the tags labels, and the series whose tags include match
// sum (familySum) to a value check accepts, described by want.
type metricCase struct {
	name   string
	labels []string
	match  map[string]string
	check  func(float64) bool
	want   string
}

// failure says how /metrics, parsed as fams, fails the case; "" if not.
func (c metricCase) failure(fams map[string]*dto.MetricFamily) string {
	f := fams[c.name]
	if f == nil {
		return "/metrics has no " + c.name
	}
	for _, m := range f.GetMetric() {
		var names []string
		for _, l := range m.GetLabel() {
			names = append(names, l.GetName())
		}
		sort.Strings(names)
		if !slices.Equal(names, c.labels) {
			return fmt.Sprintf("%s has tags %v, want %v", c.name, names, c.labels)
		}
	}
	sum, matched := familySum(f, c.match)
	if matched == 0 {
		return fmt.Sprintf("%s has no series with %v", c.name, c.match)
	}
	if !c.check(sum) {
		return fmt.Sprintf("%s%v = %v, want %s", c.name, c.match, sum, c.want)
	}
	return ""
}

// checkMetrics fails each case p's /metrics does not meet within 10 s:
// an operation counts its completion just after it clears the record that
// its completion function (lattice_reshard_complete and the like) reads,
// so a scrape can come first.
func checkMetrics(t *testing.T, p *proxyProc, cases []metricCase) {
	t.Helper()
	var failures []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		fams := scrape(t, p)
		failures = failures[:0]
		for _, c := range cases {
			if f := c.failure(fams); f != "" {
				failures = append(failures, f)
			}
		}
		if len(failures) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, f := range failures {
		t.Error(f)
	}
}

// familySum sums the series of f whose tags include match: a counter's or
// gauge's value, a histogram's sample count. matched says how many there were.
func familySum(f *dto.MetricFamily, match map[string]string) (sum float64, matched int) {
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, v := range match {
			ok = ok && labels[k] == v
		}
		if !ok {
			continue
		}
		matched++
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum, matched
}

func eq(want float64) func(float64) bool { return func(v float64) bool { return v == want } }
func gt(min float64) func(float64) bool  { return func(v float64) bool { return v > min } }
func ge(min float64) func(float64) bool  { return func(v float64) bool { return v >= min } }

// treeEvent is the payload of a lattice_events notification.
type treeEvent struct {
	Event     string `json:"event"`
	Tenant    string `json:"tenant"`
	Tree      string `json:"tree"`
	Epoch     uint64 `json:"epoch"`
	Reshard   string `json:"reshard"`
	From      int    `json:"from_shards"`
	To        int    `json:"target_shards"`
	Shards    int    `json:"shards"`
	Migration string `json:"migration"`
	Kind      string `json:"kind"`
	Source    *int   `json:"source"`
	Target    *int   `json:"target"`
}

// TestTreeEvents: a client that runs LISTEN lattice_events through one
// proxy receives the tree events of reshards another proxy coordinates:
// reshard_started, then for each migration migration_committed before
// migration_retired, and reshard_completed last.
func TestTreeEvents(t *testing.T) {
	resetNodes(t)
	coord := startProxy(t, 3, "--reshard-tick", "100ms")
	other := startProxy(t, 3, "--coordinator=false")
	admin := connect(t, coord.DSN("lattice"))
	listener := connect(t, other.DSN("lattice"))
	observedTree(t, admin, 3000, 4)
	mustExec(t, listener, `LISTEN lattice_events`)

	for _, tc := range []struct {
		target     int
		kind       string
		migrations int
	}{{6, "split", 2}, {3, "fold", 3}} {
		t.Run(tc.kind, func(t *testing.T) {
			reshardAndWait(t, admin, tc.target)
			var events []treeEvent
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for len(events) == 0 || events[len(events)-1].Event != "reshard_completed" {
				n, err := listener.WaitForNotification(ctx)
				if err != nil {
					t.Fatalf("after %d events %+v: %v", len(events), events, err)
				}
				if n.Channel != "lattice_events" {
					t.Fatalf("notification on %q", n.Channel)
				}
				var ev treeEvent
				if err := json.Unmarshal([]byte(n.Payload), &ev); err != nil {
					t.Fatalf("payload %q: %v", n.Payload, err)
				}
				if ev.Tenant != "lattice" || ev.Tree != "items" || ev.Epoch == 0 {
					t.Fatalf("event without its tree, tenant or epoch: %s", n.Payload)
				}
				events = append(events, ev)
			}
			var names []string
			for _, ev := range events {
				names = append(names, ev.Event+" "+ev.Migration)
			}
			t.Logf("events: %s", strings.Join(names, ", "))

			first, last := events[0], events[len(events)-1]
			if first.Event != "reshard_started" || first.To != tc.target || first.Reshard == "" {
				t.Fatalf("first event %+v, want reshard_started to %d", first, tc.target)
			}
			if last.Reshard != first.Reshard || last.Shards != tc.target {
				t.Fatalf("last event %+v, want reshard_completed of %s with %d shards", last, first.Reshard, tc.target)
			}
			// Migrations run concurrently, so only each one's own events
			// are ordered.
			committed := map[string]uint64{}
			retired := map[string]bool{}
			var epoch uint64
			for _, ev := range events[1 : len(events)-1] {
				epoch = max(epoch, ev.Epoch)
				if ev.Kind != tc.kind || ev.Source == nil || ev.Target == nil || *ev.Source == *ev.Target {
					t.Fatalf("migration event %+v: want a %s between two shards", ev, tc.kind)
				}
				switch ev.Event {
				case "migration_committed":
					committed[ev.Migration] = ev.Epoch
				case "migration_retired":
					if e, ok := committed[ev.Migration]; !ok || ev.Epoch < e {
						t.Fatalf("migration %s retired (epoch %d) before it committed (epoch %d, seen %v)", ev.Migration, ev.Epoch, e, ok)
					}
					retired[ev.Migration] = true
				default:
					t.Fatalf("unexpected event %q inside the reshard", ev.Event)
				}
			}
			if len(committed) != tc.migrations || len(retired) != tc.migrations {
				t.Fatalf("%d migrations committed and %d retired, want %d of each", len(committed), len(retired), tc.migrations)
			}
			if last.Epoch < epoch {
				t.Fatalf("reshard_completed at epoch %d, before the last migration event's %d", last.Epoch, epoch)
			}
		})
	}
}
