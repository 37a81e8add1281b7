package proxy

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lattice-db/lattice/sqlstate"
)

const (
	alicePassword = "alice secret"
	bobPassword   = "pässwörd"
)

// testUsers: alice may use shop and stats, bob every database.
func testUsers(t testing.TB) *Users {
	t.Helper()
	v, err := NewVerifier(alicePassword)
	if err != nil {
		t.Fatal(err)
	}
	users, err := parseUsers("users", strings.NewReader(
		"alice "+v+" shop,stats\n"+
			"bob "+pgVerifierPasswort+" *\n"))
	if err != nil {
		t.Fatal(err)
	}
	return users
}

type handshakeResult struct {
	s   *Startup
	err error
}

// serveHandshakes runs Handshake on every connection to the address it
// returns and, when one succeeds, ends the startup as the proxy's caller
// does, so that a client's connect completes.
func serveHandshakes(t *testing.T, cfg StartupConfig) (string, <-chan handshakeResult) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	results := make(chan handshakeResult, 8)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				s, err := Handshake(context.Background(), conn, cfg)
				if err == nil && s.Cancel == nil {
					s.Backend.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: cfg.ServerVersion})
					s.Backend.Send(&pgproto3.BackendKeyData{ProcessID: 42, SecretKey: []byte{0, 0, 0, 7}})
					s.Backend.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
					err = s.Backend.Flush()
				}
				results <- handshakeResult{s, err}
			}()
		}
	}()
	return ln.Addr().String(), results
}

func nextResult(t *testing.T, results <-chan handshakeResult) handshakeResult {
	t.Helper()
	select {
	case r := <-results:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Handshake did not return")
		return handshakeResult{}
	}
}

func connString(addr, params string) string {
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf("host=%s port=%s connect_timeout=5 %s", host, port, params)
}

// TestHandshakePgconn connects with pgconn, a real client.
func TestHandshakePgconn(t *testing.T) {
	users := testUsers(t)
	tests := []struct {
		name     string
		users    *Users
		params   string
		code     string // SQLSTATE the client gets; "" for success
		message  string
		hint     string
		user, db string // what the server sees on success
	}{
		{name: "trust", params: "user=anyone dbname=shop application_name=t1", user: "anyone", db: "shop"},
		{name: "scram", users: users, params: "user=alice password='alice secret' dbname=shop application_name=t1", user: "alice", db: "shop"},
		{name: "scram non-ASCII password from pg_authid", users: users, params: "user=bob password=pässwörd dbname=billing", user: "bob", db: "billing"},
		{name: "database defaults to user", users: users, params: "user=bob password=pässwörd", user: "bob", db: "bob"},
		{name: "protocol 3.2 client", users: users, params: "user=alice password='alice secret' dbname=stats max_protocol_version=3.2", user: "alice", db: "stats"},
		{name: "wrong password", users: users, params: "user=alice password=guess dbname=shop", code: "28P01",
			message: `password authentication failed for user "alice"`},
		{name: "unknown user", users: users, params: "user=mallory password=guess dbname=shop", code: "28P01",
			message: `password authentication failed for user "mallory"`},
		{name: "tenant not granted", users: users, params: "user=alice password='alice secret' dbname=billing", code: "28000",
			message: `user "alice" is not allowed to connect to database "billing"`},
		{name: "replication", params: "user=alice dbname=shop replication=database", code: "0A000",
			message: "replication connections are not supported", hint: "Connect to a node directly for replication."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, results := serveHandshakes(t, StartupConfig{Users: tt.users, ServerVersion: "16.4"})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, err := pgconn.Connect(ctx, connString(addr, "sslmode=disable "+tt.params))
			r := nextResult(t, results)

			if tt.code != "" {
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) {
					t.Fatalf("Connect: %v, want a server error %s", err, tt.code)
				}
				if pgErr.Code != tt.code || pgErr.Message != tt.message || pgErr.Severity != "FATAL" || pgErr.Detail != "" || pgErr.Hint != tt.hint {
					t.Errorf("client got %+v, want FATAL %s %q", pgErr, tt.code, tt.message)
				}
				if e := sqlstate.As(r.err); r.err == nil || e.Code != tt.code {
					t.Errorf("Handshake: %v, want an error with %s", r.err, tt.code)
				}
				return
			}
			if err != nil {
				t.Fatalf("Connect: %v (server: %v)", err, r.err)
			}
			defer conn.Close(context.Background())
			if r.err != nil {
				t.Fatalf("Handshake: %v", r.err)
			}
			if r.s.User != tt.user || r.s.Database != tt.db || r.s.Cancel != nil {
				t.Errorf("Startup = %+v, want user %s database %s", r.s, tt.user, tt.db)
			}
			for _, p := range []string{"user", "database", "password"} {
				if _, ok := r.s.Params[p]; ok {
					t.Errorf("Params has %q: %v", p, r.s.Params)
				}
			}
			if strings.Contains(tt.params, "application_name=t1") && r.s.Params["application_name"] != "t1" {
				t.Errorf("Params = %v, want application_name t1", r.s.Params)
			}
			if v := conn.ParameterStatus("server_version"); v != "16.4" {
				t.Errorf("client sees server_version %q", v)
			}
		})
	}
}

