package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// Catalog is the shard-map store as the API reads it; shardmap.RedisStore
// implements it.
type Catalog interface {
	Trees(ctx context.Context, tenant string) ([]*shardmap.Tree, error)
	Tree(ctx context.Context, tenant, name string) (*shardmap.Tree, error)
	Map(ctx context.Context, tenant, tree string) (*shardmap.Map, error)
	Migrations(ctx context.Context, tenant, tree string) ([]*shardmap.Migration, error)
}

// Resharder starts and reports reshards with the code behind the SQL
// functions lattice_reshard and lattice_reshard_status, so that both give
// the same answers. Its errors carry a SQLSTATE (a sqlstate.Error).
type Resharder interface {
	Reshard(ctx context.Context, tenant, tree string, n int) (string, error)
	// Status reports a tree's reshard; Phase "idle" when none runs.
	Status(ctx context.Context, tenant, tree string) (ReshardStatus, error)
	// Running reports every running reshard of every tenant.
	Running(ctx context.Context) ([]ReshardStatus, error)
}

// Self describes the proxy that serves the API.
type Self interface {
	Info() ProxyInfo
	DefaultTenant() string
	// Tenants lists the tenants this proxy knows of.
	Tenants() []string
	// CachedEpoch is the epoch of the tree's map this proxy routes by.
	CachedEpoch(tenant, tree string) (uint64, bool)
	// Proxies lists the live proxies of the registry.
	Proxies(ctx context.Context) ([]ProxyLease, error)
}

