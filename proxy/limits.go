package proxy

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

// DefaultMaxMergeMemory bounds the rows one fan-out statement holds in the
// proxy while it merges the nodes' results.
const DefaultMaxMergeMemory = 64 << 20

// statementTimeoutValue finds the value a SET of statement_timeout gives:
// SET [SESSION|LOCAL] statement_timeout {=|TO} value.
var statementTimeoutValue = regexp.MustCompile(`(?is)statement_timeout"?\s*(?:=|\bto\b)\s*('(?:[^']|'')*'|[^\s;]+)`)

// statementTimeout is the statement_timeout the session's backends apply:
// the last SET LOCAL of the open transaction, else the last SET, else the
// startup value. 0 is none, or a value the proxy does not know (DEFAULT:
// the node's own setting, which the node enforces).
func (s *session) statementTimeout() time.Duration {
	lists := [][]setting{s.settings.base, s.settings.set}
	var local []setting
	for _, stmt := range s.tx.local {
		if w := sqlWords(stmt, 3); len(w) == 3 && strings.EqualFold(w[1], "local") && strings.EqualFold(strings.Trim(w[2], `"`), "statement_timeout") {
			local = append(local, setting{name: "statement_timeout", stmt: stmt})
		}
	}
	lists = append(lists, local)
	var d time.Duration
	for _, list := range lists {
		for _, v := range list {
			switch {
			case v.name != "statement_timeout":
			case v.value != "":
				d = timeoutValue(v.value)
			default:
				d = parseTimeout(v.stmt)
			}
		}
	}
	return d
}

// parseTimeout reads the value of a SET statement_timeout statement as
// PostgreSQL does: an integer or decimal with an optional unit (us, ms, s,
// min, h, d), milliseconds by default.
func parseTimeout(stmt string) time.Duration {
	m := statementTimeoutValue.FindStringSubmatch(stmt)
	if m == nil {
		return 0
	}
	v := m[1]
	if strings.HasPrefix(v, "'") {
		v = strings.ReplaceAll(v[1:len(v)-1], "''", "'")
	}
	return timeoutValue(v)
}

// timeoutValue reads a statement_timeout value as PostgreSQL does.
func timeoutValue(v string) time.Duration {
	v = strings.TrimSpace(v)
	num := strings.TrimRightFunc(v, func(r rune) bool { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == ' ' })
	unit := strings.TrimSpace(v[len(num):])
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f <= 0 {
		return 0
	}
	scale, ok := map[string]time.Duration{"": time.Millisecond, "us": time.Microsecond, "ms": time.Millisecond,
		"s": time.Second, "min": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[unit]
	if !ok {
		return 0
	}
	return time.Duration(f * float64(scale))
}

// withStatementTimeout adds the proxy's default statement_timeout to the
// startup settings of a client that set none, so that every backend the
// session uses applies it.
func withStatementTimeout(params map[string]string, d time.Duration) {
	if d <= 0 {
		return
	}
	for k := range params {
		if strings.EqualFold(k, "statement_timeout") {
			return
		}
	}
	params["statement_timeout"] = strconv.FormatInt(max(d.Milliseconds(), 1), 10)
}

// stopper ends a fan-out early: at the session's statement_timeout, or when
// its merge outgrows the memory bound. It cancels the nodes' queries with
// CancelRequests, and remembers why, so that the error the nodes answer
// with (57014, canceled on user request) can be reported as what it is.
type stopper struct {
	mu     sync.Mutex
	timer  *time.Timer
	done   bool
	reason string // "timeout" once the statement_timeout fired
}

// armTimeout starts the statement_timeout of a fan-out.
func (s *session) armTimeout(f *fanOut) {
	d := s.statementTimeout()
	if d <= 0 {
		return
	}
	st := &f.stop
	st.mu.Lock()
	defer st.mu.Unlock()
	st.timer = time.AfterFunc(d, func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		if st.done {
			return
		}
		st.reason = "timeout"
		s.stopParts()
	})
}

// disarm stops the timer; a cancel already being sent finishes first, so
// that none reaches a backend after the statement ended.
func (st *stopper) disarm() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.done = true
	if st.timer != nil {
		st.timer.Stop()
	}
}

func (st *stopper) timedOut() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.reason == "timeout"
}

// overMemory reports a merge that holds more than the server allows.
func (s *session) overMemory(held int64) *sqlstate.Error {
	limit := s.srv.cfg.MaxMergeMemory
	if held <= limit {
		return nil
	}
	e := sqlstate.New(sqlstate.OutOfMemory, "out of memory: merging the results of several shards needs more than %d bytes", limit)
	e.Detail = "The rows the proxy holds at once to merge the nodes' results exceed --max-merge-memory."
	e.Hint = "Select fewer or narrower columns, fix the shard key in WHERE to read one shard, or raise --max-merge-memory."
	return e
}

// explain reports a node's cancel (57014) that the statement_timeout caused
// as a timeout, as PostgreSQL words it.
func (st *stopper) explain(m *pgproto3.ErrorResponse) *pgproto3.ErrorResponse {
	if m.Code != sqlstate.QueryCanceled || !st.timedOut() {
		return m
	}
	e := *m
	e.Message = "canceling statement due to statement timeout"
	return &e
}

// stopParts cancels what the session's backends run, so that a fan-out that
// already failed in the proxy does not read the rest of every node's result.
func (s *session) stopParts() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.cancel(ctx)
}

func rowSize(row [][]byte) int64 {
	var n int64
	for _, v := range row {
		n += int64(len(v))
	}
	return n
}
