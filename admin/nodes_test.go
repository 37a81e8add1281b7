package admin

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/lattice-db/lattice/sqlstate"
)

// fakeNoder records the changes asked for and answers with err.
type fakeNoder struct {
	asked []string
	err   error
}

func (f *fakeNoder) Nodes(context.Context, string) ([]NodeInfo, error) {
	return []NodeInfo{{Name: "n1", Catalog: true, Reachable: true}}, nil
}

func (f *fakeNoder) AddNode(_ context.Context, tenant, name, dsn string) (string, error) {
	f.asked = append(f.asked, "add "+tenant+"/"+name+" "+dsn)
	return "node " + name + " added", f.err
}

func (f *fakeNoder) RemoveNode(_ context.Context, name string) (string, error) {
	f.asked = append(f.asked, "remove "+name)
	return "node " + name + " removed", f.err
}

// TestNodeRequests checks the node routes' bodies, the refusal of another
// site's page, and the statuses of the node functions' errors.
func TestNodeRequests(t *testing.T) {
	for _, tc := range []struct {
		name, method, path, body string
		header                   map[string]string
		err                      error
		status                   int
		answer, asked            string
	}{
		{name: "list", method: "GET", path: "/api/nodes", status: 200, answer: `"catalog":true`},
		{name: "add", method: "POST", path: "/api/nodes", body: `{"name":"n4","dsn":"postgres://u@h/db"}`, status: 201,
			answer: `"message":"node n4 added"`, asked: "add main/n4 postgres://u@h/db"},
		{name: "add, no dsn", method: "POST", path: "/api/nodes", body: `{"name":"n4"}`, status: 400, answer: `"hint":`},
		{name: "add, duplicate", method: "POST", path: "/api/nodes", body: `{"name":"n2","dsn":"postgres://u@h/db"}`, status: 409,
			err: sqlstate.New(sqlstate.DuplicateObject, "node n2 already exists").WithHint("choose another name"), answer: `"hint":"choose another name"`,
			asked: "add main/n2 postgres://u@h/db"},
		{name: "add, unreachable", method: "POST", path: "/api/nodes", body: `{"name":"n4","dsn":"postgres://u@h/db"}`, status: 502,
			err: sqlstate.New(sqlstate.SQLClientUnableToEstablishSQLConnection, "cannot connect"), asked: "add main/n4 postgres://u@h/db"},
		{name: "add from another site", method: "POST", path: "/api/nodes", body: `{"name":"n4","dsn":"postgres://u@h/db"}`,
			header: map[string]string{"Origin": "http://evil.example"}, status: 403},
		{name: "remove", method: "DELETE", path: "/api/nodes/n4", status: 200, answer: `"message":"node n4 removed"`, asked: "remove n4"},
		{name: "remove, holds shards", method: "DELETE", path: "/api/nodes/n2", status: 409,
			err: sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "node n2 holds 3 shards"), asked: "remove n2"},
		{name: "remove, unknown", method: "DELETE", path: "/api/nodes/n9", status: 404,
			err: sqlstate.New(sqlstate.UndefinedObject, "node n9 does not exist"), asked: "remove n9"},
		{name: "remove from another site", method: "DELETE", path: "/api/nodes/n4",
			header: map[string]string{"Origin": "http://evil.example"}, status: 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nd := &fakeNoder{err: tc.err}
			s := &Server{Log: nopLog(), API: &API{Resharder: &fakeResharder{}, Self: fakeSelf{}, Nodes: nd,
				Sizes: NewSizeCache(noSizes, time.Second, time.Second, nopLog()), Log: nopLog()}}
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			if tc.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			s.Handler().ServeHTTP(rec, req)
			if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.answer) {
				t.Errorf("%s %s = %d %s; want %d with %s", tc.method, tc.path, rec.Code, rec.Body, tc.status, tc.answer)
			}
			if got := strings.Join(nd.asked, ","); got != tc.asked {
				t.Errorf("asked %q, want %q", got, tc.asked)
			}
		})
	}
}
