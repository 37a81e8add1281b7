package proxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Verifiers PostgreSQL 15 stored for these passwords (SELECT rolpassword
// FROM pg_authid), to check the users file takes them as they are.
const (
	pgVerifierPasswort = "SCRAM-SHA-256$4096:LaYcrTJ32EEb14mOxGJ+JA==$sttAWVpnw0LveH4i94YjkjdlSsgeM+dUjlZ5c4rXNoQ=:5UtriWcqxZhGBV5C8nSsJr8Il4/SikukqOGVJS2BXkI="
	pgVerifierPencil   = "SCRAM-SHA-256$4096:S+vao+86LFiUdPxelSrx7w==$zwpaVuqBKQIb9IAmXM3Ac81QL59qtAgfBt838hv7WhU=:9aPAnyQE/TFayrCEF048xAF0uN26U/B/D94/J5HwK0k="
)

func writeUsers(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadUsers(t *testing.T) {
	path := writeUsers(t, "# lattice users\n\n"+
		"alice "+pgVerifierPencil+" shop,stats\r\n"+
		"   # indented comment\n"+
		"bob\t"+pgVerifierPasswort+"\t*\n")
	users, err := LoadUsers(path)
	if err != nil {
		t.Fatal(err)
	}
	alice, ok := users.Lookup("alice")
	if !ok || alice.Name != "alice" {
		t.Fatalf("Lookup(alice) = %v, %v", alice, ok)
	}
	if alice.verifier.String() != pgVerifierPencil {
		t.Errorf("alice's verifier = %s, want %s", alice.verifier, pgVerifierPencil)
	}
	for tenant, want := range map[string]bool{"shop": true, "stats": true, "billing": false, "": false, "Shop": false} {
		if got := alice.Allows(tenant); got != want {
			t.Errorf("alice.Allows(%q) = %v, want %v", tenant, got, want)
		}
	}
	bob, ok := users.Lookup("bob")
	if !ok || !bob.Allows("anything") {
		t.Errorf("bob with * is not allowed every tenant")
	}
	if _, ok := users.Lookup("carol"); ok {
		t.Error("Lookup(carol) found a user not in the file")
	}
}

func TestLoadUsersErrors(t *testing.T) {
	v := pgVerifierPencil
	tests := []struct {
		name, content, want string
	}{
		{"two fields", "alice " + v, ":1: want 3 fields"},
		{"trailing comment", "alice " + v + " shop # main", ":1: want 3 fields"},
		{"duplicate", "alice " + v + " a\n\nalice " + v + " b", `:3: user "alice" is listed twice`},
		{"md5", "alice md5a3556571e93b0d20722ba62be61e8c2d shop", ":1: user \"alice\": md5 password hashes are not supported"},
		{"plain password", "alice hunter2 shop", "must have the form"},
		{"missing keys", "alice SCRAM-SHA-256$4096:S+vao+86LFiUdPxelSrx7w== shop", "must have the form"},
		{"zero iterations", "alice " + strings.Replace(v, "$4096:", "$0:", 1) + " shop", "invalid iteration count"},
		{"bad salt", "alice " + strings.Replace(v, "S+vao", "S!vao", 1) + " shop", "invalid salt"},
		{"short StoredKey", "alice " + strings.Replace(v, "zwpaVuqBKQIb9IAmXM3Ac81QL59qtAgfBt838hv7WhU=", "zwpa", 1) + " shop", "invalid StoredKey"},
		{"bad ServerKey", "alice " + v[:len(v)-4] + " shop", "invalid ServerKey"},
		{"empty tenant", "alice " + v + " shop,,stats", "tenants must be"},
		{"star in list", "alice " + v + " shop,*", "tenants must be"},
		{"line numbers count comments", "# a\n\n# b\nalice " + v, ":4: want 3 fields"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeUsers(t, tt.content)
			_, err := LoadUsers(path)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), path+":") {
				t.Fatalf("LoadUsers: %v, want an error with %q prefixed by the path", err, tt.want)
			}
			if strings.Contains(err.Error(), "S+vao") || strings.Contains(err.Error(), "zwpa") {
				t.Errorf("error quotes the verifier: %v", err)
			}
		})
	}
	if _, err := LoadUsers(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("LoadUsers of a missing file succeeded")
	}
}

