package proxy

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/lattice-db/lattice/sqlstate"
)

// TestSCRAMRFC7677 runs the example exchange of RFC 7677 section 3.
func TestSCRAMRFC7677(t *testing.T) {
	salt, _ := base64.StdEncoding.DecodeString("W22ZaJ0SNY7soEsUEjb6gQ==")
	v, err := deriveVerifier("pencil", salt, 4096)
	if err != nil {
		t.Fatal(err)
	}
	const (
		clientFirst = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
		serverNonce = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
		serverFirst = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
		clientFinal = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
		serverFinal = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
	)
	x := scramExchange{verifier: v}
	got, err := x.first(clientFirst, serverNonce)
	if err != nil || got != serverFirst {
		t.Fatalf("first = %q, %v; want %q", got, err, serverFirst)
	}
	snapshot := x
	got, proved, err := x.final(clientFinal)
	if err != nil || !proved || got != serverFinal {
		t.Fatalf("final = %q, %v, %v; want %q, true", got, proved, err, serverFinal)
	}

	// Another proof of the right length and form is well-formed but wrong.
	x = snapshot
	wrong := strings.Replace(clientFinal, "p=dHzb", "p=dHzc", 1)
	if _, proved, err := x.final(wrong); err != nil || proved {
		t.Errorf("final with a wrong proof = %v, %v; want false, nil", proved, err)
	}
}

func TestSCRAMMalformed(t *testing.T) {
	v, err := deriveVerifier("pencil", []byte("0123456789abcdef"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	proof := base64.StdEncoding.EncodeToString(make([]byte, 32))
	const ok = ""
	firsts := []struct{ msg, code string }{
		{"n,,n=,r=abc", ok},
		{"y,,n=,r=abc", ok},
		{"n,,n=user,r=abc,x=ext", ok},
		{"", "08P01"},
		{"n", "08P01"},
		{"n,", "08P01"},
		{"x,,n=,r=abc", "08P01"},
		{"n,n=,r=abc", "08P01"},
		{"p=tls-server-end-point,,n=,r=abc", "0A000"},
		{"n,a=admin,n=,r=abc", "0A000"},
		{"n,,m=ext,n=,r=abc", "0A000"},
		{"n,,r=abc", "08P01"},
		{"n,,n=", "08P01"},
		{"n,,n=,r=", "08P01"},
		{"n,,n=,r=a c", "08P01"},
		{"n,,n=,r=ab\x7f", "08P01"},
		{"n,,n=,r=abc,", "08P01"},
		{"n,,n=,r=abc,7=x", "08P01"},
	}
	for _, tt := range firsts {
		x := scramExchange{verifier: v}
		_, err := x.first(tt.msg, "XYZ")
		checkCode(t, "first "+tt.msg, err, tt.code)
	}

	finals := []struct{ msg, code string }{
		{"c=biws,r=abcXYZ,p=" + proof, ok},
		{"c=biws,r=abcXYZ,e=ext,p=" + proof, ok},
		{"c=eSws,r=abcXYZ,p=" + proof, "08P01"}, // y,, after n,,
		{"c=cD10bHMtc2VydmVyLWVuZC1wb2ludCws,r=abcXYZ,p=" + proof, "08P01"},
		{"c=biws,r=abc,p=" + proof, "08P01"},
		{"c=biws,r=abcXYZW,p=" + proof, "08P01"},
		{"c=biws,r=abcXYZ", "08P01"},
		{"c=biws,r=abcXYZ,p=", "08P01"},
		{"c=biws,r=abcXYZ,p=AAAA", "08P01"},
		{"c=biws,r=abcXYZ,p=" + proof[:len(proof)-1] + "!", "08P01"},
		{"c=biws,r=abcXYZ,p=" + proof + ",e=ext", "08P01"},
		{"r=abcXYZ,c=biws,p=" + proof, "08P01"},
		{"c=bi%s,r=abcXYZ,p=" + proof, "08P01"},
		{"c=biws,r=abcXYZ,,p=" + proof, "08P01"},
		{"", "08P01"},
	}
	for _, tt := range finals {
		x := scramExchange{verifier: v}
		if _, err := x.first("n,,n=,r=abc", "XYZ"); err != nil {
			t.Fatal(err)
		}
		_, proved, err := x.final(tt.msg)
		checkCode(t, "final "+tt.msg, err, tt.code)
		if proved {
			t.Errorf("final %q: a zero proof was accepted", tt.msg)
		}
	}
}

// checkCode checks err carries an *sqlstate.Error with SQLSTATE code, or is nil when
// code is empty.
func checkCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	if code == "" {
		if err != nil {
			t.Errorf("%s: %v, want success", what, err)
		}
		return
	}
	var e *sqlstate.Error
	if !errors.As(err, &e) || e.Code != code || e.Severity != "FATAL" {
		t.Errorf("%s: %v, want FATAL %s", what, err, code)
	}
}
