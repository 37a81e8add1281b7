package proxy

import (
	"crypto/pbkdf2"
	"crypto/sha256"
	"crypto/subtle"
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
		{"p=tls-server-end-point,,n=,r=abc", "08P01"}, // binding data, but SCRAM-SHA-256 chosen
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

// TestSCRAMChannelBinding runs SCRAM-SHA-256-PLUS exchanges over a
// connection whose binding data is endPoint, and the ways a client or a
// man in the middle may get it wrong: each is refused with 08P01.
func TestSCRAMChannelBinding(t *testing.T) {
	const password, nonce, serverNonce = "pencil", "abc", "XYZ"
	salt := []byte("0123456789abcdef")
	v, err := deriveVerifier(password, salt, 4096)
	if err != nil {
		t.Fatal(err)
	}
	endPoint := []byte("the hash of the proxy's certificate")
	b64 := base64.StdEncoding.EncodeToString
	// clientFinal is the final message of a client that binds to cb.
	clientFinal := func(first, serverFirst, cb string) string {
		salted, err := pbkdf2.Key(sha256.New, password, salt, 4096, sha256.Size)
		if err != nil {
			t.Fatal(err)
		}
		withoutProof := "c=" + b64([]byte(cb)) + ",r=" + nonce + serverNonce
		_, bare, _ := strings.Cut(first[strings.Index(first, ",")+1:], ",")
		clientKey := hmacSHA256(salted, "Client Key")
		stored := sha256.Sum256(clientKey)
		proof := hmacSHA256(stored[:], bare+","+serverFirst+","+withoutProof)
		subtle.XORBytes(proof, proof, clientKey)
		return withoutProof + ",p=" + b64(proof)
	}
	const plus, bound = "p=tls-server-end-point,,n=,r=" + nonce, "p=tls-server-end-point,,"
	tests := []struct {
		name      string
		endPoint  []byte // nil: no TLS
		plus      bool   // the client chose SCRAM-SHA-256-PLUS
		first, cb string
		code      string // of first or final; "" for a proved login
	}{
		{name: "bound to the proxy's certificate", endPoint: endPoint, plus: true, first: plus, cb: bound + string(endPoint)},
		{name: "TLS, but the client chose not to bind", endPoint: endPoint, first: "n,,n=,r=" + nonce, cb: "n,,"},
		{name: "no TLS", first: "n,,n=,r=" + nonce, cb: "n,,"},
		{name: "bound to another certificate (a man in the middle)", endPoint: endPoint, plus: true, first: plus, cb: bound + "the hash of another certificate", code: "08P01"},
		{name: "PLUS, without the binding data in the final message", endPoint: endPoint, plus: true, first: plus, cb: bound, code: "08P01"},
		{name: "PLUS, with the gs2 header of SCRAM-SHA-256", endPoint: endPoint, plus: true, first: plus, cb: "n,," + string(endPoint), code: "08P01"},
		{name: "PLUS with flag n", endPoint: endPoint, plus: true, first: "n,,n=,r=" + nonce, code: "08P01"},
		{name: "PLUS with flag y", endPoint: endPoint, plus: true, first: "y,,n=,r=" + nonce, code: "08P01"},
		{name: "PLUS with another binding type", endPoint: endPoint, plus: true, first: "p=tls-unique,,n=,r=" + nonce, code: "08P01"},
		// A relay that removed -PLUS from the offer: the final message
		// would be right, so only the first can tell.
		{name: "downgrade: flag y over TLS", endPoint: endPoint, first: "y,,n=,r=" + nonce, cb: "y,,", code: "08P01"},
		{name: "binding data with SCRAM-SHA-256", endPoint: endPoint, first: plus, code: "08P01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := scramExchange{verifier: v, endPoint: tt.endPoint, plus: tt.plus}
			serverFirst, err := x.first(tt.first, serverNonce)
			if err != nil {
				checkCode(t, "first", err, tt.code)
				return
			}
			_, proved, err := x.final(clientFinal(tt.first, serverFirst, tt.cb))
			checkCode(t, "final", err, tt.code)
			if proved != (tt.code == "") {
				t.Errorf("proved = %v", proved)
			}
		})
	}
}