// SizeFunc estimates each shard's rows and bytes from the nodes' statistics.
type SizeFunc func(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (map[int]ShardSize, error)

// ShardSize is one shard's estimated size.
type ShardSize struct{ Rows, Bytes int64 }

// API is the JSON API and the page. Every field must be set.
type API struct {
	Catalog   Catalog
	Resharder Resharder
	Self      Self
	Sizes     *SizeCache
	Log       *slog.Logger
	// Nodes serves /api/nodes; nil leaves those routes out.
	Nodes Noder
	// Load reads the load signal (load.go); nil leaves the rates out.
	Load shardmap.LoadReader
	// ETA estimates each tree operation's time left (treeops.go); nil
	// leaves the estimates null.
	ETA TreeOpEstimator
}

// ProxyInfo is the proxy serving the request.
type ProxyInfo struct {
	ID          string `json:"id"`
	Version     string `json:"version"`
	Coordinator bool   `json:"coordinator"`
	// Live: the proxy's registration is current, so it serves.
	Live bool `json:"live"`
	// ServingCached: the registration lapsed (Redis is out of reach) and
	// the proxy serves from its cached maps, holding up reshards.
	ServingCached bool `json:"serving_cached"`
	// EpochLag is the most epochs by which this proxy's cached map trails
	// the store, over the trees of the status.
	EpochLag uint64 `json:"epoch_lag"`
}

// ProxyLease is a live proxy of the registry.
type ProxyLease struct {
	ID           string    `json:"id"`
	LeaseExpires time.Time `json:"lease_expires"`
}

// Status is GET /api/status.
type Status struct {
	Proxy   ProxyInfo     `json:"proxy"`
	Proxies []ProxyLease  `json:"proxies"`
	Trees   []TreeSummary `json:"trees"`
}

// TreeSummary is one tree.
type TreeSummary struct {
	Tenant  string `json:"tenant"`
	Name    string `json:"name"`
	Key     string `json:"key"`
	KeyType string `json:"key_type"`
	Shards  int    `json:"shards"` // distinct shards that own slots
	Slots   int    `json:"slots"`
	Epoch   uint64 `json:"epoch"`
	// Group is the tree's colocation group, "" (left out) for a tree alone.
	Group   string         `json:"group,omitempty"`
	Reshard *ReshardStatus `json:"reshard"` // null when none runs
	// Autonomic is what the tree's split monitor and healing did at their
	// last pass, and why; left out when no proxy's pass stored one.
	Autonomic *shardmap.AutonomicStatus `json:"autonomic,omitempty"`
	// Operations are the tree operations (resize, snapshot, merge) that
	// read or write the tree, left out when none runs.
	Operations []TreeOpInfo `json:"operations,omitempty"`
	// ShardList is set by GET /api/trees/{tree} only.
	ShardList []ShardInfo `json:"shard_list,omitempty"`
}

// ReshardStatus is a tree's reshard.
type ReshardStatus struct {
	Tenant             string     `json:"tenant"`
	Tree               string     `json:"tree"`
	Phase              string     `json:"phase"`
	From               int        `json:"from"`
	Target             int        `json:"target"`
	Shards             int        `json:"shards"`
	MigrationsInFlight int        `json:"migrations_in_flight"`
	RowsCopied         int64      `json:"rows_copied"`
	LagBytes           int64      `json:"lag_bytes"`
	ETASeconds         *float64   `json:"eta_seconds"`
	StartedAt          *time.Time `json:"started_at"`
	// VerifyFailed names a migration whose verification failed (phase
	// verify_failed), VerifyFailedSlots the slots that differ.
	VerifyFailed      string `json:"verify_failed,omitempty"`
	VerifyFailedSlots string `json:"verify_failed_slots,omitempty"`
	// Message is what POST /api/trees/{tree}/reshard did, as the SQL
	// function lattice_reshard says it.
	Message string `json:"message,omitempty"`
}

// ShardInfo is one shard, as lattice_shards shows it, with size estimates.
type ShardInfo struct {
	Index         int    `json:"index"`
	Node          string `json:"node"`
	Schema        string `json:"schema"`
	State         string `json:"state"`
	Slots         int    `json:"slots"`
	SlotRanges    string `json:"slot_ranges"`
	RowsEstimate  *int64 `json:"rows_estimate"` // null when the nodes did not answer in time
	BytesEstimate *int64 `json:"bytes_estimate"`
	// Load is the shard's rates, summed over its slots and every proxy;
	// null without a load signal.
	Load *shardmap.SlotRate `json:"load"`
}

// MapInfo is a tree's slot map.
type MapInfo struct {
	Epoch  uint64 `json:"epoch"`
	Slots  []int  `json:"slots"`  // slot -> shard index
	Frozen []int  `json:"frozen"` // slots whose statements are held
}

// MigrationInfo is one split or fold in flight.
type MigrationInfo struct {
	ID         string `json:"id"`
	Tenant     string `json:"tenant"`
	Tree       string `json:"tree"`
	Kind       string `json:"kind"`
	Source     int    `json:"source"`
	SourceNode string `json:"source_node"`
	Target     int    `json:"target"`
	TargetNode string `json:"target_node"`
	Phase      string `json:"phase"`
	Slots      int    `json:"slots"`
	SlotRanges string `json:"slot_ranges"`
	RowsCopied int64  `json:"rows_copied"`
	// RowsTotal estimates the rows that move, from the source's statistics.
	RowsTotal *int64 `json:"rows_total"`
	LagBytes  int64  `json:"lag_bytes"`
	// ETASeconds is null: the copy reports its rows only when it ends.
	ETASeconds *float64  `json:"eta_seconds"`
	StartedAt  time.Time `json:"started_at"`
	Freezes    int       `json:"freezes"`
	LastError  string    `json:"last_error,omitempty"`
}

// ErrorAnswer is the JSON of an error answer: a sqlstate.Error's message and
// code, the ones the SQL function would have raised (no code for an error
// that has none).
type ErrorAnswer struct {
	Error    string `json:"error"`
	SQLState string `json:"sqlstate,omitempty"`
	Hint     string `json:"hint,omitempty"`
}

// maxBody bounds a request body: {"shards":N}, or a node's name and DSN.
const maxBody = 4096

// apiTimeout bounds one API request's reads of the store and the nodes.
const apiTimeout = 5 * time.Second

func (a *API) routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/status", a.handle(a.status))
	mux.HandleFunc("GET /api/trees", a.handle(a.trees))
	mux.HandleFunc("GET /api/trees/{tree}", a.handle(a.tree))
	mux.HandleFunc("GET /api/trees/{tree}/shards", a.handle(a.shards))
	mux.HandleFunc("GET /api/trees/{tree}/map", a.handle(a.slotMap))
	mux.HandleFunc("GET /api/trees/{tree}/load", a.handle(a.load))
	mux.HandleFunc("GET /api/reshards", a.handle(a.reshards))
	mux.HandleFunc("GET /api/migrations", a.handle(a.migrations))
	mux.HandleFunc("POST /api/trees/{tree}/reshard", a.handle(a.reshard))
	mux.HandleFunc("GET /{$}", a.page)
	a.nodeRoutes(mux)
}

// handle runs h under a timeout and writes its answer as JSON.
func (a *API) handle(h func(ctx context.Context, r *http.Request) (int, any, error)) http.HandlerFunc {
	return a.handleWithin(apiTimeout, h)
}

