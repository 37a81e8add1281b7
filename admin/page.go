package admin

import (
	_ "embed"
	"net/http"
)

// page is the operator's page: plain HTML and JavaScript that polls the
// JSON API, so there is no build step.
//
//go:embed page.html
var pageHTML []byte

func (a *API) page(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// The page loads nothing from elsewhere; say so to the browser.
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
	_, _ = w.Write(pageHTML)
}
