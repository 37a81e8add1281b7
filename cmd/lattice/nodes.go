package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"text/tabwriter"

	"github.com/lattice-db/lattice/admin"
	"github.com/lattice-db/lattice/migrator"
)

// adminNoder serves the API's /api/nodes with the SQL functions' code.
type adminNoder struct{ f *migrator.Functions }

func (n adminNoder) Nodes(ctx context.Context, tenant string) ([]admin.NodeInfo, error) {
	ns, err := n.f.Nodes(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]admin.NodeInfo, len(ns))
	for i, x := range ns {
		out[i] = admin.NodeInfo{Name: x.Name, DSN: x.DSN, State: string(x.State), Catalog: x.Catalog, Reachable: x.Reachable,
			Shards: x.Shards, Slots: x.Slots, Added: x.Added}
		if x.Reachable {
			b := x.Bytes
			out[i].Bytes = &b
		}
	}
	return out, nil
}

func (n adminNoder) AddNode(ctx context.Context, tenant, name, dsn string) (string, error) {
	return n.f.AddNode(ctx, tenant, name, dsn)
}

func (n adminNoder) RemoveNode(ctx context.Context, name string) (string, error) {
	return n.f.RemoveNode(ctx, name)
}

// nodesCmd is `lattice nodes`: the node registry, with the tenant's shards
// on each node.
func (c *cli) nodesCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("nodes", flag.ContinueOnError)
	adminURL, tenant := clientFlags(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return errors.New("usage: lattice nodes [--admin URL] [--tenant T]")
	}
	api, err := newAPIClient(*adminURL, *tenant)
	if err != nil {
		return err
	}
	var nodes []admin.NodeInfo
	if err := api.do(ctx, http.MethodGet, "/api/nodes", nil, nil, &nodes); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tROLE\tREACHABLE\tSHARDS\tSLOTS\tSIZE\tDSN")
	for _, n := range nodes {
		role, reach, size := "-", "no", "-"
		if n.Catalog {
			role = "catalog"
		}
		if n.Reachable {
			reach = "yes"
		}
		if n.Bytes != nil {
			size = fmtBytes(*n.Bytes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", n.Name, n.State, role, reach, n.Shards, n.Slots, size, n.DSN)
	}
	return tw.Flush()
}

const nodeUsage = "usage: lattice node add NAME DSN | lattice node remove NAME [--admin URL] [--tenant T]"

// nodeCmd is `lattice node add NAME DSN` and `lattice node remove NAME`.
func (c *cli) nodeCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	adminURL, tenant := clientFlags(fs)
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return errors.New(nodeUsage)
	}
	api, err := newAPIClient(*adminURL, *tenant)
	if err != nil {
		return err
	}
	var ans admin.NodeChange
	switch {
	case pos[0] == "add" && len(pos) == 3:
		err = api.do(ctx, http.MethodPost, "/api/nodes", nil, map[string]string{"name": pos[1], "dsn": pos[2]}, &ans)
	case pos[0] == "remove" && len(pos) == 2:
		err = api.do(ctx, http.MethodDelete, "/api/nodes/"+url.PathEscape(pos[1]), nil, nil, &ans)
	default:
		return errors.New(nodeUsage)
	}
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.out, ans.Message)
	return err
}
