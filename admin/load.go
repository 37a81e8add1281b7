package admin

import (
	"context"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// LoadInfo is GET /api/trees/{tree}/load: the tree's load signal over
// [from, to), summed over every proxy, per slot, per shard and per node.
type LoadInfo struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Per slot, by slot number.
	Reads  []float64   `json:"reads_per_s"`
	Writes []float64   `json:"writes_per_s"`
	Rows   []float64   `json:"rows_written_per_s"`
	Shards []ShardLoad `json:"shards"` // shards that own slots, in order
	Nodes  []NodeLoad  `json:"nodes"`  // nodes of those shards, in order
}

// ShardLoad is one shard's rates.
type ShardLoad struct {
	Index int    `json:"index"`
	Node  string `json:"node"`
	shardmap.SlotRate
}

// NodeLoad is one node's rates, over the tree's shards on it.
type NodeLoad struct {
	Node string `json:"node"`
	shardmap.SlotRate
}

func (a *API) treeLoad(ctx context.Context, t *shardmap.Tree, m *shardmap.Map) (*shardmap.TreeLoad, error) {
	if a.Load == nil {
		return nil, nil
	}
	return a.Load.TreeLoad(ctx, t.Tenant, t.Name, len(m.Slots), time.Now())
}

func (a *API) load(ctx context.Context, r *http.Request) (int, any, error) {
	t, m, err := a.treeMap(ctx, r)
	if err != nil {
		return 0, nil, err
	}
	l, err := a.treeLoad(ctx, t, m)
	if err != nil {
		return 0, nil, err
	}
	if l == nil {
		l = &shardmap.TreeLoad{Slots: make([]shardmap.SlotRate, len(m.Slots))}
	}
	out := LoadInfo{From: l.From, To: l.To, Reads: make([]float64, len(l.Slots)), Writes: make([]float64, len(l.Slots)),
		Rows: make([]float64, len(l.Slots)), Shards: []ShardLoad{}, Nodes: []NodeLoad{}}
	for s, r := range l.Slots {
		out.Reads[s], out.Writes[s], out.Rows[s] = round(r.Reads), round(r.Writes), round(r.Rows)
	}
	byShard := l.ByShard(m)
	for _, i := range m.OwningShards() {
		out.Shards = append(out.Shards, ShardLoad{Index: i, Node: m.Shards[i].Node, SlotRate: roundRate(byShard[i])})
	}
	for n, r := range l.ByNode(m) {
		out.Nodes = append(out.Nodes, NodeLoad{Node: n, SlotRate: roundRate(r)})
	}
	slices.SortFunc(out.Nodes, func(x, y NodeLoad) int { return strings.Compare(x.Node, y.Node) })
	return http.StatusOK, out, nil
}

// round keeps two decimals: JSON without float noise.
func round(x float64) float64 { return math.Round(x*100) / 100 }

func roundRate(r shardmap.SlotRate) shardmap.SlotRate {
	return shardmap.SlotRate{Reads: round(r.Reads), Writes: round(r.Writes), Rows: round(r.Rows)}
}
