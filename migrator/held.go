package migrator

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/shardmap"
)

// watchPoll is how often a watched step (Runner.watched) looks for the
// transactions it waits for.
const watchPoll = 2 * time.Second

// endThem is the hint of every report of transactions a migration waits for.
const endThem = "End them, or commit them: Lattice ends a session idle in a transaction after --idle-in-transaction-timeout (5 min by default), " +
	"PostgreSQL's idle_in_transaction_session_timeout bounds sessions of other clients, and a prepared transaction needs COMMIT PREPARED or ROLLBACK PREPARED."

// heldPrefix begins the LastError of a migration whose freeze is put off
// because transactions hold its source table.
const heldPrefix = "freeze put off: "

// sourceHeld reports whether transactions older than the freeze budget hold
// a lock on the migration's source tables that the fence's arm would wait
// for. The arm runs inside the write pause, so freezing then would only
// hold the moving slots' writes for a whole budget and roll back, once
// every attempt for as long as such a transaction lasts: an idle session
// left in a transaction, a long batch, an autovacuum of a large shard. The
// freeze is put off instead, with no pause, and the migration's last error
// (lattice_reshard_status) names the transactions, so that an operator can
// end them. A failed look does not hold the freeze back: the arm's own
// bounded wait still applies.
func (r *Runner) sourceHeld(ctx context.Context, mig *shardmap.Migration, fences []pgshard.SlotFence, log *slog.Logger) bool {
	blockers, err := r.cluster.ArmBlockers(ctx, mig.SourceNode, fences, r.opts.FreezeBudget)
	if err != nil {
		log.Warn("long transactions on the source not looked for before the freeze", "err", err)
		return false
	}
	if len(blockers) == 0 {
		return false
	}
	named := names(blockers)
	if !strings.HasPrefix(mig.LastError, heldPrefix) {
		log.Warn("freeze put off: transactions older than the freeze budget hold the source table, and the fence would wait for them inside the write pause",
			"node", mig.SourceNode, "shard", mig.Source, "budget", r.opts.FreezeBudget, "holders", named)
	}
	mig.LastError = fmt.Sprintf("%sthe fence of shard %d on node %s would wait inside the write pause for transactions that have held its table for longer than the freeze budget (%s): %s. "+
		endThem+" The migration freezes once none is left.",
		heldPrefix, mig.Source, mig.SourceNode, r.opts.FreezeBudget, strings.Join(named, "; "))
	return true
}

// startShadow starts the migration's shadow copy, naming what its
// replication slot waits for while it does.
func (r *Runner) startShadow(ctx context.Context, u unit, mig *shardmap.Migration, log *slog.Logger) (Stream, error) {
	var sh Stream
	slot := ShadowSpec{ID: mig.ID}.Name()
	err := r.watched(ctx, mig, log, func(ctx context.Context) ([]pgshard.Blocker, error) {
		return r.cluster.SlotBlockers(ctx, mig.SourceNode, mig.Tenant, slot)
	}, func(named string) string {
		return fmt.Sprintf("shadow copy waits: creating its replication slot on node %s waits for every transaction that was writing when it began, and these have not ended: %s. "+
			endThem,
			mig.SourceNode, named)
	}, func() error {
		var err error
		sh, err = r.cluster.StartShadow(ctx, u.trees, mig, log)
		return err
	})
	return sh, err
}

// dropFences is dropFenceTables naming, while it waits, the transactions
// that hold the tables: removing a fence's trigger waits for every one,
// readers included. Until it is done a migration cannot finish, and a
// rolled-back freeze keeps the moving slots' writes held.
func (r *Runner) dropFences(ctx context.Context, u unit, mig *shardmap.Migration, giveBack bool) error {
	fences := r.fences(u, mig, 0)
	held := "the migration cannot finish"
	if giveBack {
		held = "the freeze being rolled back keeps holding writes to the moving slots"
	}
	return r.watched(ctx, mig, r.log.With("migration", mig.ID), func(ctx context.Context) ([]pgshard.Blocker, error) {
		return r.cluster.DropBlockers(ctx, mig.SourceNode, fences, r.watchPoll)
	}, func(named string) string {
		return fmt.Sprintf("fence removal waits: dropping the fence's triggers on shard %d on node %s waits for every transaction that holds the table, and meanwhile %s: %s. "+
			endThem, mig.Source, mig.SourceNode, held, named)
	}, func() error {
		return r.dropFenceTables(ctx, u, mig, giveBack)
	})
}

// watched runs work. Meanwhile, every watchPoll, it looks for transactions
// work waits for (look), and when it finds any, logs them once and stores
// them in the migration's last error (message), so that a step that makes
// no progress says why in lattice_reshard_status. It stores a copy of the
// record, since work reads mig; the migration's next record replaces it.
func (r *Runner) watched(ctx context.Context, mig *shardmap.Migration, log *slog.Logger,
	look func(context.Context) ([]pgshard.Blocker, error), message func(named string) string, work func() error) error {
	done := make(chan struct{})
	stopped := make(chan struct{})
	rec := *mig
	go func() {
		defer close(stopped)
		for logged := false; ; {
			select {
			case <-done:
				return
			case <-time.After(r.watchPoll):
			}
			blockers, err := look(ctx)
			if err != nil || len(blockers) == 0 {
				continue
			}
			rec.LastError = message(strings.Join(names(blockers), "; "))
			if !logged {
				log.Warn(rec.LastError)
				logged = true
			}
			// A record in phase prepare would be created anew were it gone.
			if rec.Phase == shardmap.PhasePrepare {
				continue
			}
			if err := r.store.PutMigration(ctx, &rec); err != nil {
				log.Warn("what the migration waits for not recorded", "err", err)
			}
		}
	}()
	err := work()
	close(done)
	<-stopped
	return err
}

func names(blockers []pgshard.Blocker) []string {
	named := make([]string, len(blockers))
	for i, b := range blockers {
		named[i] = b.String()
	}
	return named
}
