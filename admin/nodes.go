package admin

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/lattice-db/lattice/sqlstate"
)

// Noder adds, lists and removes nodes with the code behind lattice_add_node,
// lattice_nodes and lattice_remove_node. Its errors carry a SQLSTATE.
type Noder interface {
	Nodes(ctx context.Context, tenant string) ([]NodeInfo, error)
	AddNode(ctx context.Context, tenant, name, dsn string) (string, error)
	RemoveNode(ctx context.Context, name string) (string, error)
}

// NodeInfo is one node as lattice_nodes shows it, for one tenant.
type NodeInfo struct {
	Name      string    `json:"name"`
	DSN       string    `json:"dsn"` // never with a password
	State     string    `json:"state"`
	Catalog   bool      `json:"catalog"`
	Reachable bool      `json:"reachable"`
	Shards    int       `json:"shards"`
	Slots     int       `json:"slots"`
	Bytes     *int64    `json:"bytes"` // null when the node does not answer
	Added     time.Time `json:"added"`
}

// NodeChange is the answer of POST /api/nodes and DELETE /api/nodes/{name}.
type NodeChange struct {
	Message string `json:"message"`
}

// nodeBody is the body of POST /api/nodes.
type nodeBody struct {
	Name string `json:"name"`
	DSN  string `json:"dsn"`
}

// nodeCheckTimeout bounds POST /api/nodes: the checks of a new node take
// up to 10 s to decide it does not answer, past apiTimeout.
const nodeCheckTimeout = 30 * time.Second

func (a *API) nodeRoutes(mux *http.ServeMux) {
	if a.Nodes == nil {
		return
	}
	mux.HandleFunc("GET /api/nodes", a.handle(a.listNodes))
	mux.HandleFunc("POST /api/nodes", a.handleWithin(nodeCheckTimeout, a.addNode))
	mux.HandleFunc("DELETE /api/nodes/{name}", a.handle(a.removeNode))
}

func (a *API) listNodes(ctx context.Context, r *http.Request) (int, any, error) {
	ns, err := a.Nodes.Nodes(ctx, a.tenantOf(r))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, ns, nil
}

func (a *API) addNode(ctx context.Context, r *http.Request) (int, any, error) {
	if err := crossSite(r); err != nil {
		return 0, nil, err
	}
	var body nodeBody
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Name == "" || body.DSN == "" {
		return 0, nil, sqlstate.New(sqlstate.InvalidParameterValue, `body must be {"name": ..., "dsn": ...}`).
			WithHint(`send {"name": "n4", "dsn": "postgres://user@host:port/database"}, the DSN without password`)
	}
	msg, err := a.Nodes.AddNode(ctx, a.tenantOf(r), body.Name, body.DSN)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, NodeChange{Message: msg}, nil
}

func (a *API) removeNode(ctx context.Context, r *http.Request) (int, any, error) {
	// A DELETE from another origin needs a preflight this endpoint does
	// not grant; a browser still names the page's origin.
	if o := r.Header.Get("Origin"); o != "" {
		if u, err := url.Parse(o); err != nil || u.Host != r.Host {
			return 0, nil, sqlstate.New(sqlstate.InsufficientPrivilege, "origin %q may not remove nodes here", o)
		}
	}
	msg, err := a.Nodes.RemoveNode(ctx, r.PathValue("name"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, NodeChange{Message: msg}, nil
}