// handleWithin is handle with another timeout.
func (a *API) handleWithin(timeout time.Duration, h func(ctx context.Context, r *http.Request) (int, any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		code, v, err := h(ctx, r)
		if err != nil {
			code, v = a.errorAnswer(r, err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		enc := json.NewEncoder(w)
		if err := enc.Encode(v); err != nil {
			a.Log.Debug("admin api: write answer", "path", r.URL.Path, "err", err)
		}
	}
}

// badRequest is a malformed request: 400.
func badRequest(format string, args ...any) error {
	return sqlstate.New(sqlstate.InvalidParameterValue, format, args...)
}

// errorAnswer maps an error to its HTTP status by its SQLSTATE.
func (a *API) errorAnswer(r *http.Request, err error) (int, ErrorAnswer) {
	ans := ErrorAnswer{Error: err.Error()}
	if errors.As(err, new(sqlstate.Coded)) {
		e := sqlstate.As(err)
		ans = ErrorAnswer{Error: e.Message, SQLState: e.Code, Hint: e.Hint}
	}
	status := http.StatusInternalServerError
	switch code := ans.SQLState; {
	case code == sqlstate.InsufficientPrivilege:
		status = http.StatusForbidden
	case errors.Is(err, shardmap.ErrNotFound):
		status, ans.SQLState = http.StatusNotFound, sqlstate.UndefinedTable
	case code == sqlstate.UndefinedTable, code == sqlstate.UndefinedObject:
		status = http.StatusNotFound
	case code == sqlstate.ObjectNotInPrerequisiteState, code == sqlstate.DuplicateObject:
		status = http.StatusConflict
	case strings.HasPrefix(code, "08"): // class 08: the node did not answer
		status = http.StatusBadGateway
	case strings.HasPrefix(code, "22"): // class 22, data exception
		status = http.StatusBadRequest
	}
	if status == http.StatusInternalServerError {
		a.Log.Warn("admin api", "path", r.URL.Path, "err", err)
	}
	return status, ans
}

// treeNotFound is the 404 of an unknown tree, worded as the SQL functions do.
func treeNotFound(tree string) error {
	return sqlstate.New(sqlstate.UndefinedTable, "tree %q does not exist", tree)
}

func (a *API) tenantOf(r *http.Request) string {
	if t := r.URL.Query().Get("tenant"); t != "" {
		return t
	}
	return a.Self.DefaultTenant()
}

// tenants is ?tenant= alone, or every tenant the proxy knows of: the
// default one, those it has served and those with a running reshard.
func (a *API) tenants(r *http.Request, running []ReshardStatus) []string {
	if t := r.URL.Query().Get("tenant"); t != "" {
		return []string{t}
	}
	out := append([]string{a.Self.DefaultTenant()}, a.Self.Tenants()...)
	for _, rs := range running {
		out = append(out, rs.Tenant)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (a *API) summary(t *shardmap.Tree, m *shardmap.Map, rs *ReshardStatus) TreeSummary {
	return TreeSummary{Tenant: t.Tenant, Name: t.Name, Key: t.KeyColumn, KeyType: string(t.KeyType),
		Shards: m.DistinctShards(), Slots: len(m.Slots), Epoch: m.Epoch, Group: t.Group, Reshard: rs}
}

// summaries lists the trees of the request's tenants.
func (a *API) summaries(ctx context.Context, r *http.Request) ([]TreeSummary, error) {
	running, err := a.Resharder.Running(ctx)
	if err != nil {
		return nil, err
	}
	byTree := map[[2]string]*ReshardStatus{}
	for i := range running {
		byTree[[2]string{running[i].Tenant, running[i].Tree}] = &running[i]
	}
	out := []TreeSummary{}
	for _, tenant := range a.tenants(r, running) {
		trees, err := a.Catalog.Trees(ctx, tenant)
		if err != nil {
			return nil, err
		}
		for _, t := range trees {
			m, err := a.Catalog.Map(ctx, tenant, t.MapName())
			if errors.Is(err, shardmap.ErrNotFound) {
				continue // dropped since the list was read
			}
			if err != nil {
				return nil, err
			}
			sum := a.summary(t, m, byTree[[2]string{tenant, t.Name}])
			if st, ok := a.Catalog.(shardmap.AutonomicStatuses); ok {
				if sum.Autonomic, err = st.Autonomic(ctx, tenant, t.Name); err != nil {
					return nil, err
				}
			}
			if sum.Operations, err = a.treeOps(ctx, tenant, t.Name); err != nil {
				return nil, err
			}
			out = append(out, sum)
		}
	}
	return out, nil
}

func (a *API) status(ctx context.Context, r *http.Request) (int, any, error) {
	trees, err := a.summaries(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	proxies, err := a.Self.Proxies(ctx)
	if err != nil {
		return 0, nil, err
	}
	info := a.Self.Info()
	for _, t := range trees {
		if e, ok := a.Self.CachedEpoch(t.Tenant, t.Name); ok && e < t.Epoch {
			info.EpochLag = max(info.EpochLag, t.Epoch-e)
		}
	}
	return http.StatusOK, Status{Proxy: info, Proxies: proxies, Trees: trees}, nil
}

func (a *API) trees(ctx context.Context, r *http.Request) (int, any, error) {
	trees, err := a.summaries(ctx, r)
	return http.StatusOK, trees, err
}

// treeMap reads the request's tree and its map.
func (a *API) treeMap(ctx context.Context, r *http.Request) (*shardmap.Tree, *shardmap.Map, error) {
	tenant, name := a.tenantOf(r), r.PathValue("tree")
	t, err := a.Catalog.Tree(ctx, tenant, name)
	if err == nil {
		var m *shardmap.Map
		if m, err = a.Catalog.Map(ctx, tenant, t.MapName()); err == nil {
			return t, m, nil
		}
	}
	if errors.Is(err, shardmap.ErrNotFound) {
		return nil, nil, treeNotFound(name)
	}
	return nil, nil, err
}

func (a *API) tree(ctx context.Context, r *http.Request) (int, any, error) {
	t, m, err := a.treeMap(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	st, err := a.Resharder.Status(ctx, t.Tenant, t.Name)
	if err != nil {
		return 0, nil, err
	}
	var rs *ReshardStatus
	if st.Phase != "idle" {
		rs = &st
	}
	s := a.summary(t, m, rs)
	s.ShardList = a.shardList(ctx, t, m)
	return http.StatusOK, s, nil
}

func (a *API) shards(ctx context.Context, r *http.Request) (int, any, error) {
	t, m, err := a.treeMap(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, a.shardList(ctx, t, m), nil
}

// shardList lists every shard of the map, retired and pending ones too, as
// lattice_shards does; estimates are null when the nodes did not answer.
func (a *API) shardList(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) []ShardInfo {
	sizes := a.Sizes.Get(ctx, t, m)
	var byShard map[int]shardmap.SlotRate
	if l, err := a.treeLoad(ctx, t, m); err != nil {
		a.Log.Warn("admin: load rates", "tenant", t.Tenant, "tree", t.Name, "err", err)
	} else if l != nil {
		byShard = l.ByShard(m)
	}
	counts := m.SlotCounts()
	idx := make([]int, 0, len(m.Shards))
	for i := range m.Shards {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	out := make([]ShardInfo, 0, len(idx))
	for _, i := range idx {
		sh := m.Shards[i]
		info := ShardInfo{Index: i, Node: sh.Node, Schema: shardmap.SchemaName(i), State: string(sh.State),
			Slots: counts[i], SlotRanges: formatRanges(m.SlotRanges(i))}
		if sz, ok := sizes[i]; ok {
			info.RowsEstimate, info.BytesEstimate = &sz.Rows, &sz.Bytes
		}
		if byShard != nil {
			r := roundRate(byShard[i])
			info.Load = &r
		}
		out = append(out, info)
	}
	return out
}

func formatRanges(rs [][2]int) string {
	b := make([]byte, 0, 16*len(rs))
	for i, r := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(r[0]), 10)
		if r[1] != r[0] {
			b = append(b, '-')
			b = strconv.AppendInt(b, int64(r[1]), 10)
		}
	}
	return string(b)
}

func (a *API) slotMap(ctx context.Context, r *http.Request) (int, any, error) {
	_, m, err := a.treeMap(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	frozen := []int{}
	for _, fr := range m.Frozen {
		for s := fr[0]; s <= fr[1] && s < len(m.Slots); s++ {
			frozen = append(frozen, s)
		}
	}
	return http.StatusOK, MapInfo{Epoch: m.Epoch, Slots: m.Slots, Frozen: frozen}, nil
}

func (a *API) reshards(ctx context.Context, r *http.Request) (int, any, error) {
	running, err := a.Resharder.Running(ctx)
	if err != nil {
		return 0, nil, err
	}
	if t := r.URL.Query().Get("tenant"); t != "" {
		running = slices.DeleteFunc(running, func(s ReshardStatus) bool { return s.Tenant != t })
	}
	if running == nil {
		running = []ReshardStatus{}
	}
	return http.StatusOK, running, nil
}

// migrations lists the migrations in flight of every running reshard, or of
// ?tenant= and ?tree=.
func (a *API) migrations(ctx context.Context, r *http.Request) (int, any, error) {
	running, err := a.Resharder.Running(ctx)
	if err != nil {
		return 0, nil, err
	}
	q := r.URL.Query()
	out := []MigrationInfo{}
	for _, rs := range running {
		if (q.Get("tenant") != "" && rs.Tenant != q.Get("tenant")) || (q.Get("tree") != "" && rs.Tree != q.Get("tree")) {
			continue
		}
		migs, err := a.Catalog.Migrations(ctx, rs.Tenant, rs.Tree)
		if err != nil {
			return 0, nil, err
		}
		if len(migs) == 0 {
			continue
		}
		t, err := a.Catalog.Tree(ctx, rs.Tenant, rs.Tree)
		if errors.Is(err, shardmap.ErrNotFound) {
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		m, err := a.Catalog.Map(ctx, rs.Tenant, rs.Tree)
		if err != nil {
			return 0, nil, err
		}
		sizes := a.Sizes.Get(ctx, t, m)
		counts := m.SlotCounts()
		for _, mig := range migs {
			if mig.Phase == shardmap.PhaseDone {
				continue
			}
			out = append(out, migrationInfo(mig, sizes, counts))
		}
	}
	return http.StatusOK, out, nil
}

func migrationInfo(mig *shardmap.Migration, sizes map[int]ShardSize, counts map[int]int) MigrationInfo {
	moving := 0
	for _, r := range mig.Slots {
		moving += r[1] - r[0] + 1
	}
	info := MigrationInfo{ID: mig.ID, Tenant: mig.Tenant, Tree: mig.Tree, Kind: string(mig.Kind),
		Source: mig.Source, SourceNode: mig.SourceNode, Target: mig.Target, TargetNode: mig.TargetNode,
		Phase: string(mig.Phase), Slots: moving, SlotRanges: formatRanges(mig.Slots),
		RowsCopied: mig.RowsCopied, LagBytes: mig.LagBytes, StartedAt: mig.Created, Freezes: mig.Freezes, LastError: mig.LastError}
	// The source holds every moving row until the release; before the flip
	// it also owns the moving slots, after it no longer does.
	if sz, ok := sizes[mig.Source]; ok {
		owned := counts[mig.Source]
		if mig.Phase == shardmap.PhaseRelease {
			owned += moving
		}
		total := sz.Rows
		if owned > 0 && moving < owned {
			total = sz.Rows * int64(moving) / int64(owned)
		}
		info.RowsTotal = &total
	}
	return info
}

// reshardBody is the body of POST /api/trees/{tree}/reshard.
type reshardBody struct {
	Shards *int `json:"shards"`
}

// crossSite refuses a request a web page of another origin could have made:
// a browser sends application/json across origins only after a preflight,
// which this endpoint does not grant, and it names the page's origin.
func crossSite(r *http.Request) error {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		return badRequest("the body must be sent as Content-Type: application/json")
	}
	if o := r.Header.Get("Origin"); o != "" {
		if u, err := url.Parse(o); err != nil || u.Host != r.Host {
			return sqlstate.New(sqlstate.InsufficientPrivilege, "origin %q may not start reshards here", o)
		}
	}
	return nil
}

func (a *API) reshard(ctx context.Context, r *http.Request) (int, any, error) {
	if err := crossSite(r); err != nil {
		return 0, nil, err
	}
	var body reshardBody
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return 0, nil, badRequest(`body must be {"shards": N}: %v`, err)
	}
	if body.Shards == nil {
		return 0, nil, badRequest(`body must be {"shards": N}`)
	}
	tenant, name := a.tenantOf(r), r.PathValue("tree")
	msg, err := a.Resharder.Reshard(ctx, tenant, name, *body.Shards)
	if err != nil {
		return 0, nil, err
	}
	st, err := a.Resharder.Status(ctx, tenant, name)
	if err != nil {
		return 0, nil, err
	}
	st.Message = msg
	return http.StatusAccepted, st, nil
}
