package proxy

import (
	"errors"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/sqlstate"
)

// acquireError is what a client sees when no backend of node could be had:
// the pools' own refusal as it is (a cap of the node or the user reached,
// 53300; no database of the tenant's name, 3D000; a tenant role the proxy
// may not use, 42501), a full pool as 53300, else a connection failure.
func acquireError(node string, err error) *sqlstate.Error {
	if e := (*sqlstate.Error)(nil); errors.As(err, &e) {
		return e
	}
	if errors.Is(err, pgshard.ErrPoolExhausted) {
		return sqlstate.New(sqlstate.TooManyConnections, "%v", err).
			WithHint("Retry later, or raise --pool-size.")
	}
	return sqlstate.New(sqlstate.ConnectionFailure, "cannot reach node %s: %v", node, err)
}
