package proxy

import (
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// maxRelayedNotices bounds the notices of one maintenance statement kept
// for its client: VACUUM VERBOSE sends a few per shard table.
const maxRelayedNotices = 10_000

// relayedNotices are the notices a tree's maintenance gets from its
// shards, as the client gets them, up to maxRelayedNotices and then one
// that says how many more there were.
type relayedNotices struct {
	msgs    []pgproto3.BackendMessage
	dropped int
}

func (r *relayedNotices) add(n *pgconn.Notice) {
	switch {
	case len(r.msgs) < maxRelayedNotices:
		r.msgs = append(r.msgs, sqlstate.FromPgError((*pgconn.PgError)(n)).Notice())
	case len(r.msgs) == maxRelayedNotices:
		r.msgs = append(r.msgs, nil)
		fallthrough
	default:
		r.dropped++
		r.msgs[maxRelayedNotices] = sqlstate.Warning(sqlstate.WarningCode, "%d more notices of the shard tables were not kept", r.dropped).Notice()
	}
}
