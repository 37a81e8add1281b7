package proxy

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"testing"
	"time"
)

// TestEndPointBinding: the binding data is the certificate's hash with its
// signature's hash function, SHA-256 for SHA-1 and MD5 (RFC 5929), and none
// for a signature that names no hash.
func TestEndPointBinding(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		key  crypto.Signer
		alg  x509.SignatureAlgorithm
		hash crypto.Hash // 0: no binding
	}{
		{"RSA SHA-256", rsaKey, x509.SHA256WithRSA, crypto.SHA256},
		{"RSA-PSS SHA-512", rsaKey, x509.SHA512WithRSAPSS, crypto.SHA512},
		{"ECDSA SHA-384", ecKey, x509.ECDSAWithSHA384, crypto.SHA384},
		{"ECDSA SHA-512", ecKey, x509.ECDSAWithSHA512, crypto.SHA512},
		{"Ed25519", edKey, x509.PureEd25519, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), SignatureAlgorithm: tt.alg}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, tt.key.Public(), tt.key)
			if err != nil {
				t.Fatal(err)
			}
			got := endPointBinding(&tls.Certificate{Certificate: [][]byte{der}})
			if tt.hash == 0 {
				if got != nil {
					t.Fatalf("binding data %x for a signature without a hash", got)
				}
				return
			}
			h := tt.hash.New()
			h.Write(der)
			if want := h.Sum(nil); !bytes.Equal(got, want) {
				t.Fatalf("binding data %x, want %x", got, want)
			}
		})
	}
}
