package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lattice-db/lattice/admin"
)

// fakeAPI answers the admin API's paths with canned JSON; tree answers
// GET /api/trees/dash one after another (the last one repeats).
type fakeAPI struct {
	t      *testing.T
	status string
	shards string
	post   func(w http.ResponseWriter, body string)
	mu     sync.Mutex
	tree   []string
	polls  int
	migs   string
	seen   []string // "METHOD path?query" of every request
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = append(f.seen, r.Method+" "+r.URL.RequestURI())
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == "GET" && r.URL.Path == "/api/status":
		io.WriteString(w, f.status)
	case r.Method == "GET" && r.URL.Path == "/api/trees/dash/shards":
		io.WriteString(w, f.shards)
	case r.Method == "GET" && r.URL.Path == "/api/trees/nope/shards":
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":"tree \"nope\" does not exist","sqlstate":"42P01"}`)
	case r.Method == "POST" && r.URL.Path == "/api/trees/dash/reshard":
		b, _ := io.ReadAll(r.Body)
		f.post(w, string(b))
	case r.Method == "GET" && r.URL.Path == "/api/trees/dash":
		i := min(f.polls, len(f.tree)-1)
		f.polls++
		if f.tree[i] == "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":"store down"}`)
			return
		}
		io.WriteString(w, f.tree[i])
	case r.Method == "GET" && r.URL.Path == "/api/migrations":
		io.WriteString(w, f.migs)
	default:
		f.t.Errorf("unexpected request %s %s", r.Method, r.URL)
		http.NotFound(w, r)
	}
}

// testCLI returns a cli writing to buffers, with a clock that advances by
// half a second per reading.
func testCLI(tty bool) (*cli, *bytes.Buffer) {
	var out bytes.Buffer
	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return &cli{out: &out, errOut: io.Discard, tty: tty, interval: time.Millisecond, maxPollErrors: 3,
		now: func() time.Time { clock = clock.Add(500 * time.Millisecond); return clock }}, &out
}

func treeJSON(shards, epoch int, rs *admin.ReshardStatus) string {
	b, _ := json.Marshal(admin.TreeSummary{Tenant: "app", Name: "dash", Key: "id", KeyType: "int", Shards: shards, Slots: 4096, Epoch: uint64(epoch), Reshard: rs})
	return string(b)
}

func running(shards, inFlight int, rows int64) *admin.ReshardStatus {
	eta := 12.0
	return &admin.ReshardStatus{Tenant: "app", Tree: "dash", Phase: "migrating", From: 4, Target: 8, Shards: shards, MigrationsInFlight: inFlight, RowsCopied: rows, ETASeconds: &eta}
}

func accepted(w http.ResponseWriter, body string) {
	if body != `{"shards":8}` {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":"bad body `+body+`","sqlstate":"22023"}`)
		return
	}
	w.WriteHeader(http.StatusAccepted)
	io.WriteString(w, `{"phase":"migrating","from":4,"target":8,"shards":4,"message":"resharding dash from 4 to 8 shards (splitting)"}`)
}

