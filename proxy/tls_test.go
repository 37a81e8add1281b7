package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/localnode"
)

// testTLS returns a server TLS config with a certificate for 127.0.0.1
// issued by a fresh CA, and the CA file for sslrootcert.
func testTLS(t *testing.T) (*tls.Config, string) {
	t.Helper()
	ca, err := localnode.NewTestCA()
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, caFile, err := ca.WriteFiles(t.TempDir(), "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, caFile
}

// TestHandshakeTLS connects with pgconn in every sslmode against a server
// that offers TLS, with and without TLSRequired.
func TestHandshakeTLS(t *testing.T) {
	cfg, caFile := testTLS(t)
	otherCAFile := func() string {
		ca, err := localnode.NewTestCA()
		if err != nil {
			t.Fatal(err)
		}
		_, _, f, err := ca.WriteFiles(t.TempDir(), "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		return f
	}()
	tests := []struct {
		name     string
		required bool
		params   string
		code     string // SQLSTATE the client gets; "" for success
		failTLS  bool   // the client gives up during the TLS handshake
		wantTLS  bool
	}{
		{name: "require", params: "sslmode=require", wantTLS: true},
		{name: "prefer", params: "sslmode=prefer", wantTLS: true},
		{name: "verify-full", params: "sslmode=verify-full sslrootcert=" + caFile, wantTLS: true},
		{name: "verify-full with another CA", params: "sslmode=verify-full sslrootcert=" + otherCAFile, failTLS: true},
		{name: "disable", params: "sslmode=disable"},
		{name: "required: require", required: true, params: "sslmode=require", wantTLS: true},
		{name: "required: disable", required: true, params: "sslmode=disable", code: "28000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, results := serveHandshakes(t, StartupConfig{Users: testUsers(t), TLS: cfg, TLSRequired: tt.required})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, err := pgconn.Connect(ctx, connString(addr, tt.params+" user=alice password='alice secret' dbname=shop"))
			switch {
			case tt.failTLS:
				if err == nil {
					conn.Close(ctx)
					t.Fatal("connected with a certificate of an unknown CA")
				}
				return
			case tt.code != "":
				var pe *pgconn.PgError
				if !errors.As(err, &pe) || pe.Code != tt.code {
					t.Fatalf("Connect: %v, want SQLSTATE %s", err, tt.code)
				}
				if r := nextResult(t, results); r.err == nil {
					t.Errorf("Handshake succeeded for a refused client")
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			if _, isTLS := conn.Conn().(*tls.Conn); isTLS != tt.wantTLS {
				t.Errorf("client connection is TLS: %v, want %v", isTLS, tt.wantTLS)
			}
			r := nextResult(t, results)
			if r.err != nil {
				t.Fatal(r.err)
			}
			tc, isTLS := r.s.Conn.(*tls.Conn)
			if isTLS != tt.wantTLS {
				t.Fatalf("Startup.Conn is TLS: %v, want %v", isTLS, tt.wantTLS)
			}
			if isTLS && tc.ConnectionState().Version < tls.VersionTLS12 {
				t.Errorf("TLS version %x", tc.ConnectionState().Version)
			}
		})
	}
}

// TestHandshakeTLSRaw checks the answers to encryption requests byte by byte.
func TestHandshakeTLSRaw(t *testing.T) {
	cfg, _ := testTLS(t)
	aliceStartup := startupPacket(3<<16, "user", "alice", "database", "shop")
	tests := []struct {
		name     string
		required bool
		client   []byte
		want     string
	}{
		{"GSSENCRequest declined, startup without TLS", false, cat(codePacket(gssEncRequestCode), aliceStartup), "N AuthenticationOk"},
		{"startup without TLS under TLSRequired", true, aliceStartup, "FATAL 28000"},
		{"GSSENCRequest then startup under TLSRequired", true, cat(codePacket(gssEncRequestCode), aliceStartup), "N FATAL 28000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, got := rawHandshake(t, StartupConfig{TLS: cfg, TLSRequired: tt.required}, tt.client)
			if s := summarize(got); s != tt.want {
				t.Errorf("server sent %q, want %q", s, tt.want)
			}
		})
	}
	// A client that sends SSLRequest gets 'S' and then a TLS handshake.
	_, got := rawHandshake(t, StartupConfig{TLS: cfg}, codePacket(sslRequestCode))
	if len(got) == 0 || got[0] != 'S' {
		t.Errorf("answer to SSLRequest: %q, want S", got)
	}
}

// TestHandshakeChannelBinding: over TLS, pgconn with channel_binding=require
// logs in with SCRAM-SHA-256-PLUS, its binding data (the hash of the
// certificate it saw) matching the proxy's; without TLS no -PLUS is offered,
// so such a client gives up.
func TestHandshakeChannelBinding(t *testing.T) {
	cfg, caFile := testTLS(t)
	tests := []struct {
		name   string
		params string
		ok     bool
	}{
		{"require", "sslmode=require channel_binding=require", true},
		{"verify-full", "sslmode=verify-full sslrootcert=" + caFile + " channel_binding=require", true},
		{"prefer", "sslmode=require channel_binding=prefer", true},
		{"no TLS", "sslmode=disable channel_binding=require", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, results := serveHandshakes(t, StartupConfig{Users: testUsers(t), TLS: cfg})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, err := pgconn.Connect(ctx, connString(addr, tt.params+" user=alice password='alice secret' dbname=shop"))
			if !tt.ok {
				if err == nil {
					conn.Close(ctx)
					t.Fatal("channel_binding=require connected without TLS")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			if r := nextResult(t, results); r.err != nil {
				t.Fatal(r.err)
			}
		})
	}
}
