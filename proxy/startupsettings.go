package proxy

import (
	"strings"

	"github.com/lattice-db/lattice/router"
	"github.com/lattice-db/lattice/sqlstate"
)

// startupSettings turns a client's startup parameters into the settings the
// session replays on its backends: the `options` parameter's -c name=value
// and --name=value items become settings of their own, and each setting is
// checked as a SET would be, so a client cannot connect with, say, a
// client_encoding under which its keys would hash to the wrong shard.
//
// The options come first and the other parameters after them, so that a
// parameter given both ways takes its own value, as in PostgreSQL.
func startupSettings(params map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(params))
	words := splitOptions(params["options"])
	for i := 0; i < len(words); i++ {
		w := words[i]
		var item string
		switch {
		case w == "-c" && i+1 < len(words):
			i++
			item = words[i]
		case strings.HasPrefix(w, "-c"):
			item = w[2:]
		case strings.HasPrefix(w, "--"):
			item = strings.ReplaceAll(w[2:], "-", "_")
		default:
			e := sqlstate.New(sqlstate.FeatureNotSupported, "startup option %q is not supported through the Lattice proxy", w)
			e.Hint = "use -c name=value settings in options, or SET after connecting"
			return nil, e
		}
		name, value, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return nil, sqlstate.New(sqlstate.InvalidParameterValue, "invalid startup option %q: want name=value", item)
		}
		out[name] = value
	}
	for name, value := range params {
		if name != "options" {
			out[name] = value
		}
	}
	for name, value := range out {
		if err := router.CheckSetting(name, value); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// splitOptions splits the options startup parameter the way PostgreSQL
// does: on white space, with a backslash taking the next character as is.
func splitOptions(s string) []string {
	var out []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inWord = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}
