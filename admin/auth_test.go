package admin

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
)

func TestAccess(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	withToken := &Access{Token: token, Hosts: DefaultHosts("127.0.0.1:9090")}
	noToken := &Access{Hosts: DefaultHosts("127.0.0.1:9090")}
	goodCookie := &http.Cookie{Name: cookieName, Value: withToken.cookieValue()}
	tests := []struct {
		name   string
		access *Access
		method string
		path   string
		host   string
		bearer string
		cookie *http.Cookie
		origin string
		want   int
	}{
		{name: "healthz is open", access: withToken, path: "/healthz", host: "anything.example", want: 200},
		{name: "readyz is open", access: withToken, path: "/readyz", want: 200},
		{name: "metrics is open", access: withToken, path: "/metrics", want: 200},
		{name: "api without token", access: withToken, path: "/api/status", want: 401},
		{name: "api with wrong token", access: withToken, path: "/api/status", bearer: "nope", want: 401},
		{name: "api with token", access: withToken, path: "/api/status", bearer: token, want: 200},
		{name: "api with cookie", access: withToken, path: "/api/status", cookie: goodCookie, want: 200},
		{name: "api with the token as cookie", access: withToken, path: "/api/status", cookie: &http.Cookie{Name: cookieName, Value: token}, want: 401},
		{name: "page without token shows the login", access: withToken, path: "/", want: 401},
		{name: "pprof without token", access: withToken, path: "/debug/pprof/", want: 401},
		{name: "pprof with token", access: withToken, path: "/debug/pprof/", bearer: token, want: 200},
		{name: "pprof without a configured token", access: noToken, path: "/debug/pprof/", want: 403},
		{name: "loopback without a configured token", access: noToken, path: "/api/status", want: 200},
		{name: "rebinding with matching origin", access: noToken, method: "POST", path: "/api/trees/t/reshard",
			host: "rebind.example:9090", origin: "http://rebind.example:9090", want: 421},
		{name: "rebinding with the cookie", access: withToken, path: "/api/status", host: "rebind.example:9090", cookie: goodCookie, want: 421},
		{name: "other host with bearer token", access: withToken, path: "/api/status", host: "proxy1.internal:9090", bearer: token, want: 200},
		{name: "localhost", access: noToken, path: "/api/status", host: "localhost:9090", want: 200},
		{name: "ipv6 loopback", access: noToken, path: "/api/status", host: "[::1]:9090", want: 200},
		{name: "right name, other port", access: noToken, path: "/api/status", host: "127.0.0.1:8080", want: 421},
		{name: "added host name, any port", access: &Access{Hosts: append(DefaultHosts("127.0.0.1:9090"), "admin.internal")},
			path: "/api/status", host: "admin.internal:1234", want: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.access.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) }))
			method := tc.method
			if method == "" {
				method = "GET"
			}
			req := httptest.NewRequest(method, tc.path, nil)
			req.Host = "127.0.0.1:9090"
			if tc.host != "" {
				req.Host = tc.host
			}
			if tc.bearer != "" {
				req.Header.Set("Authorization", "Bearer "+tc.bearer)
			}
			if tc.cookie != nil {
				req.AddCookie(tc.cookie)
			}
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Errorf("%s %s (Host %s): %d, want %d: %s", method, tc.path, req.Host, rec.Code, tc.want, rec.Body)
			}
		})
	}
}

// TestAccessLogin signs in through the form and uses the cookie it sets.
func TestAccessLogin(t *testing.T) {
	a := &Access{Token: "the-token-the-token-the-token", Hosts: DefaultHosts("127.0.0.1:9090")}
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) }))
	post := func(token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/login", strings.NewReader(url.Values{"token": {token}}.Encode()))
		req.Host = "127.0.0.1:9090"
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := post("wrong"); rec.Code != 401 || len(rec.Result().Cookies()) != 0 {
		t.Fatalf("wrong token: %d, cookies %v", rec.Code, rec.Result().Cookies())
	}
	rec := post(a.Token)
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("login: %d %s", rec.Code, rec.Body)
	}
	cookies := rec.Result().Cookies()
	i := slices.IndexFunc(cookies, func(c *http.Cookie) bool { return c.Name == cookieName })
	if i < 0 {
		t.Fatalf("login set no cookie: %v", cookies)
	}
	c := cookies[i]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Value == a.Token {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict and not the token itself", c)
	}
	req := httptest.NewRequest("GET", "/", nil)
	req.Host = "127.0.0.1:9090"
	req.AddCookie(c)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Errorf("page with the cookie: %d", rec.Code)
	}
}