// TestHandshakeSSLPrefer: pgconn with sslmode=prefer asks for TLS, is told
// 'N', and connects again in plain text.
func TestHandshakeSSLPrefer(t *testing.T) {
	addr, results := serveHandshakes(t, StartupConfig{Users: testUsers(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, connString(addr, "sslmode=prefer user=alice password='alice secret' dbname=shop"))
	if err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
	var refused, ok int
	for range 2 {
		switch r := nextResult(t, results); {
		case errors.Is(r.err, io.EOF):
			refused++ // the connection that was told 'N'
		case r.err == nil && r.s.User == "alice":
			ok++
		default:
			t.Errorf("Handshake = %+v, %v", r.s, r.err)
		}
	}
	if refused != 1 || ok != 1 {
		t.Errorf("%d connections ended after SSLRequest and %d succeeded, want 1 and 1", refused, ok)
	}
}

// TestHandshakeCancelPgconn sends pgconn's CancelRequest for a session.
func TestHandshakeCancelPgconn(t *testing.T) {
	addr, results := serveHandshakes(t, StartupConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, connString(addr, "sslmode=disable user=alice"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	nextResult(t, results)
	if err := conn.CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	r := nextResult(t, results)
	if r.err != nil || r.s.Cancel == nil || *r.s.Cancel != (CancelKey{ProcessID: 42, SecretKey: 7}) {
		t.Fatalf("Handshake = %+v, %v; want Cancel {42 7}", r.s, r.err)
	}
	if r.s.Backend != nil || r.s.User != "" || r.s.Params != nil {
		t.Errorf("a cancel request set more than Cancel: %+v", r.s)
	}
}

// Raw client packets.

func startupPacket(version uint32, params ...string) []byte {
	b := binary.BigEndian.AppendUint32(make([]byte, 4), version)
	for _, p := range params {
		b = append(append(b, p...), 0)
	}
	b = append(b, 0)
	binary.BigEndian.PutUint32(b, uint32(len(b)))
	return b
}

// packet prefixes body with its length.
func packet(body []byte, more string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(4+len(body)+len(more)))
	return append(append(b, body...), more...)
}

func codePacket(code uint32, extra ...byte) []byte {
	b := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, uint32(8+len(extra))), code)
	return append(b, extra...)
}

func encode(msgs ...pgproto3.FrontendMessage) []byte {
	var b []byte
	for _, m := range msgs {
		var err error
		if b, err = m.Encode(b); err != nil {
			panic(err)
		}
	}
	return b
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// summarize renders what a server sent: N for a refused encryption request,
// then each message by type, an ErrorResponse by its SQLSTATE.
func summarize(got []byte) string {
	var out []string
	for len(got) > 0 && got[0] == 'N' {
		out = append(out, "N")
		got = got[1:]
	}
	for len(got) > 0 {
		if len(got) < 5 || len(got) < 1+int(binary.BigEndian.Uint32(got[1:5])) {
			return strings.Join(append(out, "undecodable"), " ")
		}
		n := 1 + int(binary.BigEndian.Uint32(got[1:5]))
		msg, err := pgproto3.NewFrontend(bytes.NewReader(got[:n]), io.Discard).Receive()
		if err != nil {
			return strings.Join(append(out, "undecodable"), " ")
		}
		got = got[n:]
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			out = append(out, m.Severity+" "+m.Code)
		case *pgproto3.NegotiateProtocolVersion:
			out = append(out, fmt.Sprintf("NegotiateProtocolVersion(%d %v)", m.NewestMinorProtocol, m.UnrecognizedOptions))
		case *pgproto3.AuthenticationSASL:
			out = append(out, fmt.Sprintf("AuthenticationSASL%v", m.AuthMechanisms))
		default:
			out = append(out, strings.TrimPrefix(fmt.Sprintf("%T", msg), "*pgproto3."))
		}
	}
	return strings.Join(out, " ")
}

// rawHandshake sends client to a Handshake and returns the result and all
// the server sent until it closed the connection.
func rawHandshake(t *testing.T, cfg StartupConfig, client []byte) (handshakeResult, []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	results := make(chan handshakeResult, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			results <- handshakeResult{err: err}
			return
		}
		defer conn.Close()
		s, err := Handshake(context.Background(), conn, cfg)
		results <- handshakeResult{s, err}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(client); err != nil {
		t.Fatal(err)
	}
	// A client with nothing more to say: Handshake sees EOF, not a timeout.
	conn.(*net.TCPConn).CloseWrite()
	r := nextResult(t, results)
	got, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("reading the server's replies: %v", err)
	}
	return r, got
}

