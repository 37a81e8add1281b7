package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// adminAnswer is an answer of the admin JSON API.
type adminAnswer struct {
	status int
	body   []byte
}

func adminCall(t testing.TB, ctx context.Context, p *proxyProc, method, path, body string) adminAnswer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+p.AdminAddr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	p.Authorize(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return adminAnswer{resp.StatusCode, b}
}

// adminGet calls GET path, wants 200 and decodes the answer into out.
func adminGet(t testing.TB, ctx context.Context, p *proxyProc, path string, out any) {
	t.Helper()
	a := adminCall(t, ctx, p, http.MethodGet, path, "")
	if a.status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, a.status, a.body)
	}
	if err := json.Unmarshal(a.body, out); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, a.body)
	}
}

// Shapes of the API's answers, as a client outside the module sees them.
type (
	apiReshard struct {
		Tenant             string   `json:"tenant"`
		Tree               string   `json:"tree"`
		Phase              string   `json:"phase"`
		From               int      `json:"from"`
		Target             int      `json:"target"`
		Shards             int      `json:"shards"`
		MigrationsInFlight int      `json:"migrations_in_flight"`
		ETASeconds         *float64 `json:"eta_seconds"`
		Message            string   `json:"message"`
	}
	apiShard struct {
		Index         int    `json:"index"`
		Node          string `json:"node"`
		Schema        string `json:"schema"`
		State         string `json:"state"`
		Slots         int    `json:"slots"`
		RowsEstimate  *int64 `json:"rows_estimate"`
		BytesEstimate *int64 `json:"bytes_estimate"`
	}
	apiTree struct {
		Tenant    string      `json:"tenant"`
		Name      string      `json:"name"`
		Key       string      `json:"key"`
		KeyType   string      `json:"key_type"`
		Shards    int         `json:"shards"`
		Slots     int         `json:"slots"`
		Epoch     uint64      `json:"epoch"`
		Reshard   *apiReshard `json:"reshard"`
		ShardList []apiShard  `json:"shard_list"`
		// Operations are the tree's snapshots, merges and resizes.
		Operations []apiOperation `json:"operations"`
	}
	apiOperation struct {
		ID         string   `json:"id"`
		Kind       string   `json:"kind"`
		Tree       string   `json:"tree"`
		Target     string   `json:"target"`
		Phase      string   `json:"phase"`
		ETASeconds *float64 `json:"eta_seconds"`
	}
	apiMap struct {
		Epoch  uint64 `json:"epoch"`
		Slots  []int  `json:"slots"`
		Frozen []int  `json:"frozen"`
	}
	apiStatus struct {
		Proxy struct {
			ID          string `json:"id"`
			Coordinator bool   `json:"coordinator"`
			Live        bool   `json:"live"`
		} `json:"proxy"`
		Proxies []struct {
			ID string `json:"id"`
		} `json:"proxies"`
		Trees []apiTree `json:"trees"`
	}
)

// shownOperations are the tree operations of tree as /api/status lists
// them, and for each the line lattice status shows it by ("" if none).
func shownOperations(t *testing.T, ctx context.Context, p *proxyProc, tree string) ([]apiOperation, []string) {
	t.Helper()
	var st apiStatus
	adminGet(t, ctx, p, "/api/status", &st)
	var ops []apiOperation
	for _, tr := range st.Trees {
		if tr.Name == tree {
			ops = tr.Operations
		}
	}
	out, errOut, code := p.RunCLI(t, ctx, "status")
	if code != 0 {
		t.Fatalf("lattice status: exit %d: %s", code, errOut)
	}
	lines := make([]string, len(ops))
	for i, op := range ops {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, op.Kind+" "+op.ID+" ") {
				lines[i] = l
			}
		}
	}
	return ops, lines
}

// mapDigest is the page's digest of a slot map: FNV-1a over the shard
// index of each slot.
func mapDigest(slots []int) string {
	h := uint32(2166136261)
	for _, v := range slots {
		h = (h ^ uint32(v)) * 16777619
	}
	return fmt.Sprintf("%08x", h)
}

