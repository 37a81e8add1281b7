package proxy

import (
	"context"
	"fmt"

	"github.com/lattice-db/lattice/shardmap"
	"github.com/lattice-db/lattice/sqlstate"
)

// view is the tenant's current trees and maps, from the proxy's cache. A
// tenant whose maps Redis lost is refused, not served as one without
// trees: its statements would read the empty templates.
func (s *session) view(ctx context.Context) (*shardmap.View, error) {
	v, err := s.cachedView(ctx)
	if err == nil && v.Missing {
		return nil, mapsMissing(s.tenant)
	}
	return v, err
}

func mapsMissing(tenant string) *sqlstate.Error {
	e := sqlstate.New(sqlstate.MapsMissing, "the shard maps of database %q are missing from Redis", tenant)
	e.Detail = fmt.Sprintf("The nodes hold trees of %q, but Redis lists none: it lost its data (FLUSHALL, a restart without AOF, or a new Redis).", tenant)
	e.Hint = "Run `lattice recover-map` with the same --redis and --node flags as `lattice serve` to rebuild the maps from the nodes."
	return e
}
