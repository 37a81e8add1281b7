package integration

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestChannelBinding: over TLS the proxy offers SCRAM-SHA-256-PLUS, so psql
// and pgx log in with channel_binding=require; and a man in the middle that
// ends the client's TLS with a certificate of its own and relays the
// exchange to the proxy is refused, since the client binds to the
// certificate it saw (issue 17, SCRAM). Without binding that same relay
// logs in, which shows the refusal is the binding's.
func TestChannelBinding(t *testing.T) {
	cert, key, _ := testCerts(t)
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte(runLattice(t, "passwd alice lattice", "alice-pw")), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, 1, "--tls-cert", cert, "--tls-key", key, "--users-file", users)
	mitm := startRelay(t, p.Addr)
	dsn := func(addr, mode string) string {
		return fmt.Sprintf("postgres://alice:alice-pw@%s/lattice?sslmode=require&%s", addr, mode)
	}
	tests := []struct {
		name, addr, mode string
		ok               bool
	}{
		{"require", p.Addr, "channel_binding=require", true},
		{"man in the middle, binding required", mitm, "channel_binding=require", false},
		{"man in the middle, binding preferred", mitm, "channel_binding=prefer", false},
		{"man in the middle, no binding", mitm, "channel_binding=disable", true},
	}
	for _, tt := range tests {
		t.Run("pgx "+tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c, err := pgx.Connect(ctx, dsn(tt.addr, tt.mode))
			if !tt.ok {
				if pgCode(err) != "08P01" || !strings.Contains(fmt.Sprint(err), "channel binding") {
					t.Fatalf("connect through a relay with its own certificate: %v, want 08P01 and the channel binding check", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			var one int
			if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Fatalf("SELECT 1: %d, %v", one, err)
			}
		})
		t.Run("psql "+tt.name, func(t *testing.T) {
			out, err := exec.Command("psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", dsn(tt.addr, tt.mode), "-At", "-c", "SELECT 1").CombinedOutput()
			if !tt.ok {
				if err == nil || !strings.Contains(string(out), "channel binding") {
					t.Fatalf("psql through a relay with its own certificate: %v\n%s", err, out)
				}
				return
			}
			if err != nil || strings.TrimSpace(string(out)) != "1" {
				t.Fatalf("psql: %v\n%s", err, out)
			}
		})
	}
}

// startRelay listens for PostgreSQL clients, ends their TLS with a
// certificate of another authority, and relays what they send over TLS of
// its own to upstream: a man in the middle the client does not verify
// (sslmode=require).
func startRelay(t *testing.T, upstream string) string {
	t.Helper()
	cert, key, _ := testCerts(t)
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	sslRequest := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 8), 80877103)
	relay := func(client net.Conn) {
		defer client.Close()
		client.SetDeadline(time.Now().Add(20 * time.Second))
		req := make([]byte, 8)
		if _, err := io.ReadFull(client, req); err != nil || string(req) != string(sslRequest) {
			return
		}
		if _, err := client.Write([]byte{'S'}); err != nil {
			return
		}
		front := tls.Server(client, &tls.Config{Certificates: []tls.Certificate{pair}})
		server, err := net.Dial("tcp", upstream)
		if err != nil {
			return
		}
		defer server.Close()
		server.SetDeadline(time.Now().Add(20 * time.Second))
		answer := make([]byte, 1)
		if _, err := server.Write(sslRequest); err != nil {
			return
		}
		if _, err := io.ReadFull(server, answer); err != nil || answer[0] != 'S' {
			return
		}
		back := tls.Client(server, &tls.Config{InsecureSkipVerify: true})
		done := make(chan struct{}, 2)
		go func() { io.Copy(back, front); done <- struct{}{} }()
		go func() { io.Copy(front, back); done <- struct{}{} }()
		<-done
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go relay(c)
		}
	}()
	return ln.Addr().String()
}
