package migrator

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// borrowed is a connection in use that goes back where it came from when
// done: a spare (pgshard.Cluster.Borrow) goes back to the spares, a
// connection of its own is closed. Every move borrows eight: two for its
// shadow copy (the source it reads, the target it writes), two for its
// snapshots, two for its comparison, and two to drop the copy's slot,
// publication and progress row.
type borrowed struct {
	*pgx.Conn
	give func()
}

func (c clusterNodes) borrow(ctx context.Context, node, tenant string) (borrowed, error) {
	conn, give, err := c.Borrow(ctx, node, tenant)
	if err != nil {
		return borrowed{}, fmt.Errorf("migrator: connect to %s: %w", node, err)
	}
	return borrowed{Conn: conn, give: give}, nil
}

// ownConn opens a connection with cfg that giveBack closes.
func ownConn(ctx context.Context, cfg *pgx.ConnConfig) (borrowed, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return borrowed{}, err
	}
	return borrowed{Conn: conn, give: func() { conn.Close(context.Background()) }}, nil
}

// ownConnTo is ownConn to dsn.
func ownConnTo(ctx context.Context, dsn string) (borrowed, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return borrowed{}, err
	}
	return ownConn(ctx, cfg)
}

// giveBackTimeout bounds the ROLLBACK of a connection given back.
const giveBackTimeout = 5 * time.Second

// giveBack ends the connection's transaction, so that it can serve again,
// and hands it back; a spare whose ROLLBACK fails is closed instead.
func (b *borrowed) giveBack(ctx context.Context) {
	if b.Conn == nil {
		return
	}
	if !b.IsClosed() && b.PgConn().TxStatus() != 'I' {
		ctx, cancel := context.WithTimeout(ctx, giveBackTimeout)
		_, _ = b.Exec(ctx, "ROLLBACK")
		cancel()
	}
	b.give()
	*b = borrowed{}
}