func TestHandshakeRaw(t *testing.T) {
	users := testUsers(t)
	aliceStartup := startupPacket(pgproto3.ProtocolVersion30, "user", "alice", "database", "shop")
	scramFirst := []byte("n,,n=,r=abcdef")
	tests := []struct {
		name   string
		users  *Users
		client []byte
		want   string // summary of the server's replies
		// SQLSTATE of Handshake's error, "" for success; "error" for an
		// error not sent to the client, "eof" for one matching EOF too.
		code  string
		check func(t *testing.T, s *Startup)
	}{
		{name: "trust", client: aliceStartup, want: "AuthenticationOk"},
		{name: "SSLRequest then startup", client: cat(codePacket(sslRequestCode), aliceStartup), want: "N AuthenticationOk"},
		{name: "GSSENCRequest, SSLRequest, startup",
			client: cat(codePacket(gssEncRequestCode), codePacket(sslRequestCode), aliceStartup), want: "N N AuthenticationOk"},
		{name: "SSLRequest twice", client: cat(codePacket(sslRequestCode), codePacket(sslRequestCode)),
			want: "N FATAL 08P01", code: "08P01"},
		{name: "SSLRequest with a body", client: codePacket(sslRequestCode, 0, 0, 0, 0), want: "FATAL 08P01", code: "08P01"},
		{name: "params kept, protocol options refused",
			client: startupPacket(pgproto3.ProtocolVersion32, "user", "u", "application_name", "app", "_pq_.future", "1", "options", "-c x=1", "replication", "off"),
			want:   "NegotiateProtocolVersion(196608 [_pq_.future]) AuthenticationOk",
			check: func(t *testing.T, s *Startup) {
				want := map[string]string{"application_name": "app", "options": "-c x=1"}
				if s.User != "u" || s.Database != "u" || !reflect.DeepEqual(s.Params, want) {
					t.Errorf("Startup = %+v, want user u, database u, params %v", s, want)
				}
			}},
		{name: "protocol 3.9", client: startupPacket(3<<16|9, "user", "u"), want: "NegotiateProtocolVersion(196608 []) AuthenticationOk"},
		{name: "protocol 2.0", client: startupPacket(2<<16, "user", "u"), want: "FATAL 0A000", code: "0A000"},
		{name: "protocol 4.0", client: startupPacket(4<<16, "user", "u"), want: "FATAL 0A000", code: "0A000"},
		{name: "no user", client: startupPacket(pgproto3.ProtocolVersion30, "database", "shop"), want: "FATAL 28000", code: "28000"},
		{name: "replication=true", client: startupPacket(pgproto3.ProtocolVersion30, "user", "u", "replication", "true"),
			want: "FATAL 0A000", code: "0A000"},
		{name: "oversize startup length", client: binary.BigEndian.AppendUint32(nil, maxStartupPacket+5), want: "FATAL 08P01", code: "08P01"},
		{name: "negative startup length", client: []byte{0xff, 0xff, 0xff, 0xfc}, want: "FATAL 08P01", code: "08P01"},
		{name: "startup length too small", client: []byte{0, 0, 0, 7}, want: "FATAL 08P01", code: "08P01"},
		{name: "no terminator", client: packet(binary.BigEndian.AppendUint32(nil, pgproto3.ProtocolVersion30), "user\x00u\x00"),
			want: "FATAL 08P01", code: "08P01"},
		{name: "name without value", client: startupPacket(pgproto3.ProtocolVersion30, "user"), want: "FATAL 08P01", code: "08P01"},
		{name: "data after terminator", client: packet(binary.BigEndian.AppendUint32(nil, pgproto3.ProtocolVersion30), "user\x00u\x00\x00x"),
			want: "FATAL 08P01", code: "08P01"},
		{name: "SCRAM-SHA-256-PLUS without TLS", users: users,
			client: cat(aliceStartup, encode(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256-PLUS", Data: []byte("p=tls-server-end-point,,n=,r=abc")})),
			want:   "AuthenticationSASL[SCRAM-SHA-256] FATAL 08P01", code: "08P01"},
		{name: "unknown mechanism", users: users,
			client: cat(aliceStartup, encode(&pgproto3.SASLInitialResponse{AuthMechanism: "OAUTHBEARER", Data: scramFirst})),
			want:   "AuthenticationSASL[SCRAM-SHA-256] FATAL 08P01", code: "08P01"},
		{name: "query instead of SASL", users: users, client: cat(aliceStartup, encode(&pgproto3.Query{String: "select 1"})),
			want: "AuthenticationSASL[SCRAM-SHA-256] FATAL 08P01", code: "08P01"},
		{name: "unknown message instead of SASL", users: users, client: cat(aliceStartup, []byte{'z', 0, 0, 0, 4}),
			want: "AuthenticationSASL[SCRAM-SHA-256] FATAL 08P01", code: "08P01"},
		{name: "oversize SASL message", users: users, client: cat(aliceStartup, []byte{'p', 0, 1, 0, 4}),
			want: "AuthenticationSASL[SCRAM-SHA-256] FATAL 08P01", code: "08P01"},
		{name: "SASL message without its mechanism's terminator", users: users, client: cat(aliceStartup, []byte{'p', 0, 0, 0, 7, 'S', 'C', 'R'}),
			want: "AuthenticationSASL[SCRAM-SHA-256] FATAL 08P01", code: "08P01"},
		{name: "malformed SCRAM", users: users,
			client: cat(aliceStartup, encode(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte("n,,r=abc")})),
			want:   "AuthenticationSASL[SCRAM-SHA-256] FATAL 08P01", code: "08P01"},
		{name: "client gone during SCRAM", users: users,
			client: cat(aliceStartup, encode(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: scramFirst})),
			want:   "AuthenticationSASL[SCRAM-SHA-256] AuthenticationSASLContinue", code: "eof"},
		{name: "CancelRequest", client: codePacket(cancelRequestCode, 0, 0, 0, 42, 0, 0, 0, 7), want: "",
			check: func(t *testing.T, s *Startup) {
				if s.Cancel == nil || *s.Cancel != (CancelKey{ProcessID: 42, SecretKey: 7}) || s.Backend != nil {
					t.Errorf("Startup = %+v, want only Cancel {42 7}", s)
				}
			}},
		{name: "CancelRequest after SSLRequest", client: cat(codePacket(sslRequestCode), codePacket(cancelRequestCode, 0, 0, 0, 1, 0, 0, 0, 2)),
			want: "N", check: func(t *testing.T, s *Startup) {
				if s.Cancel == nil || *s.Cancel != (CancelKey{ProcessID: 1, SecretKey: 2}) {
					t.Errorf("Startup = %+v, want Cancel {1 2}", s)
				}
			}},
		{name: "CancelRequest with a 3.2 key", client: codePacket(cancelRequestCode, make([]byte, 36)...), want: "", code: "error"},
		{name: "direct TLS", client: []byte{0x16, 3, 1, 0}, want: "", code: "error"},
		{name: "empty connection", client: nil, want: "", code: "eof"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, got := rawHandshake(t, StartupConfig{Users: tt.users}, tt.client)
			if s := summarize(got); s != tt.want {
				t.Errorf("server sent %q, want %q", s, tt.want)
			}
			switch tt.code {
			case "":
				if r.err != nil {
					t.Fatalf("Handshake: %v", r.err)
				}
				if tt.check != nil {
					tt.check(t, r.s)
				}
			case "error", "eof":
				var e *sqlstate.Error
				if r.err == nil || errors.As(r.err, &e) {
					t.Errorf("Handshake: %v, want an error not sent to the client", r.err)
				}
				if tt.code == "eof" && !errors.Is(r.err, io.EOF) && !errors.Is(r.err, io.ErrUnexpectedEOF) {
					t.Errorf("Handshake: %v, want EOF", r.err)
				}
			default:
				checkCode(t, "Handshake", r.err, tt.code)
			}
		})
	}
}

