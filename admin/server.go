// Package admin serves the operator's HTTP endpoint: health, readiness,
// Prometheus metrics, the JSON API and the page that draws the slot maps.
package admin

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server is the admin HTTP endpoint.
type Server struct {
	Registry *prometheus.Registry
	// Ready reports whether the proxy can serve; /readyz answers 503 otherwise.
	Ready func(ctx context.Context) error
	// API, when set, serves /api/... and the page at /.
	API *API
	// Access, when set, guards every path but /healthz, /readyz and /metrics.
	Access *Access
	// TLS, when set, serves HTTPS.
	TLS *tls.Config
	Log *slog.Logger
}

// New creates an admin server with Go runtime and process metrics registered.
func New(log *slog.Logger) *Server {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Server{Registry: reg, Log: log}
}

// Handler routes the endpoint's paths.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if s.Ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			if err := s.Ready(ctx); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{}))
	// Profiles for diagnosing a slow proxy; Access lets only token holders in.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	if s.API != nil {
		s.API.routes(mux)
	}
	if s.Access != nil {
		return s.Access.Wrap(mux)
	}
	return mux
}

// Serve runs the endpoint on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	if s.TLS != nil {
		ln = tls.NewListener(ln, s.TLS)
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
