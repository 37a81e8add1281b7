package migrator

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lattice-db/lattice/pgshard"
)

// A shadow copy's run writes the target through one connection. When a run
// gives up on that connection (a timeout, a partition, a crash), bytes it
// already sent may still reach the target later, when the network heals:
// an apply batch or a copy that then commits after a later run has applied
// newer changes of the same rows, and puts old values back. So each run
// labels its target connections (the copy's extra ones too, copychunks.go)
// with the migration, and ends every earlier run's connection on the
// target before it reads the progress row: a
// terminated backend rolls its transaction back, and bytes that arrive
// afterwards find the socket closed.

// ghostWait bounds how long a run waits for an earlier run's backend to
// exit once it is told to.
const ghostWait = 10 * time.Second

func shadowAppName(id string) string { return "lattice-shadow " + id }

// connectShadowTarget connects to the target as migration id's run, after
// ending the connections of its earlier runs there: on a spare labelled
// for the run, as a new connection of the run would be (the spares' reset
// takes the label and the setting off when it goes back), or, with no
// spares, on a connection of its own.
func connectShadowTarget(ctx context.Context, sp ShadowSpec) (borrowed, int, error) {
	var c borrowed
	var err error
	if sp.borrowTarget != nil {
		if c, err = sp.borrowTarget(ctx); err != nil {
			return borrowed{}, 0, err
		}
		if _, err = c.Exec(ctx, "SELECT set_config('application_name', $1, false), set_config($2, 'on', false)",
			shadowAppName(sp.ID), pgshard.MigratorSetting); err != nil {
			c.giveBack(context.Background())
			return borrowed{}, 0, fmt.Errorf("migrator: label the target connection: %w", err)
		}
	} else {
		cfg, err := shadowTargetConfig(sp.TargetDSN, sp.ID)
		if err != nil {
			return borrowed{}, 0, err
		}
		if c, err = ownConn(ctx, cfg); err != nil {
			return borrowed{}, 0, fmt.Errorf("migrator: connect to target: %w", err)
		}
	}
	var ended, alive int
	err = c.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE NOT pg_terminate_backend(pid, $2))
		FROM pg_stat_activity WHERE application_name = $1 AND usename = current_user AND pid <> pg_backend_pid()`,
		shadowAppName(sp.ID), ghostWait.Milliseconds()).Scan(&ended, &alive)
	if err == nil && alive > 0 {
		err = fmt.Errorf("%d connections of an earlier run did not end within %s", alive, ghostWait)
	}
	if err != nil {
		c.giveBack(context.Background())
		return borrowed{}, 0, fmt.Errorf("migrator: end earlier runs of %s on the target: %w", sp.ID, err)
	}
	return c, ended, nil
}

// shadowTargetConfig is the configuration of a target connection of
// migration id's run: labelled, so that a later run ends it, and reset when
// the run gives up on it.
func shadowTargetConfig(dsn, id string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = shadowAppName(id)
	cfg.DialFunc = pgshard.ResetOnGiveUp(cfg.DialFunc)
	return cfg, nil
}
