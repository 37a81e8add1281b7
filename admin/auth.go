package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"strings"
)

// Access guards the endpoint: who may call it and under which Host names.
// The health, readiness and metrics endpoints stay open to any caller, as
// probes and scrapers need; everything else needs the token when one is set.
type Access struct {
	// Token, when set, is required for every other path: as
	// "Authorization: Bearer TOKEN" (the CLI) or as the cookie the login
	// form sets (the page). Without one the operator keeps the endpoint on
	// loopback (serve refuses otherwise) and pprof is off.
	Token string
	// Hosts are the Host header values a request without a bearer token may
	// carry: "name" matches any port, "name:port" that port only. A page of
	// another site that rebinds its DNS name to this address still sends its
	// own name, so this check is what stops it.
	Hosts []string
	// Secure marks the cookie for HTTPS only (the endpoint serves TLS).
	Secure bool
}

// cookieName is the page's session cookie.
const cookieName = "lattice_admin"

// maxLoginBody bounds the login form: one token field.
const maxLoginBody = 8192

// DefaultHosts are the Host values allowed by default on an endpoint bound
// to addr (host:port as listened on): the loopback names with the port, and
// the listen host itself unless it is unspecified (0.0.0.0, ::).
func DefaultHosts(addr string) []string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	out := []string{net.JoinHostPort("localhost", port), net.JoinHostPort("127.0.0.1", port), net.JoinHostPort("::1", port)}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		out = append(out, net.JoinHostPort(host, port))
	}
	return out
}

// open reports the paths every caller may read.
func open(path string) bool {
	return path == "/healthz" || path == "/readyz" || path == "/metrics"
}

// Wrap puts the checks in front of next.
func (a *Access) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if open(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		// A bearer token cannot come from a page that does not know it, so a
		// request that carries the right one may use any Host (a CLI that
		// reaches the proxy under a name of its own).
		bearer := a.Token != "" && a.bearer(r)
		if !bearer && !a.hostAllowed(r.Host) {
			http.Error(w, "admin: Host "+quote(r.Host)+" is not allowed here; add it with --admin-allowed-hosts", http.StatusMisdirectedRequest)
			return
		}
		if r.URL.Path == "/login" {
			a.login(w, r)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/debug/pprof") && a.Token == "" {
			http.Error(w, "admin: pprof needs an admin token (--admin-token-file or LATTICE_ADMIN_TOKEN)", http.StatusForbidden)
			return
		}
		if a.Token != "" && !bearer && !a.cookie(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="lattice admin"`)
			if r.Method == http.MethodGet && r.URL.Path == "/" {
				loginPage(w, http.StatusUnauthorized, "")
				return
			}
			http.Error(w, "admin: this endpoint needs the admin token", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

func (a *Access) hostAllowed(host string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	for _, allowed := range a.Hosts {
		if _, _, err := net.SplitHostPort(allowed); err == nil {
			if strings.EqualFold(allowed, host) {
				return true
			}
		} else if strings.EqualFold(strings.Trim(allowed, "[]"), strings.Trim(name, "[]")) {
			return true
		}
	}
	return false
}

func (a *Access) bearer(r *http.Request) bool {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && equal(v, a.Token)
}

func (a *Access) cookie(r *http.Request) bool {
	c, err := r.Cookie(cookieName)
	return err == nil && equal(c.Value, a.cookieValue())
}

// cookieValue is derived from the token so that the cookie, which a
// browser keeps on disk, is not the token itself.
func (a *Access) cookieValue() string {
	sum := sha256.Sum256([]byte("lattice admin cookie\x00" + a.Token))
	return hex.EncodeToString(sum[:])
}

func equal(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// login is the page's sign-in: POST the token, get the cookie.
func (a *Access) login(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		loginPage(w, http.StatusOK, "")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	if a.Token == "" || r.ParseForm() != nil || !equal(r.PostForm.Get("token"), a.Token) {
		loginPage(w, http.StatusUnauthorized, "That is not the admin token.")
		return
	}
	// SameSite=Strict: no other site's page can make the browser send it.
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: a.cookieValue(), Path: "/", HttpOnly: true,
		Secure: a.Secure, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

const loginHTML = `<!doctype html>
<html><head><meta charset="utf-8"><title>Lattice admin: sign in</title>
<style>body{font:15px system-ui,sans-serif;margin:4em auto;max-width:26em}input{font:inherit;width:100%;margin:.4em 0}</style></head>
<body><h1>Lattice admin</h1><p>{{msg}}</p>
<form method="post" action="/login"><label>Admin token <input type="password" name="token" id="token" autocomplete="current-password" autofocus></label>
<input type="submit" id="signin" value="Sign in"></form></body></html>
`

func loginPage(w http.ResponseWriter, status int, msg string) {
	if msg == "" {
		msg = "This endpoint needs the proxy's admin token."
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(strings.Replace(loginHTML, "{{msg}}", msg, 1)))
}
