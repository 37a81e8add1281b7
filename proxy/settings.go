package proxy

import (
	"context"
	"slices"
	"strings"
	"unicode"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// settings is a client's session state that must follow it across pooled
// backends: startup parameters, then SETs in the order they were made.
// Its fingerprint tells whether a backend already carries exactly this state.
type settings struct {
	base []setting // from the startup packet: what RESET ALL returns to
	set  []setting // SET commands since
	fp   string
	// catalogLate: a search_path names pg_catalog, so it may come after
	// another schema, whose functions then take built-ins' names
	// (router.HidesByPath).
	catalogLate bool
	// searchPath: the session set a search_path, under which a tree's
	// bare name may mean another schema's relation (shadow.go).
	searchPath bool
}

type setting struct {
	name  string // lower-case parameter name
	stmt  string // statement that applies it
	value string // a startup setting's value; a SET's is in its stmt
}

func newSettings(params map[string]string, backendDefaults map[string]string) *settings {
	s := &settings{}
	for name, value := range params {
		lname := strings.ToLower(name)
		if def, ok := backendDefaults[name]; ok && def == value {
			continue
		}
		// set_config takes the value as the startup packet gives it: SET
		// would make 'a, b' one name of a list setting (search_path).
		s.base = append(s.base, setting{name: lname, value: value,
			stmt: "SELECT pg_catalog.set_config(" + quoteLiteral(lname) + ", " + quoteLiteral(value) + ", false)"})
	}
	// Deterministic order so that equal states have equal fingerprints.
	slices.SortFunc(s.base, func(a, b setting) int { return strings.Compare(a.name, b.name) })
	s.refresh()
	return s
}

func (s *settings) refresh() {
	s.catalogLate, s.searchPath = false, false
	for _, v := range slices.Concat(s.base, s.set) {
		s.searchPath = s.searchPath || v.name == "search_path"
		text := v.stmt
		if v.value != "" {
			text = v.value
		}
		text = strings.TrimPrefix(text, router.PathConfigPrefix) // the value only
		if v.name == "search_path" && strings.Contains(strings.ToLower(text), "pg_catalog") {
			s.catalogLate = true
		}
	}
	if len(s.base) == 0 && len(s.set) == 0 {
		s.fp = ""
		return
	}
	var b strings.Builder
	b.WriteString("RESET ALL")
	for _, v := range s.base {
		b.WriteString("; ")
		b.WriteString(v.stmt)
	}
	for _, v := range s.set {
		b.WriteString("; ")
		b.WriteString(v.stmt)
	}
	s.fp = b.String()
}

// apply records a successful SET or RESET statement, or a set_config of
// search_path the router took for one (router.Plan.SetPath).
func (s *settings) apply(stmt string) {
	verb, name := setTarget(stmt)
	if strings.HasPrefix(stmt, router.PathConfigPrefix) {
		verb, name = "set", "search_path"
	}
	switch {
	case verb == "reset" && name == "all":
		s.set = nil
	case verb == "reset":
		s.set = removeSetting(s.set, name)
	case name != "":
		s.set = append(removeSetting(s.set, name), setting{name: name, stmt: stmt})
	}
	s.refresh()
}

// tracks reports a setting the proxy replays for the session.
func (s *settings) tracks(name string) bool {
	for _, v := range slices.Concat(s.base, s.set) {
		if v.name == name {
			return true
		}
	}
	return false
}

// resetsStartup reports a RESET of a setting the session took from its
// startup packet (or the proxy's defaults), which a backend resets to its
// own startup value instead.
func (s *settings) resetsStartup(stmt string) bool {
	verb, name := setTarget(stmt)
	if verb != "reset" {
		return false
	}
	for _, b := range s.base {
		if name == "all" || b.name == name {
			return true
		}
	}
	return false
}

// restore sets the SETs back to an earlier list (a transaction rolled back).
func (s *settings) restore(set []setting) {
	s.set = set
	s.refresh()
}

// reset is DISCARD ALL: back to the startup state.
func (s *settings) reset() {
	s.set = nil
	s.refresh()
}

// recordSet records a SET or RESET that PostgreSQL accepted on be; inTx
// says it ran inside a transaction block, whose rollback undoes it.
func (s *session) recordSet(be *pgshard.Conn, stmt string, inTx bool) {
	if inTx && !s.tx.setInTx {
		s.tx.setInTx, s.tx.setsBefore = true, slices.Clone(s.settings.set)
	}
	s.settings.apply(stmt)
	be.Settings = s.settings.fp
	if s.settings.resetsStartup(stmt) {
		// PostgreSQL reset be to its own startup value, not the session's:
		// the next use replays the session's settings.
		be.Settings = unknownSettings
	}
}

// multiSets refuses a query string whose SETs the proxy could not follow:
// with COMMIT, ROLLBACK or savepoints among its statements, which of its
// SETs last depends on where an error stops it.
func (s *session) multiSets(sets []string, txStmts []*router.Plan) error {
	if len(sets) == 0 {
		return nil
	}
	for _, p := range txStmts {
		if p.Kind == router.Transaction {
			e := sqlstate.New(sqlstate.FeatureNotSupported, "SET or RESET cannot be combined with %s in one query string through the Lattice proxy", strings.ToUpper(firstWord(p.SQL)))
			e.Hint = "send the SET in a query of its own, or use SET LOCAL inside the transaction"
			return e
		}
	}
	return nil
}

// recordSets follows the SETs of a query string of several statements
// that ran on node. PostgreSQL runs such a string as one implicit
// transaction: when any statement fails, its SETs are undone with the
// rest, so they are recorded only when the whole string succeeded. One
// that opened a transaction block (BEGIN) leaves them to that block.
func (s *session) recordSets(ctx context.Context, node string, sets []string) {
	if len(sets) == 0 {
		return
	}
	be, err := s.backend(ctx, node)
	if err != nil {
		return // forwardQuery took it already; it cannot fail now
	}
	wasInTx := s.tx.active
	s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
		if x.errored || x.failed[be] {
			return
		}
		for _, stmt := range sets {
			s.recordSet(be, stmt, wasInTx || be.TxStatus != 'I')
		}
	}})
}

