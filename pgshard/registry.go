package pgshard

import (
	"fmt"
	"time"

	"github.com/lattice-db/lattice/shardmap"
)

// SplitNodes moves each DSN's password into the node's Password, so that
// the DSNs can seed the node registry, which never holds one. A --node flag
// may carry a password; this proxy keeps it and uses it for that node.
func SplitNodes(nodes []Node) ([]Node, error) {
	out := make([]Node, len(nodes))
	for i, n := range nodes {
		clean, pw, _, err := SplitPassword(n.DSN)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		n.DSN = clean
		if pw != "" {
			n.Password = pw
		}
		out[i] = n
	}
	return out, nil
}

// Seed is the registry the cluster's first node set would seed an empty
// node registry with: every node active, no password.
func (c *Cluster) Seed() *shardmap.Nodes {
	now := time.Now().UTC()
	reg := &shardmap.Nodes{}
	for _, n := range c.seed {
		reg.Nodes = append(reg.Nodes, shardmap.NodeEntry{Name: n.Name, DSN: n.DSN, State: shardmap.NodeActive, Added: now})
	}
	return reg
}

// ApplyRegistry makes the node set the registry's. A node of the first set
// (the --node flags) keeps its password when the registry has the same
// name with the same DSN. It returns the nodes that left or changed.
func (c *Cluster) ApplyRegistry(reg *shardmap.Nodes) ([]string, error) {
	local := make(map[string]Node, len(c.seed))
	for _, n := range c.seed {
		local[n.Name] = n
	}
	nodes := make([]Node, len(reg.Nodes))
	for i, e := range reg.Nodes {
		n := Node{Name: e.Name, DSN: e.DSN, Draining: e.State == shardmap.NodeDraining}
		if l, ok := local[e.Name]; ok && l.DSN == e.DSN {
			n.Password = l.Password
		}
		nodes[i] = n
	}
	return c.SetNodes(nodes)
}
