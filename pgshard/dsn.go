package pgshard

import (
	"fmt"
	"net/url"
	"sort"
	"strings"
)

// A DSN in the node registry never carries a secret: the registry lives in
// Redis, which every proxy and operator tool reads. These are the keywords
// that carry one.
var secretKeys = []string{"password", "sslpassword"}

// isURL reports whether dsn is in URL form rather than keyword/value form.
func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// SplitPassword returns dsn without its secrets, the password it carried
// ("" when none), and whether it carried any secret. It reads only the
// text of the DSN, not the environment or a pgpass file, as
// pgconn.ParseConfig would.
func SplitPassword(dsn string) (clean, password string, secret bool, err error) {
	if len(dsn) > maxDSNLength {
		return "", "", false, fmt.Errorf("pgshard: DSN longer than %d bytes", maxDSNLength)
	}
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", "", false, fmt.Errorf("pgshard: parse DSN: %w", err)
		}
		if u.User != nil {
			if p, ok := u.User.Password(); ok {
				password, secret = p, true
				u.User = url.User(u.User.Username())
			}
		}
		q := u.Query()
		if p := q.Get("password"); p != "" && password == "" {
			password = p
		}
		for _, k := range secretKeys {
			if q.Has(k) {
				q.Del(k)
				secret = true
			}
		}
		if secret {
			u.RawQuery = q.Encode()
		}
		return u.String(), password, secret, nil
	}
	kv, err := parseKeywords(dsn)
	if err != nil {
		return "", "", false, err
	}
	password = kv["password"]
	for _, k := range secretKeys {
		if _, ok := kv[k]; ok {
			delete(kv, k)
			secret = true
		}
	}
	if !secret {
		return dsn, "", false, nil
	}
	return formatKeywords(kv), password, true, nil
}

// withParam sets keyword key of a DSN in URL or keyword/value form.
func withParam(dsn, key, value string) (string, error) {
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("pgshard: parse DSN: %w", err)
		}
		q := u.Query()
		q.Set(key, value)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	// In keyword/value form the last occurrence of a keyword wins.
	return strings.TrimSpace(dsn + " " + key + "=" + quoteKeyword(value)), nil
}

func quoteKeyword(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// maxDSNLength bounds a DSN that comes from a client.
const maxDSNLength = 4096

// parseKeywords reads a keyword/value connection string as libpq does:
// key = value pairs separated by spaces, a value in single quotes with
// backslash escapes. The last occurrence of a keyword wins.
func parseKeywords(s string) (map[string]string, error) {
	out := map[string]string{}
	i := 0
	skip := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
	}
	for {
		skip()
		if i >= len(s) {
			return out, nil
		}
		start := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' && s[i] != '\t' {
			i++
		}
		key := s[start:i]
		skip()
		if i >= len(s) || s[i] != '=' || key == "" {
			return nil, fmt.Errorf("pgshard: DSN: missing \"=\" after %q", key)
		}
		i++
		skip()
		var val strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				i++
				if c == '\\' && i < len(s) {
					val.WriteByte(s[i])
					i++
					continue
				}
				if c == '\'' {
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return nil, fmt.Errorf("pgshard: DSN: unterminated quoted value of %q", key)
			}
		} else {
			for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				val.WriteByte(s[i])
				i++
			}
		}
		out[key] = val.String()
	}
}

// formatKeywords writes kv back, keywords sorted so the text is stable.
func formatKeywords(kv map[string]string) string {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + quoteKeyword(kv[k])
	}
	return strings.Join(parts, " ")
}
