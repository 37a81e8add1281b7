package proxy

import (
	"context"
	"time"

	"github.com/lattice-db/lattice/rawsock"
)

// A client that goes away while its statement runs would leave the
// statement running on its backends: the session reads the client only
// between statements, and PostgreSQL notices a lost client only when it
// next writes to it (client_connection_check_interval is off by default),
// which an aggregate or a sort over a large tree does only at its end.
// Until then the backends keep their snapshots and locks: vacuum waits, and
// so does a reshard, whose replication slot waits for every transaction
// running when it is created. So the server looks, every
// clientCheckInterval, at the socket of each session that has served one
// message for a whole interval; when the client has closed or reset it, the
// session's backend work is cancelled and its socket closed, as at
// shutdown. The session then ends as on any lost client: a backend left in
// a transaction is closed, the others go back to the pool.
const clientCheckInterval = time.Second

// watchClients looks for clients gone in the middle of a statement until
// ctx ends.
func (s *Server) watchClients(ctx context.Context) {
	t := time.NewTicker(clientCheckInterval)
	defer t.Stop()
	// seen is what each busy session was serving at the last look.
	seen := map[*session]uint64{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		busy := map[*session]uint64{}
		for _, sess := range s.liveSessions() {
			n := sess.serving.Load()
			if n == 0 {
				continue
			}
			busy[sess] = n
			if seen[sess] != n || !rawsock.PeerClosed(sess.conn) || sess.gone.Swap(true) {
				continue
			}
			sess.log.Info("the client went away in the middle of a statement; cancelling its work on the backends")
			s.metrics.conn(connGone)
			sess.cancel(ctx)
			sess.conn.Close()
		}
		seen = busy
	}
}
