// Package secret keeps passwords out of logs and error messages: it masks
// them in connection URLs (postgres://, redis://, ...) and in keyword/value
// DSNs, wherever they appear in a text.
package secret

import (
	"net/url"
	"regexp"
	"strings"
)

// Mask replaces every password.
const Mask = "xxxxx"

var (
	// urlToken finds URL-like words in a text, quoted or not.
	urlToken = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>` + "`" + `]+`)
	// kvPassword finds password=... (and sslpassword=...) in keyword/value
	// DSNs and in URL query strings.
	kvPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&'"` + "`" + `]+)`)
)

// Redact returns s with the password of every URL and DSN in it masked.
// It is cheap for texts without "://" or "password".
func Redact(s string) string {
	if strings.Contains(s, "://") {
		s = urlToken.ReplaceAllStringFunc(s, redactURL)
	}
	if strings.Contains(strings.ToLower(s), "password") {
		s = kvPassword.ReplaceAllString(s, "${1}"+Mask)
	}
	return s
}

func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		if _, has := u.User.Password(); has {
			return u.Redacted()
		}
		return raw
	}
	// Unparseable (the case whose error would echo it): mask from the
	// first ':' of the user info to its last '@', over-masking rather than
	// leaving a password whose boundaries are unclear.
	i := strings.Index(raw, "://") + 3
	at := strings.LastIndexByte(raw[i:], '@')
	if at < 0 {
		return raw
	}
	colon := strings.IndexByte(raw[i:i+at], ':')
	if colon < 0 {
		return raw
	}
	return raw[:i+colon+1] + Mask + raw[i+at:]
}

// Error returns err with its message redacted; errors.Is and errors.As
// still see err behind it.
func Error(err error) error {
	if err == nil {
		return nil
	}
	return &redacted{err}
}

type redacted struct{ err error }

func (r *redacted) Error() string { return Redact(r.err.Error()) }
func (r *redacted) Unwrap() error { return r.err }