func TestCLI(t *testing.T) {
	const status = `{"proxy":{"id":"p1","version":"v9","coordinator":true,"live":true,"epoch_lag":2},
		"proxies":[{"id":"p1","lease_expires":"2026-01-02T03:04:05Z"},{"id":"p2","lease_expires":"2026-01-02T03:04:06Z"}],
		"trees":[{"tenant":"app","name":"dash","key":"id","key_type":"int","shards":5,"slots":4096,"epoch":12,
		"reshard":{"phase":"migrating","from":4,"target":8,"shards":5,"migrations_in_flight":3,"eta_seconds":30.4},
		"operations":[{"id":"op1","kind":"merge","tree":"src","target":"dash","phase":"copy","rows_done":40,"rows_total":100,"started":"2026-01-02T03:00:00Z","eta_seconds":90.2}]},
		{"tenant":"app","name":"users","key":"email","key_type":"text","shards":64,"slots":4096,"epoch":1,"reshard":null,
		"operations":[{"id":"op2","kind":"snapshot","tree":"users","target":"users_copy","phase":"pause","rows_done":0,"rows_total":0,"started":"2026-01-02T03:04:00Z","eta_seconds":null}]}]}`
	const shards = `[{"index":0,"node":"n1","schema":"lattice_s0000","state":"active","slots":2048,"slot_ranges":"0-2047","rows_estimate":1500,"bytes_estimate":180224},
		{"index":1,"node":"n2","schema":"lattice_s0001","state":"retired","slots":0,"slot_ranges":"","rows_estimate":null,"bytes_estimate":null},
		{"index":2,"node":"n2","schema":"lattice_s0002","state":"active","slots":2048,"slot_ranges":"2048-4095","rows_estimate":7,"bytes_estimate":512}]`
	const migs = `[{"kind":"split","phase":"copy"},{"kind":"split","phase":"copy"},{"kind":"split","phase":"drain","last_error":""}]`

	cases := []struct {
		name    string
		tty     bool
		args    []string
		run     func(c *cli, ctx context.Context, args []string) error
		tree    []string
		post    func(w http.ResponseWriter, body string)
		want    string // whole output, or
		wantErr string // a part of the error
		seen    string // a request that must have been made
	}{
		{name: "status", run: (*cli).statusCmd, want: `proxy p1: version v9, coordinator, live, epoch lag 2
live proxies: 2
  p1  lease until 2026-01-02T03:04:05Z
  p2  lease until 2026-01-02T03:04:06Z

TENANT  TREE   KEY           SHARDS  SLOTS  EPOCH  RESHARD
app     dash   id (int)      5       4096   12     migrating 4 -> 8 shards, 5 now, 3 migrations in flight, ETA 30s
app     users  email (text)  64      4096   1      -
merge op1 of app/src: phase copy, 40 of 100 rows, running since 2026-01-02T03:00:00Z, ETA 1m30s
snapshot op2 of app/users: phase pause, 0 of 0 rows, running since 2026-01-02T03:04:00Z, ETA unknown
`},
		{name: "shards", args: []string{"dash", "--tenant", "app"}, run: (*cli).shardsCmd, seen: "GET /api/trees/dash/shards?tenant=app", want: `SHARD  NODE  SCHEMA         STATE    SLOTS  SLOT RANGES  ROWS (EST.)  SIZE
0      n1    lattice_s0000  active   2048   0-2047       1500         176.0 KiB
1      n2    lattice_s0001  retired  0                   -            -
2      n2    lattice_s0002  active   2048   2048-4095    7            512 B
`},
		{name: "shards of an unknown tree", args: []string{"nope"}, run: (*cli).shardsCmd, wantErr: `tree "nope" does not exist (SQLSTATE 42P01)`},
		{name: "shards without a tree", args: []string{}, run: (*cli).shardsCmd, wantErr: "usage: lattice shards TREE"},
		{name: "reshard without wait", args: []string{"dash", "8"}, run: (*cli).reshardCmd, post: accepted,
			want: "resharding dash from 4 to 8 shards (splitting)\n"},
		{name: "reshard refused", args: []string{"dash", "8"}, run: (*cli).reshardCmd,
			post: func(w http.ResponseWriter, _ string) {
				w.WriteHeader(http.StatusConflict)
				io.WriteString(w, `{"error":"a reshard of dash to 6 shards is in progress; wait for it before asking for 8","sqlstate":"55000"}`)
			},
			wantErr: "a reshard of dash to 6 shards is in progress; wait for it before asking for 8 (SQLSTATE 55000)"},
		{name: "reshard of a bad count", args: []string{"dash", "eight"}, run: (*cli).reshardCmd, wantErr: `shard count "eight" is not an integer`},
		{name: "reshard wait plain", args: []string{"--wait", "dash", "8"}, run: (*cli).reshardCmd, post: accepted,
			tree: []string{treeJSON(4, 1, running(4, 3, 0)), treeJSON(4, 1, running(4, 3, 0)), treeJSON(6, 5, running(6, 3, 100)), treeJSON(8, 9, nil)},
			want: `resharding dash from 4 to 8 shards (splitting)
[   0.5s] 4/8 shards, 3 migrations in flight (2 split copy, 1 split drain), 0 rows copied
[   1.5s] 6/8 shards, 3 migrations in flight (2 split copy, 1 split drain), 100 rows copied
done: dash has 8 shards (epoch 9) after 2s
`},
		{name: "reshard wait on a terminal", tty: true, args: []string{"dash", "8", "--wait"}, run: (*cli).reshardCmd, post: accepted,
			tree: []string{treeJSON(6, 5, running(6, 3, 100)), treeJSON(8, 9, nil)},
			want: "resharding dash from 4 to 8 shards (splitting)\n" +
				"\r[###############...............] ETA 12s 6/8 shards, 3 migrations in flight (2 split copy, 1 split drain), 100 rows copied\x1b[K\n" +
				"done: dash has 8 shards (epoch 9) after 1s\n"},
		{name: "reshard wait ends short", args: []string{"dash", "8", "--wait"}, run: (*cli).reshardCmd, post: accepted,
			tree: []string{treeJSON(6, 5, nil)}, wantErr: "the reshard of dash ended with 6 shards, not 8"},
		{name: "reshard wait survives a failed poll", args: []string{"dash", "8", "--wait"}, run: (*cli).reshardCmd, post: accepted,
			tree: []string{"", treeJSON(8, 9, nil)}, want: "resharding dash from 4 to 8 shards (splitting)\ndone: dash has 8 shards (epoch 9) after 500ms\n"},
		{name: "reshard wait gives up", args: []string{"dash", "8", "--wait"}, run: (*cli).reshardCmd, post: accepted,
			tree: []string{""}, wantErr: "waiting for the reshard of dash: store down"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeAPI{t: t, status: status, shards: shards, post: tc.post, tree: tc.tree, migs: migs}
			srv := httptest.NewServer(f)
			defer srv.Close()
			c, out := testCLI(tc.tty)
			err := tc.run(c, context.Background(), append([]string{"--admin", srv.URL}, tc.args...))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := out.String(); got != tc.want {
				t.Errorf("output:\n%q\nwant:\n%q", got, tc.want)
			}
			if tc.seen != "" && !strings.Contains(strings.Join(f.seen, "\n"), tc.seen) {
				t.Errorf("requests %q lack %q", f.seen, tc.seen)
			}
		})
	}
}

func TestAdminURL(t *testing.T) {
	cases := []struct{ in, want, err string }{
		{in: "127.0.0.1:9090", want: "http://127.0.0.1:9090"},
		{in: "http://admin.internal:9090/", want: "http://admin.internal:9090"},
		{in: "https://h/x", want: "https://h/x"},
		{in: "http://", err: "want a URL"},
	}
	for _, tc := range cases {
		c, err := newAPIClient(tc.in, "")
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || c.base != tc.want {
			t.Errorf("%q: %v %v, want %q", tc.in, c, err, tc.want)
		}
	}
}