// TestSCRAMUnknownUserSalt: the salt offered for a user that does not
// exist is stable, like a real one, so it does not give the user away.
func TestSCRAMUnknownUserSalt(t *testing.T) {
	users := testUsers(t)
	serverFirst := func(user string) string {
		client := cat(startupPacket(pgproto3.ProtocolVersion30, "user", user),
			encode(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte("n,,n=,r=abcdef")}))
		_, got := rawHandshake(t, StartupConfig{Users: users}, client)
		fe := pgproto3.NewFrontend(bytes.NewReader(got), io.Discard)
		for {
			msg, err := fe.Receive()
			if err != nil {
				t.Fatalf("no server-first-message for %s: %v", user, err)
			}
			if m, ok := msg.(*pgproto3.AuthenticationSASLContinue); ok {
				return string(m.Data)
			}
		}
	}
	saltOf := func(user string) string {
		attrs := strings.Split(serverFirst(user), ",")
		if len(attrs) != 3 || attrs[2] != "i=4096" {
			t.Fatalf("server-first-message for %s: %v", user, attrs)
		}
		salt, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(attrs[1], "s="))
		if err != nil || len(salt) != 16 {
			t.Fatalf("salt for %s: %q", user, attrs[1])
		}
		return attrs[1]
	}
	if a, b := saltOf("ghost"), saltOf("ghost"); a != b {
		t.Errorf("salts for an unknown user differ: %s, %s", a, b)
	}
	if a, b := saltOf("ghost"), saltOf("phantom"); a == b {
		t.Errorf("two unknown users share the salt %s", a)
	}
}