func TestNewVerifier(t *testing.T) {
	s, err := NewVerifier("correct horse")
	if err != nil {
		t.Fatal(err)
	}
	v, err := parseVerifier(s)
	if err != nil {
		t.Fatalf("NewVerifier made %q, which does not parse: %v", s, err)
	}
	if v.iterations != 4096 || len(v.salt) != 16 {
		t.Errorf("iterations %d, salt %d bytes; want 4096 and 16", v.iterations, len(v.salt))
	}
	again, err := deriveVerifier("correct horse", v.salt, v.iterations)
	if err != nil || again.String() != s {
		t.Errorf("deriving again with the same salt gives %s, %v; want %s", again, err, s)
	}
	if s2, _ := NewVerifier("correct horse"); s2 == s {
		t.Error("two verifiers of one password share a salt")
	}
	if _, err := NewVerifier(""); err == nil {
		t.Error("NewVerifier accepted an empty password")
	}
}

// TestVerifierMatchesPostgreSQL checks the derivation and the password
// normalization against verifiers PostgreSQL 15 made.
func TestVerifierMatchesPostgreSQL(t *testing.T) {
	tests := []struct {
		password   string
		pg         string // PostgreSQL's verifier of password
		stable     bool   // NewVerifier accepts it as is
		normalized string // when not: the string PostgreSQL hashed
	}{
		{"pencil", pgVerifierPencil, true, ""},
		{"pässwörd", pgVerifierPasswort, true, ""},
		// SASLprep gives up on code points Unicode 3.2 had not assigned
		// and hashes the password unchanged.
		{"café😀", "SCRAM-SHA-256$4096:0FqnogXGzeQL8Ywp/f5xxw==$g5XaU2f5JVR6DTMOZ15I5AT4bfSci/bfIVGn0Bw64Y4=:c53PVwXlnfn1Khg/Mz72DNBdjdw6Uqd5SRamhcDOms4=", true, ""},
		// Decomposed ä: SASLprep composes it.
		{"pa\u0308sswörd", "SCRAM-SHA-256$4096:39OCVcMJeipL7nZGFGtNPA==$SHIlNs/h7bUK1TxoXyh5Uxc8JVdNcN+49rm8pgyVkVQ=:8aFvbmHxImXBHeuXppBMh2fvLdH0413okqGQoAGl6l8=", false, "pässwörd"},
		// Soft hyphen: SASLprep deletes it.
		{"soft\u00adhyphen", "SCRAM-SHA-256$4096:+y+ya/BQRig4JFflJhxffA==$PTqO3VEnlkfQGP+zwjFbfjHltgiuz+gIwOv0CU3GB8M=:WUtWbzFwL84gHtRSFM7Kfma7bchIq31YX2W2T0rSzoQ=", false, "softhyphen"},
	}
	for _, tt := range tests {
		pg, err := parseVerifier(tt.pg)
		if err != nil {
			t.Fatalf("%q: %v", tt.password, err)
		}
		if got := saslprepStable(tt.password); got != tt.stable {
			t.Errorf("saslprepStable(%q) = %v, want %v", tt.password, got, tt.stable)
		}
		hashed := tt.password
		if !tt.stable {
			if _, err := NewVerifier(tt.password); err == nil {
				t.Errorf("NewVerifier(%q) succeeded; clients would not match it", tt.password)
			}
			hashed = tt.normalized
		}
		v, err := deriveVerifier(hashed, pg.salt, pg.iterations)
		if err != nil || v.String() != tt.pg {
			t.Errorf("verifier of %q = %s, %v; PostgreSQL made %s", hashed, v, err, tt.pg)
		}
	}
	if saslprepStable("a\u00a0b") {
		t.Error("saslprepStable accepted a no-break space, which SASLprep maps to a space")
	}
}
