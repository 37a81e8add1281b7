package proxy

import (
	"context"
	"strings"
	"time"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// Session state the router cannot see.
//
// A function body, a DO block or a procedure can make the state that pins
// a session when a statement makes it at top level (pin.go): set_config,
// temp tables, session advisory locks, PREPARE, WITH HOLD cursors. The
// router marks statements that may (router.Hides); the backends of an
// exchange that ran one are marked Untracked, and before such a backend
// leaves the session (putBack) one round trip probes it. Found state on
// the session's catalog-node backend pins the session, as the top-level
// form would, so its later statements still see it; anywhere else the
// backend is reset (DISCARD ALL; the next session replays its settings);
// a probe that fails closes it. Nothing found still leaves the backend's
// settings unknown, as a function may have changed the value of one the
// proxy tracks: the next session replays RESET ALL and its own. A backend
// still marked when it reaches the pool is closed there.

// untrackedProbeTimeout bounds the probe.
const untrackedProbeTimeout = 10 * time.Second

// untrackedProbe finds, in one row: temp objects, the backend's advisory
// locks, SQL-level prepared statements, holdable cursors, and the names
// of settings made in the session. Every name is qualified, and operators
// too: the probe runs under whatever search_path a function left.
const untrackedProbe = `SELECT
 (SELECT pg_catalog.count(*) FROM pg_catalog.pg_class WHERE relnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())
 OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc WHERE pronamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema())
 OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM pg_catalog.pg_type WHERE typnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()),
 (SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()),
 (SELECT pg_catalog.count(*) FROM pg_catalog.pg_prepared_statements WHERE from_sql),
 (SELECT pg_catalog.count(*) FROM pg_catalog.pg_cursors WHERE is_holdable),
 (SELECT pg_catalog.string_agg(name, ',') FROM pg_catalog.pg_settings WHERE source OPERATOR(pg_catalog.=) 'session')`

// probeCounts are the pins the probe's first columns stand for.
var probeCounts = [...]router.Pin{router.PinTempTable, router.PinAdvisoryLock, router.PinPrepare, router.PinCursor}

// noteHides marks the exchange, before statement p runs, as one whose
// backends may be left with untracked state: those active now, and those
// it takes from here on (setActive).
func (s *session) noteHides(p *router.Plan) {
	if p.Hides == 0 || s.untracked || p.Hides&router.HidesState == 0 && !s.settings.catalogLate {
		return
	}
	s.untracked = true
	s.activeMu.Lock()
	for _, be := range s.active {
		be.Untracked = true
	}
	s.activeMu.Unlock()
}

// putBack is how a backend leaves the session: probed first when it may
// hold untracked state, then released (the pool leaves a pinned one with
// the session).
func (s *session) putBack(be *pgshard.Conn) {
	s.setActive(be, false)
	if be.Untracked && !be.Broken() && be.TxStatus == 'I' {
		s.settleUntracked(be)
	}
	s.srv.pools.Release(be)
}

// settleUntracked probes be, idle, and pins the session to it, resets it
// or closes it by what it holds.
func (s *session) settleUntracked(be *pgshard.Conn) {
	be.Untracked = false
	ctx, cancel := context.WithTimeout(context.Background(), untrackedProbeTimeout)
	found, err := s.probeUntracked(ctx, be)
	cancel()
	action := ""
	switch {
	case err != nil:
		s.log.Debug("untracked state probe failed; closing the backend", "node", be.Node, "pid", be.PID(), "err", err)
		be.MarkBroken()
		s.srv.metrics.untrackedFound("probe_failed", "closed")
		return
	case found == 0:
		if be != s.pin.be {
			be.Settings = unknownSettings
		}
		return
	case be == s.pin.be:
		s.addPinReasons(found)
		action = "pinned"
	case be.Node == s.srv.catalogNode && s.pin.be == nil && s.pinUntracked(be, found):
		action = "pinned"
	default:
		s.resetBackend(be)
		action = "reset"
	}
	s.log.Debug("session state made inside a function", "node", be.Node, "pid", be.PID(), "reason", found.String(), "action", action)
	for _, r := range found.Names() {
		s.srv.metrics.untrackedFound(r, action)
	}
}

// pinUntracked pins the session to be, its catalog-node backend, which
// holds state found. Past --max-pinned the state is discarded instead, and
// the client is told so.
func (s *session) pinUntracked(be *pgshard.Conn, found router.Pin) bool {
	if err := s.takePin(found); err != nil {
		w := sqlstate.Warning(sqlstate.TooManyConnections, "session state (%s) made inside a function was discarded: too many sessions are pinned to a backend (%d, the --max-pinned limit)", found, s.srv.cfg.MaxPinned)
		w.Hint = "raise --max-pinned, or make only transaction-scoped state inside functions (set_config(..., true), pg_advisory_xact_lock, ON COMMIT DROP)"
		s.send(w.Notice())
		return false
	}
	s.holdPin(be, found)
	s.addPinReasons(found)
	return true
}

// probeUntracked runs untrackedProbe on be: the state it holds, with
// PinSetConfig for a setting the proxy does not replay for the session.
func (s *session) probeUntracked(ctx context.Context, be *pgshard.Conn) (router.Pin, error) {
	row, err := queryRow(ctx, be, untrackedProbe)
	if err != nil {
		return 0, err
	}
	if len(row) != len(probeCounts)+1 {
		return 0, sqlstate.New(sqlstate.InternalError, "the session state probe on node %s returned %d columns", be.Node, len(row))
	}
	var found router.Pin
	for i, p := range probeCounts {
		if string(row[i]) != "0" {
			found |= p
		}
	}
	for _, name := range strings.Split(string(row[len(probeCounts)]), ",") {
		if name != "" && !s.settings.tracks(name) {
			found |= router.PinSetConfig
		}
	}
	return found, nil
}