// createDashTree makes tree dash of rows rows on 4 shards through the proxy
// and analyses its shards on the nodes, so that the estimates are exact.
func createDashTree(t testing.TB, ctx context.Context, p *proxyProc, rows int) {
	t.Helper()
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, q := range []string{
		"CREATE TABLE dash (id bigint PRIMARY KEY, v text NOT NULL)",
		fmt.Sprintf("INSERT INTO dash SELECT g, md5(g::text) FROM generate_series(1, %d) g", rows),
		"SELECT lattice_create_tree('dash', 'id', shard_count => 4)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	analyzeDash(t, ctx)
}

func analyzeDash(t testing.TB, ctx context.Context) {
	t.Helper()
	for i := range 3 {
		c, err := pgx.Connect(ctx, testNodeDSN(t, i))
		if err != nil {
			t.Fatal(err)
		}
		rows, err := c.Query(ctx, "SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables WHERE relname = 'dash' AND schemaname LIKE 'lattice_s%'")
		if err != nil {
			t.Fatal(err)
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, tb := range tables {
			if _, err := c.Exec(ctx, "ANALYZE "+tb); err != nil {
				t.Fatalf("ANALYZE %s: %v", tb, err)
			}
		}
		c.Close(ctx)
	}
}

// roomyFreeze lets a freeze take long on a loaded machine: these tests are
// about what the admin API, page and CLI show, not about the write pause.
var roomyFreeze = []string{"--freeze-budget", "20s"}

// waitReshardDone polls the API until dash has no reshard.
func waitReshardDone(t testing.TB, ctx context.Context, p *proxyProc) apiTree {
	t.Helper()
	for {
		var tr apiTree
		adminGet(t, ctx, p, "/api/trees/dash", &tr)
		if tr.Reshard == nil {
			return tr
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the reshard of dash did not complete: %+v", tr.Reshard)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestAdminAPI checks every endpoint against a real cluster. The first
// proxy runs no coordinator, so a reshard it accepts stays where it is
// until a second proxy, which does, is started.
func TestAdminAPI(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	p := startProxy(t, 3, "--coordinator=false")
	createDashTree(t, ctx, p, 2000)

	var st apiStatus
	adminGet(t, ctx, p, "/api/status", &st)
	if st.Proxy.ID == "" || st.Proxy.Coordinator || !st.Proxy.Live || len(st.Proxies) != 1 || st.Proxies[0].ID != st.Proxy.ID {
		t.Errorf("status: %+v", st)
	}
	if len(st.Trees) != 1 || st.Trees[0].Name != "dash" || st.Trees[0].Shards != 4 || st.Trees[0].Reshard != nil {
		t.Errorf("status trees: %+v", st.Trees)
	}

	var tr apiTree
	adminGet(t, ctx, p, "/api/trees/dash", &tr)
	if tr.Tenant != "lattice" || tr.Key != "id" || tr.KeyType != "int" || tr.Shards != 4 || tr.Slots != 4096 || len(tr.ShardList) != 4 {
		t.Errorf("tree: %+v", tr)
	}
	var shards []apiShard
	adminGet(t, ctx, p, "/api/trees/dash/shards", &shards)
	var rows int64
	for i, s := range shards {
		if s.Index != i || s.Schema != fmt.Sprintf("lattice_s%04d", i) || s.State != "active" || s.Slots != 1024 ||
			s.RowsEstimate == nil || s.BytesEstimate == nil || *s.BytesEstimate <= 0 {
			t.Errorf("shard %d: %+v", i, s)
			continue
		}
		rows += *s.RowsEstimate
	}
	if rows != 2000 {
		t.Errorf("row estimates add up to %d, want 2000 (the shards were analysed)", rows)
	}
	var m apiMap
	adminGet(t, ctx, p, "/api/trees/dash/map", &m)
	if len(m.Slots) != 4096 || m.Slots[0] != 0 || m.Slots[4095] != 3 || len(m.Frozen) != 0 || m.Epoch != tr.Epoch {
		t.Errorf("map: epoch %d, %d slots, frozen %v", m.Epoch, len(m.Slots), m.Frozen)
	}

	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		answer                   string
	}{
		{"unknown tree", "GET", "/api/trees/nope", "", 404, `"sqlstate":"42P01"`},
		{"unknown tree's map", "GET", "/api/trees/nope/map", "", 404, `"sqlstate":"42P01"`},
		{"unknown tenant", "GET", "/api/trees/dash?tenant=other", "", 404, `"sqlstate":"42P01"`},
		{"reshard of an unknown tree", "POST", "/api/trees/nope/reshard", `{"shards":8}`, 404, `{"error":"tree \"nope\" does not exist","sqlstate":"42P01"}`},
		{"too few shards", "POST", "/api/trees/dash/reshard", `{"shards":1}`, 400, `"sqlstate":"22023"`},
		{"too many shards", "POST", "/api/trees/dash/reshard", `{"shards":5000}`, 400, `"sqlstate":"22023"`},
		{"no count", "POST", "/api/trees/dash/reshard", `{}`, 400, `"sqlstate":"22023"`},
		{"accepted", "POST", "/api/trees/dash/reshard", `{"shards":8}`, 202, `"message":"resharding dash from 4 to 8 shards (splitting)"`},
		{"same again", "POST", "/api/trees/dash/reshard", `{"shards":8}`, 202, `"message":"reshard of dash to 8 shards is already running"`},
		{"another while one runs", "POST", "/api/trees/dash/reshard", `{"shards":6}`, 409, `"sqlstate":"55000"`},
	} {
		a := adminCall(t, ctx, p, tc.method, tc.path, tc.body)
		if a.status != tc.status || !bytes.Contains(a.body, []byte(tc.answer)) {
			t.Errorf("%s: %s %s: %d %s, want %d with %s", tc.name, tc.method, tc.path, a.status, a.body, tc.status, tc.answer)
		}
	}

	// The API and lattice_reshard_status report the same reshard.
	var running []apiReshard
	adminGet(t, ctx, p, "/api/reshards", &running)
	if len(running) != 1 || running[0].Tree != "dash" || running[0].Phase != "migrating" || running[0].From != 4 || running[0].Target != 8 || running[0].Shards != 4 {
		t.Fatalf("reshards: %+v", running)
	}
	conn, err := pgx.Connect(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var (
		phase                      string
		target, distinct, inFlight int
		copied, lag                int64
		eta                        *float64
	)
	if err := conn.QueryRow(ctx, "SELECT phase, target, distinct_shards, migrations_in_flight, rows_copied, lag_bytes, eta_seconds FROM lattice_reshard_status('dash')").Scan(&phase, &target, &distinct, &inFlight, &copied, &lag, &eta); err != nil {
		t.Fatal(err)
	}
	if phase != running[0].Phase || target != running[0].Target || distinct != running[0].Shards || inFlight != running[0].MigrationsInFlight ||
		(eta == nil) != (running[0].ETASeconds == nil) {
		t.Errorf("lattice_reshard_status says %s %d %d %d eta %v, the API %+v", phase, target, distinct, inFlight, eta, running[0])
	}
	var migs []map[string]any
	adminGet(t, ctx, p, "/api/migrations", &migs)
	if len(migs) != 0 {
		t.Errorf("migrations without a coordinator: %v", migs)
	}

	// A proxy with a coordinator carries the reshard out.
	startProxy(t, 3, roomyFreeze...)
	done := waitReshardDone(t, ctx, p)
	if done.Shards != 8 {
		t.Errorf("after the reshard: %+v", done)
	}
	adminGet(t, ctx, p, "/api/trees/dash/map", &m)
	distinctSlots := map[int]bool{}
	for _, s := range m.Slots {
		distinctSlots[s] = true
	}
	if len(distinctSlots) != 8 || m.Epoch != done.Epoch {
		t.Errorf("map after the reshard: %d distinct shards at epoch %d, tree at %d", len(distinctSlots), m.Epoch, done.Epoch)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM dash").Scan(&n); err != nil || n != 2000 {
		t.Errorf("count(*) after the reshard: %d %v", n, err)
	}
}

// TestCLIReshardWait runs the real lattice binary's reshard --wait against
// a real cluster, with its output on a pipe (plain progress lines).
func TestCLIReshardWait(t *testing.T) {
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	p := startProxy(t, 3, roomyFreeze...)
	createDashTree(t, ctx, p, 2000)

	run := func(args ...string) (string, string, int) { return p.RunCLI(t, ctx, args...) }

	out, errOut, code := run("reshard", "dash", "8", "--wait")
	t.Logf("lattice reshard dash 8 --wait:\n%s", out)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	progressRE := regexp.MustCompile(`^\[ *\d+\.\ds\] [4-8]/8 shards, \d+ migrations in flight`)
	doneRE := regexp.MustCompile(`^done: dash has 8 shards \(epoch \d+\) after \d`)
	if len(lines) < 3 || lines[0] != "resharding dash from 4 to 8 shards (splitting)" || !doneRE.MatchString(lines[len(lines)-1]) {
		t.Fatalf("output:\n%s", out)
	}
	for _, l := range lines[1 : len(lines)-1] {
		if !progressRE.MatchString(l) {
			t.Errorf("progress line %q does not match %s", l, progressRE)
		}
	}
	if strings.Contains(out, "\r") {
		t.Errorf("plain output has carriage returns: %q", out)
	}

	out, _, code = run("status")
	if code != 0 || !regexp.MustCompile(`(?m)^lattice +dash +id \(int\) +8 +4096 +\d+ +-$`).MatchString(out) {
		t.Errorf("status (exit %d):\n%s", code, out)
	}
	out, _, code = run("shards", "dash")
	if code != 0 || strings.Count(out, " active ") != 8 {
		t.Errorf("shards (exit %d):\n%s", code, out)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"reshard", "dash", "1", "--wait"}, "(SQLSTATE 22023)"},
		{[]string{"reshard", "nope", "4", "--wait"}, `tree "nope" does not exist (SQLSTATE 42P01)`},
		{[]string{"shards", "nope"}, "(SQLSTATE 42P01)"},
	} {
		_, errOut, code := run(tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("lattice %q: exit %d, stderr %q; want a failure with %q", tc.args, code, errOut, tc.want)
		}
	}
}

// chromiumPath finds a Chromium to drive. Missing, it fails the test when
// root (scripts/ensure-tools.sh installs it then) and skips it otherwise.
// signIn fills the admin endpoint's sign-in form, which a proxy with a
// token shows in place of the page, and waits for the page.
func signIn(t *testing.T, ctx context.Context, browser context.Context, p *proxyProc) {
	t.Helper()
	js := fmt.Sprintf(`(() => { const f = document.getElementById('token'); if (!f) return 'no form'; f.value = %q; document.getElementById('signin').click(); return 'sent'; })()`, p.AdminToken)
	if got, err := chromedp.Run(browser, chromedp.Evaluate[string](js)); err != nil || got != "sent" {
		t.Fatalf("sign in: %q %v", got, err)
	}
	for {
		state, err := chromedp.Run(browser, chromedp.Evaluate[string](`document.readyState + ' ' + (document.getElementById('token') ? 'form' : 'page')`))
		if err == nil && state == "complete page" {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the page did not load after signing in: %q %v", state, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// openPage loads p's admin page in headless Chromium (chrome, from
// chromiumPath) and signs in; the browser closes when the test ends.
func openPage(t *testing.T, ctx context.Context, chrome string, p *proxyProc, opts ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	opts = append(append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true)), opts...)
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(alloc, chromedp.WithErrorf(t.Logf))
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(browser, chromedp.Navigate("http://"+p.AdminAddr+"/")); err != nil {
		t.Fatalf("load the page: %v", err)
	}
	signIn(t, ctx, browser, p)
	return browser
}

func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Geteuid() == 0 {
		t.Fatal("chromium is not installed; scripts/ensure-tools.sh installs it (apt-get install -y chromium)")
	}
	t.Skip("skipped: chromium is not installed and this is not root; install it with: sudo apt-get install -y chromium")
	return ""
}

// pageState is what the test reads off the page.
type pageState struct {
	Shards  string `json:"shards"`
	Digest  string `json:"digest"`
	Epoch   string `json:"epoch"`
	Reshard string `json:"reshard"`
	Bar     string `json:"bar"` // the progress text, when a reshard shows
	Rows    int    `json:"rows"`
	Updates string `json:"updates"`
	LoadID  string `json:"loadId"`
	Error   string `json:"error"`
}

const readPage = `(() => {
  const s = document.querySelector('section.tree[data-tree="dash"]');
  const bar = s && s.querySelector('.reshard:not([hidden]) .progress-text');
  const err = document.getElementById('error');
  return {shards: s ? s.dataset.shards || '' : '', digest: s ? s.dataset.digest || '' : '', epoch: s ? s.dataset.epoch || '' : '',
    reshard: s ? s.dataset.reshard || '' : '', bar: bar ? bar.textContent : '',
    rows: s ? s.querySelectorAll('table:not(.migrations) tr[data-shard]').length : 0,
    updates: document.body.dataset.updates, loadId: String(window.testLoadID || ''), error: err.hidden ? '' : err.textContent};
})()`

// TestAdminDashboard loads the page in headless Chromium and watches it
// follow a reshard without a reload: the slot map it draws (its digest and
// distinct shard count) must match the API's map before and after.
func TestAdminDashboard(t *testing.T) {
	chrome := chromiumPath(t)
	resetNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	p := startProxy(t, 3, "--coordinator=false")
	createDashTree(t, ctx, p, 2000)

	browser := openPage(t, ctx, chrome, p, chromedp.WindowSize(1300, 1100))
	if _, err := chromedp.Run(browser, chromedp.Evaluate[string](`window.testLoadID = 'first-load'`)); err != nil {
		t.Fatalf("mark the page: %v", err)
	}
	read := func() pageState {
		s, err := chromedp.Run(browser, chromedp.Evaluate[pageState](readPage))
		if err != nil {
			t.Fatalf("read the page: %v", err)
		}
		return s
	}
	// Each wait has its own deadline, well within ctx's, so that a page that
	// never gets there is reported with what it showed last.
	waitFor := func(what string, ok func(pageState) bool) pageState {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for {
			s := read()
			if ok(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("the page never showed %s; last: %+v", what, s)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	apiDigest := func() (string, apiMap) {
		var m apiMap
		adminGet(t, ctx, p, "/api/trees/dash/map", &m)
		return mapDigest(m.Slots), m
	}

	before, m := apiDigest()
	s := waitFor("the tree's 4 shards", func(s pageState) bool { return s.Shards == "4" })
	if s.Digest != before || s.Epoch != fmt.Sprint(m.Epoch) || s.Rows != 4 || s.Reshard != "idle" || s.Error != "" {
		t.Fatalf("page before the reshard: %+v; API map digest %s epoch %d", s, before, m.Epoch)
	}

	// Without a coordinator the reshard shows as running and stays so.
	if a := adminCall(t, ctx, p, "POST", "/api/trees/dash/reshard", `{"shards":8}`); a.status != http.StatusAccepted {
		t.Fatalf("POST reshard: %d %s", a.status, a.body)
	}
	s = waitFor("the running reshard", func(s pageState) bool { return s.Reshard == "migrating" })
	if !strings.Contains(s.Bar, "resharding 4 → 8 shards: 4 now") {
		t.Errorf("progress text %q", s.Bar)
	}
	shot, err := chromedp.Run(browser, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.ArtifactDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard-reshard.png"), shot, 0o644); err != nil {
		t.Fatal(err)
	}

	startProxy(t, 3, roomyFreeze...) // its coordinator carries the reshard out
	s = waitFor("8 shards and no reshard", func(s pageState) bool { return s.Shards == "8" && s.Reshard == "idle" })
	after, m := apiDigest()
	if s.Digest != after || after == before || s.Epoch != fmt.Sprint(m.Epoch) || s.Rows != 8 || s.Error != "" {
		t.Errorf("page after the reshard: %+v; API map digest %s (was %s) epoch %d", s, after, before, m.Epoch)
	}
	if s.LoadID != "first-load" {
		t.Errorf("the page was reloaded (load id %q): it must update in place", s.LoadID)
	}

	// Hovering the last cell names its slot, shard and node.
	var shards []apiShard
	adminGet(t, ctx, p, "/api/trees/dash/shards", &shards)
	last := m.Slots[len(m.Slots)-1]
	var node string
	for _, sh := range shards {
		if sh.Index == last {
			node = sh.Node
		}
	}
	box, err := chromedp.Run(browser, chromedp.Evaluate[struct{ X, Y float64 }](`(() => { const r = document.querySelector('section.tree[data-tree="dash"] canvas').getBoundingClientRect(); return {x: r.right - 4, y: r.bottom - 4}; })()`))
	if err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(browser, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, box.X, box.Y)); err != nil {
		t.Fatal(err)
	}
	tip, err := chromedp.Run(browser, chromedp.Evaluate[string](`document.getElementById('tip').hidden ? '' : document.getElementById('tip').textContent`))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("slot 4095\nshard %d (lattice_s%04d)\nnode %s\n", last, last, node); !strings.HasPrefix(tip, want) {
		t.Errorf("tooltip %q, want it to start with %q", tip, want)
	}

	if shot, err = chromedp.Run(browser, chromedp.CaptureScreenshot()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "dashboard.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots: %s and dashboard-reshard.png beside it", path)
}