// recordPath records, once PostgreSQL accepted it on be, a set_config of
// search_path that runs as an ordinary catalog statement (router.Plan.SetPath).
func (s *session) recordPath(be *pgshard.Conn, stmt string) {
	s.x.add(step{kind: stepSynthetic, then: func(x *exchange) {
		if !x.failed[be] {
			s.recordSet(be, stmt, s.tx.active)
		}
	}})
}

func removeSetting(v []setting, name string) []setting {
	out := v[:0]
	for _, x := range v {
		if x.name != name {
			out = append(out, x)
		}
	}
	return out
}

// replay is the statement that brings a backend from state fp to s, or "".
// unknownSettings marks a backend whose settings the proxy does not know:
// it matches no fingerprint, so the session's settings are replayed.
const unknownSettings = "\x00unknown"

func (s *settings) replay(fp string) string {
	if fp == s.fp {
		return ""
	}
	if s.fp == "" {
		return "RESET ALL"
	}
	return s.fp
}

// setTarget extracts the verb ("set" or "reset") and the lower-case parameter
// a SET/RESET statement names, mapping PostgreSQL's special forms.
func setTarget(stmt string) (verb, name string) {
	words := sqlWords(stmt, 4)
	if len(words) == 0 {
		return "", ""
	}
	verb = strings.ToLower(words[0])
	rest := words[1:]
	if len(rest) > 0 && strings.EqualFold(rest[0], "session") {
		rest = rest[1:]
		if len(rest) > 0 && strings.EqualFold(rest[0], "authorization") {
			return verb, "session_authorization"
		}
		if len(rest) > 0 && strings.EqualFold(rest[0], "characteristics") {
			return verb, "default_transaction_characteristics"
		}
	}
	if len(rest) == 0 {
		return verb, ""
	}
	n := rest[0]
	switch strings.ToLower(n) {
	case "time":
		return verb, "timezone"
	case "names":
		return verb, "client_encoding"
	case "schema":
		return verb, "search_path"
	case "xml":
		return verb, "xmloption"
	}
	if strings.HasPrefix(n, `"`) {
		return verb, strings.ReplaceAll(strings.Trim(n, `"`), `""`, `"`)
	}
	return verb, strings.ToLower(n)
}

// sqlWords splits the start of a statement into at most n words: identifiers
// (dotted names kept whole) and quoted identifiers.
func sqlWords(s string, n int) []string { return appendSQLWords(nil, s, n) }

// appendSQLWords is sqlWords appending to out, which may be a caller's
// array on its stack: firstWord runs on every catalog statement.
func appendSQLWords(out []string, s string, n int) []string {
	n += len(out)
	i := 0
	for i < len(s) && len(out) < n {
		c := rune(s[i])
		switch {
		case unicode.IsSpace(c):
			i++
		case c == '"':
			j := i + 1
			for j < len(s) {
				if s[j] == '"' {
					if j+1 < len(s) && s[j+1] == '"' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			if j < len(s) {
				j++
			}
			out = append(out, s[i:j])
			i = j
		case c == '_' || c == '.' || unicode.IsLetter(c) || unicode.IsDigit(c):
			j := i
			for j < len(s) && (s[j] == '_' || s[j] == '.' || s[j] == '$' || unicode.IsLetter(rune(s[j])) || unicode.IsDigit(rune(s[j])) || s[j] >= 0x80) {
				j++
			}
			out = append(out, s[i:j])
			i = j
		default:
			return out
		}
	}
	return out
}

func quoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
