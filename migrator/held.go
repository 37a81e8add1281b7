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

// slotWaitPoll is how often a shadow copy's start looks for transactions
// its replication slot waits for.
const slotWaitPoll = 2 * time.Second

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
	blockers, err := r.cluster.LongHolders(ctx, mig.SourceNode, fences, r.opts.FreezeBudget)
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
		"End or commit them (idle_in_transaction_session_timeout bounds idle ones); the migration freezes once none is left.",
		heldPrefix, mig.Source, mig.SourceNode, r.opts.FreezeBudget, strings.Join(named, "; "))
	return true
}

// startShadow starts the migration's shadow copy. Meanwhile it looks every
// slotWaitPoll for transactions the creation of its replication slot waits
// for, and when it finds any, logs them once and stores them as the
// migration's last error (lattice_reshard_status), so that a copy that
// makes no progress says why. The next record of the migration clears it.
func (r *Runner) startShadow(ctx context.Context, u unit, mig *shardmap.Migration, log *slog.Logger) (Stream, error) {
	done := make(chan struct{})
	watched := make(chan struct{})
	// The record the look stores, apart from mig, which the copy reads.
	rec := *mig
	go func() {
		defer close(watched)
		slot := ShadowSpec{ID: rec.ID}.Name()
		for logged := false; ; {
			select {
			case <-done:
				return
			case <-time.After(slotWaitPoll):
			}
			blockers, err := r.cluster.SlotBlockers(ctx, rec.SourceNode, rec.Tenant, slot)
			if err != nil || len(blockers) == 0 {
				continue
			}
			named := names(blockers)
			if !logged {
				log.Warn("shadow copy waits: its replication slot waits for transactions that were writing when it was created",
					"node", rec.SourceNode, "blockers", named)
				logged = true
			}
			rec.LastError = fmt.Sprintf("shadow copy waits: creating its replication slot on node %s waits for every transaction that was writing when it began, and these have not ended: %s. "+
				"End or commit them (idle_in_transaction_session_timeout bounds idle ones; a prepared transaction needs COMMIT PREPARED or ROLLBACK PREPARED).",
				rec.SourceNode, strings.Join(named, "; "))
			if err := r.store.PutMigration(ctx, &rec); err != nil {
				log.Warn("what the shadow copy waits for not recorded", "err", err)
			}
		}
	}()
	sh, err := r.cluster.StartShadow(ctx, u.trees, mig, log)
	close(done)
	<-watched
	return sh, err
}

func names(blockers []pgshard.Blocker) []string {
	named := make([]string, len(blockers))
	for i, b := range blockers {
		named[i] = b.String()
	}
	return named
}
