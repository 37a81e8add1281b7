package main

import (
	"crypto/tls"
	"errors"
	"fmt"
)

// clientTLS loads the certificate offered to clients. Without one, TLS is
// not offered and --tls-required has nothing to require.
func clientTLS(cert, key string, required bool) (*tls.Config, error) {
	switch {
	case cert == "" && key == "":
		if required {
			return nil, errors.New("--tls-required needs --tls-cert and --tls-key")
		}
		return nil, nil
	case cert == "" || key == "":
		return nil, errors.New("give both --tls-cert and --tls-key")
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS12,
		// libpq 17 and later name the protocol in ALPN.
		NextProtos: []string{"postgresql"},
	}, nil
}
