package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lattice-db/lattice/localnode"
	"github.com/lattice-db/lattice/shardmap"
)

// adminRequest sends one request to p's admin endpoint as given (no token
// unless the test sets one) and returns the status and body.
func adminRequest(t *testing.T, client *http.Client, req *http.Request) (int, string) {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// TestAdminToken: with a token, every admin path but /healthz, /readyz and
// /metrics needs it, pprof included; the page signs in with a form that
// sets a cookie; a bearer token works under any Host.
func TestAdminToken(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1)
	base := "http://" + p.AdminAddr
	_, port, _ := net.SplitHostPort(p.AdminAddr)
	tests := []struct {
		name, method, path, host, token string
		want                            int
	}{
		{name: "healthz open", path: "/healthz", want: 200},
		{name: "readyz open", path: "/readyz", want: 200},
		{name: "metrics open", path: "/metrics", want: 200},
		{name: "status without token", path: "/api/status", want: 401},
		{name: "status with a wrong token", path: "/api/status", token: "not-the-token-not-the-token", want: 401},
		{name: "status with the token", path: "/api/status", token: p.AdminToken, want: 200},
		{name: "reshard without token", method: "POST", path: "/api/trees/nosuch/reshard", want: 401},
		{name: "pprof without token", path: "/debug/pprof/", want: 401},
		{name: "pprof profile without token", path: "/debug/pprof/profile?seconds=1", want: 401},
		{name: "pprof with the token", path: "/debug/pprof/", token: p.AdminToken, want: 200},
		{name: "page without token: the sign-in form", path: "/", want: 401},
		{name: "rebinding host without token", path: "/api/status", host: "rebind.example:" + port, want: 421},
		{name: "another host with the token", path: "/api/status", host: "proxy1.internal:" + port, token: p.AdminToken, want: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = "GET"
			}
			var body io.Reader
			if method == "POST" {
				body = strings.NewReader(`{"shards": 2}`)
			}
			req, err := http.NewRequest(method, base+tc.path, body)
			if err != nil {
				t.Fatal(err)
			}
			if method == "POST" {
				req.Header.Set("Content-Type", "application/json")
			}
			if tc.host != "" {
				req.Host = tc.host
			}
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			if code, b := adminRequest(t, http.DefaultClient, req); code != tc.want {
				t.Errorf("%s %s (Host %s): %d, want %d: %.200s", method, tc.path, req.Host, code, tc.want, b)
			}
		})
	}

	// The page's sign-in: a wrong token sets no cookie; the right one sets
	// an HttpOnly, SameSite=Strict cookie that then opens the API.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	resp, err := browser.PostForm(base+"/login", url.Values{"token": {"wrong-wrong-wrong-wrong"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || len(resp.Cookies()) != 0 {
		t.Errorf("sign-in with a wrong token: %s, cookies %v", resp.Status, resp.Cookies())
	}
	noRedirect := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = noRedirect.PostForm(base+"/login", url.Values{"token": {p.AdminToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 {
		t.Fatalf("sign-in: %s, cookies %v", resp.Status, resp.Cookies())
	}
	if c := resp.Cookies()[0]; !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || strings.Contains(c.Value, p.AdminToken) {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, not the token", c)
	}
	req, _ := http.NewRequest("GET", base+"/api/status", nil)
	if code, b := adminRequest(t, browser, req); code != 200 {
		t.Errorf("/api/status with the sign-in cookie: %d %.200s", code, b)
	}
}

// TestAdminNoToken: without a token the loopback endpoint serves the API,
// but refuses pprof, and a DNS-rebinding page (Host rebind.example with a
// matching Origin) cannot start a reshard.
func TestAdminNoToken(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--admin-token-file", "")
	base := "http://" + p.AdminAddr
	_, port, _ := net.SplitHostPort(p.AdminAddr)

	req, _ := http.NewRequest("GET", base+"/api/status", nil)
	if code, b := adminRequest(t, http.DefaultClient, req); code != 200 {
		t.Errorf("/api/status on loopback without a token: %d %.200s", code, b)
	}
	req, _ = http.NewRequest("GET", base+"/debug/pprof/", nil)
	if code, b := adminRequest(t, http.DefaultClient, req); code != http.StatusForbidden {
		t.Errorf("/debug/pprof/ without a configured token: %d %.200s", code, b)
	}
	req, _ = http.NewRequest("POST", base+"/api/trees/dash/reshard?tenant=lattice", strings.NewReader(`{"shards": 8}`))
	req.Host = "rebind.example:" + port
	req.Header.Set("Origin", "http://rebind.example:"+port)
	req.Header.Set("Content-Type", "application/json")
	if code, b := adminRequest(t, http.DefaultClient, req); code != http.StatusMisdirectedRequest {
		t.Errorf("rebinding page's reshard: %d, want 421: %.200s", code, b)
	}
}

// runServe runs `lattice serve` with args and env (added to the test's,
// less LATTICE_ADMIN_TOKEN) and, when it exits within timeout, returns its
// output and true.
func runServe(t *testing.T, timeout time.Duration, env []string, args ...string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, latticeBinary(t), append([]string{"serve"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LATTICE_ADMIN_TOKEN=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		return out.String(), false
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("lattice serve %q: %v\n%s", args, err, out.String())
	}
	return out.String(), true
}

func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := localnode.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// TestAdminNonLoopbackNeedsToken: an admin endpoint on every address
// without a token is refused at startup; with one (from the environment)
// the proxy serves.
func TestAdminNonLoopbackNeedsToken(t *testing.T) {
	args := func() []string {
		_, adminPort, _ := net.SplitHostPort(freeAddr(t))
		return []string{"--listen", freeAddr(t), "--admin", "0.0.0.0:" + adminPort, "--redis", testRedisURL(t), "--node", "n1=" + testNodeDSN(t, 0)}
	}
	out, exited := runServe(t, 60*time.Second, nil, args()...)
	if !exited || !strings.Contains(out, "is not a loopback address and no admin token is configured") {
		t.Fatalf("non-loopback --admin without a token: exited %v, output:\n%s", exited, out)
	}
	// With a token it starts: it is still running when the wait ends. A
	// port taken before the proxy bound it is chosen again, as
	// startProxyAt does.
	for attempt := 1; ; attempt++ {
		out, exited = runServe(t, 5*time.Second, []string{"LATTICE_ADMIN_TOKEN=a-token-from-the-environment"}, args()...)
		if !exited || attempt == 3 || !portTaken(out) {
			break
		}
	}
	if exited {
		t.Fatalf("non-loopback --admin with a token exited:\n%s", out)
	}
}

// TestSecretsNotLogged: Redis URLs with a password, from the environment
// and from a file, that are malformed or unreachable, end the proxy with
// an error that does not show the password.
func TestSecretsNotLogged(t *testing.T) {
	const pw = "s3cret-redis-pw"
	urlFile := filepath.Join(t.TempDir(), "redis-url")
	if err := os.WriteFile(urlFile, []byte("redis://:"+pw+"@127.0.0.1:1/0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"malformed, from the environment", []string{"LATTICE_REDIS_URL=redis://:" + pw + "@local host:6379/0%zz"}, nil},
		{"malformed sentinel URL", []string{"LATTICE_REDIS_URL=redis-sentinel://:" + pw + "@s1:26379,s2:26379/m%zz"}, nil},
		{"unreachable, from a file", nil, []string{"--redis-url-file", urlFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--listen", freeAddr(t), "--admin", freeAddr(t), "--node", "n1=" + testNodeDSN(t, 0)}, tc.args...)
			out, exited := runServe(t, 60*time.Second, tc.env, args...)
			if !exited || !strings.Contains(out, "redis") {
				t.Fatalf("exited %v, output:\n%s", exited, out)
			}
			if strings.Contains(out, pw) {
				t.Errorf("the proxy's output shows the Redis password:\n%s", out)
			}
		})
	}
}

// TestNodeErrorsHideAddress stops a node under a running proxy whose node
// DSNs (from a nodes file) carry a password: the errors clients get name
// the node (n2), not its host:port or user, and the proxy's log never
// shows the password.
func TestNodeErrorsHideAddress(t *testing.T) {
	const pw = "s3cret-node-pw"
	fc := startFaultCluster(t, 2)
	var lines []string
	for i, dsn := range fc.nodeDSNs() {
		// The nodes trust local connections: the password is only carried.
		lines = append(lines, fmt.Sprintf("n%d=%s", i+1, strings.Replace(dsn, "lattice@", "lattice:"+pw+"@", 1)))
	}
	nodesFile := filepath.Join(t.TempDir(), "nodes")
	if err := os.WriteFile(nodesFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxyOn(t, fc.redis.URL(), nil, nil, "--nodes-file", nodesFile)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, p.DSN("lattice"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	createFaultTreeIn(t, ctx, pool, "hide", 500, 4)
	tr, m, err := fc.shardMap(ctx, "hide")
	if err != nil {
		t.Fatal(err)
	}
	keys := keysOn(t, tr, m, "k-", 6, func(_ int, sh shardmap.Shard) bool { return sh.Node == "n2" })
	for _, k := range keys[:2] { // backends to n2 in the proxy's pool
		if _, err := pool.Exec(ctx, "SELECT v FROM hide WHERE k = $1", k); err != nil {
			t.Fatal(err)
		}
	}
	n2 := fc.nodes[1]
	if err := n2.Stop(); err != nil {
		t.Fatal(err)
	}
	n2URL, err := url.Parse(fc.nodeDSN(1))
	if err != nil {
		t.Fatal(err)
	}
	n2Port := n2URL.Port()
	leaks := []string{"127.0.0.1", ":" + n2Port, "user=", "lattice@", pw}
	named := false
	stmts := []string{"SELECT count(*) FROM hide"}
	for _, k := range keys {
		stmts = append(stmts, "SELECT v FROM hide WHERE k = '"+k+"'")
	}
	for _, q := range stmts {
		sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := pool.Exec(sctx, q)
		scancel()
		var pg *pgconn.PgError
		if !errors.As(err, &pg) {
			t.Fatalf("%s with n2 stopped: %v, want an error from the proxy", q, err)
		}
		text := pg.Message + " | " + pg.Detail + " | " + pg.Hint
		t.Logf("%s: %s (SQLSTATE %s)", q, text, pg.Code)
		for _, leak := range leaks {
			if strings.Contains(text, leak) {
				t.Errorf("%s: the client's error shows %q: %s", q, leak, text)
			}
		}
		named = named || strings.Contains(pg.Message, "n2")
	}
	if !named {
		t.Error("no error named the node n2")
	}
	if strings.Contains(p.Log(), pw) {
		t.Errorf("the proxy's log shows the node password")
	}
}
