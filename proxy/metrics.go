package proxy

import (
	"errors"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// Metrics are the proxy's request-path instruments. Every labelled child a
// query touches is resolved when Metrics is made, so a query costs a slice
// index and a histogram observation, no label lookup.
type Metrics struct {
	queries [len(queryKindNames)]prometheus.Observer
	conns   [len(connOutcomeNames)]prometheus.Counter
	errors  *prometheus.CounterVec
	pins    map[string]prometheus.Counter // by router.Pin name
	// untracked counts session state found by the probe after a function,
	// DO or CALL (untracked.go), by reason and what the proxy did.
	untracked *prometheus.CounterVec
	// refHolds counts writes held while a reference table's copies
	// changed (refhold.go): released by the new entry, or let go after
	// holdTimeout.
	refHolds [2]prometheus.Counter
}

// queryKindNames label lattice_proxy_query_duration_seconds: the router's
// plan kinds by their index, then the kinds the proxy adds.
var queryKindNames = [...]string{
	router.Catalog:     "catalog",
	router.Single:      "single",
	router.InsertSplit: "insert_split",
	router.Function:    "function",
	router.Transaction: "transaction",
	router.SessionSet:  "session_set",
	router.LocalSet:    "local_set",
	router.Discard:     "discard",
	router.Refused:     "refused",
	router.FanOut:      "fanout",
	router.WriteAll:    "write_all",
	router.DDL:         "ddl",
	router.Copy:        "copy",
	router.RefWrite:    "reference_write",
	router.Explain:     "explain",
	router.Cursor:      "cursor",
	kindMulti:          "multi",
	kindUnplanned:      "unplanned",
	kindFastpath:       "fastpath",
}

// Query kinds besides the router's, numbered after its last kind.
const (
	kindMulti     = router.Cursor + 1 + iota // a Query message of several statements
	kindUnplanned                            // a statement that failed to plan (syntax error, unknown portal)
	kindFastpath                             // a fastpath function call (FunctionCall message, fastpath.go)
)

// kindNone is a message with nothing to count (an empty query).
const kindNone router.Kind = -1

// Outcomes of a client connection.
const (
	connAccepted = iota
	connCancel
	connAuthFailed
	connStartupFailed
	connTooMany
	connRejected
	connGone
	connPanicked
)

var connOutcomeNames = [...]string{
	connAccepted:      "accepted",       // a session started
	connCancel:        "cancel_request", // a CancelRequest connection
	connAuthFailed:    "auth_failed",    // wrong password, unknown user, database not granted
	connStartupFailed: "startup_failed", // malformed, unsupported, timed out or abandoned startup
	connTooMany:       "too_many_clients",
	connRejected:      "rejected",           // the tenant's database did not answer (e.g. 3D000)
	connGone:          "gone_mid_statement", // the client left while a statement ran; its backend work was cancelled
	connPanicked:      "panicked",           // a bug in the proxy ended the session (logged with its stack)
}

// NewMetrics creates the instruments and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	queries := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "lattice_proxy_query_duration_seconds",
		Help:    "Client statements by route kind, from the message to the last response (extended protocol: Execute to the Sync or Flush that returned its result); the count is the number of statements.",
		Buckets: []float64{.0002, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"kind"})
	conns := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lattice_proxy_client_connections_total",
		Help: "Client connections by outcome.",
	}, []string{"outcome"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lattice_proxy_errors_sent_total",
		Help: "ErrorResponses sent to clients, by SQLSTATE.",
	}, []string{"sqlstate"})
	pins := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lattice_proxy_pins_total",
		Help: "Sessions pinned to a catalog-node backend, by the session state that pinned them (a session counts once per kind of state it takes while pinned).",
	}, []string{"reason"})
	untracked := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lattice_proxy_untracked_state_total",
		Help: "Backends found holding session state made inside a function, DO block or procedure, by the state (or probe_failed) and the action: pinned (the session keeps its catalog-node backend), reset (DISCARD ALL) or closed.",
	}, []string{"reason", "action"})
	refHolds := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lattice_proxy_reference_holds_total",
		Help: "Writes of a reference table held while its copies changed (a node got or lost its copy), by outcome: released (the new copies arrived) or timed_out (let go after 10 s, to the copies the proxy knew).",
	}, []string{"outcome"})
	m := &Metrics{errors: errs, pins: map[string]prometheus.Counter{}, untracked: untracked,
		refHolds: [2]prometheus.Counter{refHolds.WithLabelValues("released"), refHolds.WithLabelValues("timed_out")}}
	for _, r := range router.PinAll.Names() {
		m.pins[r] = pins.WithLabelValues(r)
	}
	for i, name := range queryKindNames {
		m.queries[i] = queries.WithLabelValues(name)
	}
	for i, name := range connOutcomeNames {
		m.conns[i] = conns.WithLabelValues(name)
	}
	if reg != nil {
		reg.MustRegister(queries, conns, errs, pins, untracked, refHolds)
	}
	return m
}

func (m *Metrics) query(k router.Kind, start time.Time) {
	if k >= 0 && int(k) < len(m.queries) {
		m.queries[k].Observe(time.Since(start).Seconds())
	}
}

func (m *Metrics) conn(outcome int) { m.conns[outcome].Inc() }

func (m *Metrics) errorSent(code string) { m.errors.WithLabelValues(code).Inc() }

func (m *Metrics) pinnedFor(reason string) { m.pins[reason].Inc() }

// referenceHeld counts a write held for a change of a reference table's
// copies: released, or timed out.
func (m *Metrics) referenceHeld(released bool) {
	if released {
		m.refHolds[0].Inc()
	} else {
		m.refHolds[1].Inc()
	}
}

func (m *Metrics) untrackedFound(reason, action string) {
	m.untracked.WithLabelValues(reason, action).Inc()
}

// startupFailed counts a connection whose startup failed with err, and the
// error Handshake sent it, if any.
func (s *Server) startupFailed(err error) {
	var e *sqlstate.Error
	if !errors.As(err, &e) {
		s.metrics.conn(connStartupFailed)
		return
	}
	s.metrics.errorSent(e.Code)
	if strings.HasPrefix(e.Code, "28") { // invalid authorization specification
		s.metrics.conn(connAuthFailed)
	} else {
		s.metrics.conn(connStartupFailed)
	}
}

// execNote is an Execute of the current extended batch, timed when its
// batch's results reach the client.
type execNote struct {
	kind  router.Kind
	start time.Time
}

// noteExecute starts timing an Execute of portal.
func (s *session) noteExecute(portal string) {
	k := kindUnplanned
	if p := s.portals[portal]; p != nil {
		k = kindNone // an empty statement
		if p.stmt.plan != nil {
			k = p.stmt.plan.Kind
		}
	}
	if k != kindNone && len(s.execs) < maxPendingSteps {
		s.execs = append(s.execs, execNote{kind: k, start: time.Now()})
	}
}

// observeExecs records the Executes whose results the client has now.
func (s *session) observeExecs() {
	for _, e := range s.execs {
		s.srv.metrics.query(e.kind, e.start)
	}
	s.execs = s.execs[:0]
}
