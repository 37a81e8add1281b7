package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

type sqlErr struct{ code, msg string }

func (e sqlErr) Error() string    { return e.msg }
func (e sqlErr) SQLState() string { return e.code }

// fakeResharder records the reshards asked for and answers with err.
type fakeResharder struct {
	asked []string
	err   error
}

func (f *fakeResharder) Reshard(_ context.Context, tenant, tree string, n int) (string, error) {
	f.asked = append(f.asked, fmt.Sprintf("%s/%s:%d", tenant, tree, n))
	if f.err != nil {
		return "", f.err
	}
	return "resharding", nil
}

func (f *fakeResharder) Status(_ context.Context, tenant, tree string) (ReshardStatus, error) {
	return ReshardStatus{Tenant: tenant, Tree: tree, Phase: "migrating", Target: 8}, nil
}

func (f *fakeResharder) Running(context.Context) ([]ReshardStatus, error) { return nil, nil }

type fakeSelf struct{}

func (fakeSelf) Info() ProxyInfo                               { return ProxyInfo{ID: "p"} }
func (fakeSelf) DefaultTenant() string                         { return "main" }
func (fakeSelf) Tenants() []string                             { return nil }
func (fakeSelf) CachedEpoch(string, string) (uint64, bool)     { return 0, false }
func (fakeSelf) Proxies(context.Context) ([]ProxyLease, error) { return nil, nil }
func nopLog() *slog.Logger                                     { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
func noSizes(context.Context, *shardmap.Tree, *shardmap.Map) (map[int]ShardSize, error) {
	return nil, nil
}

// TestReshardRequest checks the POST's body handling and the mapping of the
// SQL function's errors to HTTP statuses.
func TestReshardRequest(t *testing.T) {
	cases := []struct {
		name, path, body string
		header           map[string]string // besides Content-Type: application/json
		err              error
		status           int
		answer           string // part of the answer
		asked            string // the reshard the resharder was asked for
	}{
		{name: "accepted", path: "/api/trees/t/reshard", body: `{"shards":8}`, status: 202, answer: `"message":"resharding"`, asked: "main/t:8"},
		{name: "tenant", path: "/api/trees/t/reshard?tenant=app", body: `{"shards":3}`, status: 202, asked: "app/t:3"},
		{name: "escaped name", path: "/api/trees/My%20Tree/reshard", body: `{"shards":3}`, status: 202, asked: "main/My Tree:3"},
		{name: "no count", path: "/api/trees/t/reshard", body: `{}`, status: 400, answer: `"sqlstate":"22023"`},
		{name: "not json", path: "/api/trees/t/reshard", body: `shards=8`, status: 400, answer: `"sqlstate":"22023"`},
		{name: "unknown field", path: "/api/trees/t/reshard", body: `{"shards":8,"force":true}`, status: 400},
		{name: "out of range", path: "/api/trees/t/reshard", body: `{"shards":1}`, err: sqlErr{"22023", "shard count 1 is out of range"}, status: 400,
			answer: `{"error":"shard count 1 is out of range","sqlstate":"22023"}`, asked: "main/t:1"},
		{name: "in progress", path: "/api/trees/t/reshard", body: `{"shards":9}`, err: sqlErr{"55000", "a reshard is in progress"}, status: 409, asked: "main/t:9"},
		{name: "unknown tree", path: "/api/trees/t/reshard", body: `{"shards":9}`, err: sqlErr{"42P01", `tree "t" does not exist`}, status: 404, asked: "main/t:9"},
		{name: "not sent as json", path: "/api/trees/t/reshard", body: `{"shards":8}`, header: map[string]string{"Content-Type": "text/plain"}, status: 400},
		{name: "from another site", path: "/api/trees/t/reshard", body: `{"shards":8}`, header: map[string]string{"Origin": "http://evil.example"}, status: 403, answer: `"sqlstate":"42501"`},
		{name: "from the page", path: "/api/trees/t/reshard", body: `{"shards":8}`, header: map[string]string{"Origin": "http://example.com"}, status: 202, asked: "main/t:8"},
		{name: "store down", path: "/api/trees/t/reshard", body: `{"shards":9}`, err: errors.New("redis: connection refused"), status: 500,
			answer: `{"error":"redis: connection refused"}`, asked: "main/t:9"},
		{name: "rejected", path: "/api/trees/t/reshard", body: `{"shards":9}`, status: 409, asked: "main/t:9",
			err:    fmt.Errorf("coordinator: %w", sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "a reshard is in progress")),
			answer: `{"error":"a reshard is in progress","sqlstate":"55000"}`},
		{name: "store out of reach", path: "/api/trees/t/reshard", body: `{"shards":9}`, status: 500, asked: "main/t:9",
			err: &shardmap.UnavailableError{Err: errors.New("connection refused")}, answer: `"sqlstate":"58000"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rs := &fakeResharder{err: tc.err}
			s := &Server{Log: nopLog(), API: &API{Resharder: rs, Self: fakeSelf{}, Sizes: NewSizeCache(noSizes, time.Second, time.Second, nopLog()), Log: nopLog()}}
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json; charset=utf-8")
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			s.Handler().ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Errorf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if !strings.Contains(rec.Body.String(), tc.answer) {
				t.Errorf("answer %s lacks %s", rec.Body, tc.answer)
			}
			if got := strings.Join(rs.asked, ","); got != tc.asked {
				t.Errorf("asked for %q, want %q", got, tc.asked)
			}
		})
	}
}

// TestSizeCache checks that estimates are read once per TTL and epoch, and
// that the last ones known survive a failed read.
func TestSizeCache(t *testing.T) {
	tree := &shardmap.Tree{Tenant: "a", Name: "t"}
	type step struct {
		epoch   uint64
		wait    bool // let the TTL pass first
		fail    bool // the read fails
		reads   int  // reads so far, after this step
		wantRow int64
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{name: "cached within the ttl", steps: []step{{epoch: 1, reads: 1, wantRow: 1}, {epoch: 1, reads: 1, wantRow: 1}}},
		{name: "a new epoch reads again", steps: []step{{epoch: 1, reads: 1, wantRow: 1}, {epoch: 2, reads: 2, wantRow: 2}}},
		{name: "the ttl passes", steps: []step{{epoch: 1, reads: 1, wantRow: 1}, {epoch: 1, wait: true, reads: 2, wantRow: 2}}},
		{name: "a failure keeps the last", steps: []step{{epoch: 1, reads: 1, wantRow: 1}, {epoch: 2, fail: true, reads: 2, wantRow: 1}, {epoch: 2, reads: 2, wantRow: 1}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reads, fail := 0, false
			now := time.Now()
			fetch := func(context.Context, *shardmap.Tree, *shardmap.Map) (map[int]ShardSize, error) {
				reads++
				if fail {
					return nil, errors.New("node down")
				}
				return map[int]ShardSize{0: {Rows: int64(reads)}}, nil
			}
			c := NewSizeCache(fetch, time.Hour, time.Second, nopLog())
			for i, s := range tc.steps {
				fail = s.fail
				if s.wait {
					for _, e := range c.entries {
						e.at = now.Add(-2 * time.Hour)
					}
				}
				got := c.Get(context.Background(), tree, &shardmap.Map{Epoch: s.epoch})
				if reads != s.reads || got[0].Rows != s.wantRow {
					t.Errorf("step %d: %d reads, rows %d; want %d reads, rows %d", i, reads, got[0].Rows, s.reads, s.wantRow)
				}
			}
		})
	}
}
