package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/lattice-db/lattice/migrator"
	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// recoverMapCmd is `lattice recover-map`: it rebuilds, from the nodes, the
// registry entries and maps of the trees, and the registry entries of the
// reference tables, that Redis lost (docs/DESIGN.md section 17), and
// prints one line per tree and per reference table.
func recoverMapCmd(ctx context.Context, args []string, out io.Writer) error {
	var (
		redisURL, level string
		nodes           nodeFlags
		opts            migrator.RecoverOptions
	)
	fs := flag.NewFlagSet("recover-map", flag.ContinueOnError)
	fs.StringVar(&redisURL, "redis", "", "Redis URL the proxies use (as for serve); the rebuilt maps are written there")
	fs.Var(&nodes, "node", "a PostgreSQL node as NAME=DSN, repeatable, the same list in the same order as for serve")
	fs.DurationVar(&opts.Settle, "settle", 5*time.Second, "how long migrations found in flight get to stop before the nodes are read; more than --freeze-budget")
	fs.DurationVar(&opts.DrainTimeout, "drain-timeout", time.Minute, "longest final drain of one migration that had fenced its source")
	fs.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if redisURL == "" {
		return errors.New("recover-map needs --redis: an embedded Redis would lose the rebuilt maps on exit")
	}
	if len(nodes) == 0 {
		return errors.New("no nodes: give every --node NAME=DSN that serve is given")
	}
	log, err := newLogger(level)
	if err != nil {
		return err
	}
	store, err := shardmap.OpenRedis(ctx, redisURL)
	if err != nil {
		return err
	}
	defer store.Close()
	cluster, err := pgshard.NewCluster(nodes, log)
	if err != nil {
		return err
	}
	defer cluster.Close()
	return rebuildMaps(ctx, cluster, store, opts, log, out)
}

// rebuildMaps gives Redis back, from the nodes, the deployment id, the
// registry entries of the reference tables and the maps of the trees, and
// writes a line for each to out.
func rebuildMaps(ctx context.Context, cluster *pgshard.Cluster, store *shardmap.RedisStore, opts migrator.RecoverOptions, log *slog.Logger, out io.Writer) error {
	if err := restoreDeployment(ctx, cluster, store, out); err != nil {
		return err
	}
	// Before the trees, whose statements join them.
	refs, err := migrator.RecoverReferences(ctx, cluster, store, log)
	for _, r := range refs {
		fmt.Fprintln(out, recoveredReferenceLine(r))
	}
	if err != nil {
		return err
	}
	trees, err := migrator.RecoverMaps(ctx, cluster, store, opts, log)
	for _, t := range trees {
		fmt.Fprintln(out, recoveredLine(t))
	}
	return err
}

// logLines is an io.Writer that logs each line written to it.
type logLines struct {
	log *slog.Logger
	msg string
}

func (l logLines) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		l.log.Info(l.msg, "result", line)
	}
	return len(p), nil
}

func recoveredReferenceLine(r migrator.RecoveredReference) string {
	if r.Skipped != "" {
		return fmt.Sprintf("%s/%s: reference table skipped (%s)", r.Tenant, r.Name, r.Skipped)
	}
	return fmt.Sprintf("%s/%s: reference table rebuilt with copies on %s", r.Tenant, r.Name, strings.Join(r.Nodes, ", "))
}

func recoveredLine(t migrator.RecoveredTree) string {
	if t.Skipped != "" {
		return fmt.Sprintf("%s/%s: skipped (%s)", t.Tenant, t.Tree, t.Skipped)
	}
	line := fmt.Sprintf("%s/%s: rebuilt at epoch %d with %d shards", t.Tenant, t.Tree, t.Epoch, t.Shards)
	if len(t.Finished) > 0 {
		line += "; finished migrations " + strings.Join(t.Finished, ", ")
	}
	if len(t.RolledBack) > 0 {
		line += "; rolled back migrations " + strings.Join(t.RolledBack, ", ")
	}
	return line
}

// restoreDeployment gives Redis back the deployment id that the running
// proxies' presence sessions carry: coordinators look for proxies cut off
// from Redis by it (docs/DESIGN.md section 12), and one created anew would
// find none of them.
func restoreDeployment(ctx context.Context, cluster *pgshard.Cluster, store *shardmap.RedisStore, out io.Writer) error {
	ids, err := cluster.Deployments(ctx)
	if err != nil {
		return err
	}
	switch len(ids) {
	case 0:
		return nil // no proxy runs: the next one to start creates an id
	case 1:
	default:
		fmt.Fprintf(out, "warning: the nodes hold presence sessions of several deployments (%s); the deployment id is not restored\n", strings.Join(ids, ", "))
		return nil
	}
	got, err := store.RestoreClusterID(ctx, ids[0])
	if err != nil {
		return err
	}
	if got != ids[0] {
		fmt.Fprintf(out, "warning: Redis holds deployment id %s, the running proxies use %s: restart them so that reshards see the ones cut off from Redis\n", got, ids[0])
		return nil
	}
	fmt.Fprintf(out, "deployment id %s restored from the proxies' sessions on the nodes\n", got)
	return nil
}
