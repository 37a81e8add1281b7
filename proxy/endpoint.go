package proxy

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"

	// The hashes a certificate's signature may name.
	_ "crypto/sha256"
	_ "crypto/sha512"
)

// SCRAM-SHA-256-PLUS binds the exchange to the TLS connection with
// tls-server-end-point (RFC 5929, section 4.1): the hash of the certificate
// the server presented, with the hash function of the certificate's
// signature, SHA-256 in place of MD5 and SHA-1. The certificate is the one
// this connection's handshake chose, recorded as it is chosen.

// recordCertificate returns a copy of cfg that stores in *chosen the
// certificate it presents, chosen as crypto/tls would from cfg: by its
// GetCertificate when there are no Certificates or the client named a
// server, else the first of Certificates that the client supports, else
// the first.
func recordCertificate(cfg *tls.Config, chosen **tls.Certificate) *tls.Config {
	c := cfg.Clone()
	get := cfg.GetCertificate
	// Without Certificates crypto/tls always asks GetCertificate.
	c.Certificates = nil
	c.GetCertificate = func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		cert, err := pickCertificate(cfg, get, hello)
		*chosen = cert
		return cert, err
	}
	return c
}

func pickCertificate(cfg *tls.Config, get func(*tls.ClientHelloInfo) (*tls.Certificate, error), hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if get != nil && (len(cfg.Certificates) == 0 || hello.ServerName != "") {
		if cert, err := get(hello); cert != nil || err != nil {
			return cert, err
		}
	}
	if len(cfg.Certificates) == 0 {
		return nil, errors.New("no TLS certificate configured")
	}
	for i := range cfg.Certificates {
		if hello.SupportsCertificate(&cfg.Certificates[i]) == nil {
			return &cfg.Certificates[i], nil
		}
	}
	return &cfg.Certificates[0], nil
}

// endPointBinding is cert's tls-server-end-point binding data, or nil when
// its signature names no hash the binding can use (Ed25519): then
// SCRAM-SHA-256-PLUS is not offered, where PostgreSQL would fail the login.
func endPointBinding(cert *tls.Certificate) []byte {
	if cert == nil || len(cert.Certificate) == 0 {
		return nil
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil
		}
	}
	var h crypto.Hash
	switch leaf.SignatureAlgorithm {
	case x509.MD5WithRSA, x509.SHA1WithRSA, x509.DSAWithSHA1, x509.ECDSAWithSHA1,
		x509.SHA256WithRSA, x509.SHA256WithRSAPSS, x509.DSAWithSHA256, x509.ECDSAWithSHA256:
		h = crypto.SHA256
	case x509.SHA384WithRSA, x509.SHA384WithRSAPSS, x509.ECDSAWithSHA384:
		h = crypto.SHA384
	case x509.SHA512WithRSA, x509.SHA512WithRSAPSS, x509.ECDSAWithSHA512:
		h = crypto.SHA512
	default:
		return nil
	}
	d := h.New()
	d.Write(leaf.Raw)
	return d.Sum(nil)
}