func TestHandshakeTimeout(t *testing.T) {
	for _, tt := range []struct {
		name   string
		client []byte
	}{
		{"silent", nil},
		{"partial length", []byte{0, 0}},
		{"partial packet", startupPacket(pgproto3.ProtocolVersion30, "user", "u")[:10]},
		{"SSLRequest then silent", codePacket(sslRequestCode)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			server, client := net.Pipe()
			defer client.Close()
			go func() {
				client.Write(tt.client)
				io.Copy(io.Discard, client)
			}()
			start := time.Now()
			_, err := Handshake(context.Background(), server, StartupConfig{StartupTimeout: 100 * time.Millisecond})
			server.Close()
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("Handshake: %v, want a deadline error", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("Handshake took %v with a 100ms timeout", d)
			}
		})
	}
}

func TestHandshakeContextCancel(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	defer server.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := Handshake(ctx, server, StartupConfig{StartupTimeout: time.Minute})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Handshake: %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Handshake took %v after its context was cancelled", d)
	}
}

// TestHandshakeClearsDeadline: the caller gets a connection without the
// startup deadline.
func TestHandshakeClearsDeadline(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	defer server.Close()
	go func() {
		client.Write(startupPacket(pgproto3.ProtocolVersion30, "user", "u"))
		io.Copy(io.Discard, client)
	}()
	s, err := Handshake(context.Background(), server, StartupConfig{StartupTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	s.Backend.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := s.Backend.Flush(); err != nil {
		t.Errorf("writing after the startup timeout: %v", err)
	}
}

// TestHandshakeMaxMessageSize: after startup, Backend enforces MaxMessageSize.
func TestHandshakeMaxMessageSize(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	defer server.Close()
	go func() {
		client.Write(startupPacket(pgproto3.ProtocolVersion30, "user", "u"))
		io.Copy(io.Discard, client)
	}()
	s, err := Handshake(context.Background(), server, StartupConfig{MaxMessageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	go client.Write(encode(&pgproto3.Query{String: strings.Repeat("x", 200)}))
	var tooBig *pgproto3.ExceededMaxBodyLenErr
	if _, err := s.Backend.Receive(); !errors.As(err, &tooBig) {
		t.Errorf("Receive of a 200-byte query: %v, want ExceededMaxBodyLenErr", err)
	}
}

// TestHandshakeRandomBytes: garbage from a client is an error, never a
// panic or a hang, with or without SCRAM.
func TestHandshakeRandomBytes(t *testing.T) {
	users := testUsers(t)
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := [][]byte{
		nil,
		codePacket(sslRequestCode),
		startupPacket(pgproto3.ProtocolVersion30, "user", "alice"),
		cat(startupPacket(pgproto3.ProtocolVersion30, "user", "alice"), []byte{'p'}),
	}
	for i := range 400 {
		data := make([]byte, rng.IntN(300))
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		data = cat(prefixes[i%len(prefixes)], data)
		if s, err := handshakeBytes(t, data, users); err == nil {
			t.Errorf("Handshake accepted random bytes %x: %+v", data, s)
		}
	}
}

// FuzzHandshake feeds arbitrary bytes to Handshake as a client.
func FuzzHandshake(f *testing.F) {
	alice := startupPacket(pgproto3.ProtocolVersion30, "user", "alice", "database", "shop")
	f.Add(alice)
	f.Add(cat(codePacket(sslRequestCode), alice))
	f.Add(codePacket(cancelRequestCode, 0, 0, 0, 1, 0, 0, 0, 2))
	f.Add(startupPacket(pgproto3.ProtocolVersion32, "user", "bob", "_pq_.x", "1"))
	f.Add(cat(alice, encode(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte("n,,n=,r=abc")}),
		encode(&pgproto3.SASLResponse{Data: []byte("c=biws,r=abc,p=AAAA")})))
	f.Add(binary.BigEndian.AppendUint32(nil, 1<<30))
	users := testUsers(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		handshakeBytes(t, data, users)
	})
}

// handshakeBytes runs Handshake on a connection that reads data and then
// ends, and fails t if it takes more than a few seconds.
func handshakeBytes(t *testing.T, data []byte, users *Users) (*Startup, error) {
	t.Helper()
	done := make(chan handshakeResult, 1)
	go func() {
		s, err := Handshake(context.Background(), &bytesConn{r: bytes.NewReader(data)}, StartupConfig{Users: users})
		done <- handshakeResult{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-time.After(5 * time.Second):
		t.Fatalf("Handshake did not return on %x", data)
		return nil, nil
	}
}

// bytesConn is a client that sends a fixed byte string and then closes.
type bytesConn struct {
	net.Conn // not used by Handshake
	r        *bytes.Reader
}

func (c *bytesConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *bytesConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *bytesConn) SetDeadline(time.Time) error      { return nil }
func (c *bytesConn) SetReadDeadline(time.Time) error  { return nil }
func (c *bytesConn) SetWriteDeadline(time.Time) error { return nil }

// TestSCRAMMockSaltShared: two proxies of a deployment (two Users with its
// secret) show one salt for an unknown user, and the iteration count of the
// real users, so neither tells which names exist.
func TestSCRAMMockSaltShared(t *testing.T) {
	v, err := deriveVerifier("pw", []byte("0123456789abcdef"), 8192)
	if err != nil {
		t.Fatal(err)
	}
	file := "carol " + v.String() + " *\ndave " + v.String() + " *\n"
	proxyA, _ := parseUsers("users", strings.NewReader(file))
	proxyB, _ := parseUsers("users", strings.NewReader(file))
	other, _ := parseUsers("users", strings.NewReader(file))
	secret := []byte("a deployment's secret, 32 bytes.")
	proxyA.SetMockSecret(secret)
	proxyB.SetMockSecret(secret)
	other.SetMockSecret([]byte("another deployment's secret 32b."))
	a, b := proxyA.mockVerifier("ghost"), proxyB.mockVerifier("ghost")
	if !bytes.Equal(a.salt, b.salt) {
		t.Errorf("two proxies of one deployment show salts %x and %x for one unknown user", a.salt, b.salt)
	}
	if c := other.mockVerifier("ghost"); bytes.Equal(a.salt, c.salt) {
		t.Error("another deployment shows the same salt")
	}
	if a.iterations != 8192 {
		t.Errorf("unknown user's iterations %d, want the real users' 8192", a.iterations)
	}
}
