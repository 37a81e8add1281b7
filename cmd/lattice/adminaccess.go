package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	"github.com/lattice-db/lattice/admin"
)

// maxAllowedHosts bounds --admin-allowed-hosts.
const maxAllowedHosts = 64

// adminAccess is who may use the admin endpoint, and its TLS when asked
// for. Without a token the endpoint must be on loopback: anyone who can
// reach it could start reshards.
func adminAccess(cfg serveConfig) (*admin.Access, *tls.Config, error) {
	token, err := adminToken(cfg.AdminTokenFile)
	if err != nil {
		return nil, nil, err
	}
	if token == "" && !loopback(cfg.Admin) {
		return nil, nil, fmt.Errorf("--admin %s is not a loopback address and no admin token is configured, so anyone who reaches it could start reshards: "+
			"give --admin-token-file FILE (or $%s), or listen on 127.0.0.1", cfg.Admin, adminTokenEnv)
	}
	a := &admin.Access{Token: token}
	for _, h := range strings.Split(cfg.AdminAllowedHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			a.Hosts = append(a.Hosts, h)
		}
	}
	if len(a.Hosts) > maxAllowedHosts {
		return nil, nil, fmt.Errorf("--admin-allowed-hosts: more than %d names", maxAllowedHosts)
	}
	var tc *tls.Config
	switch {
	case cfg.AdminTLSCert == "" && cfg.AdminTLSKey == "":
	case cfg.AdminTLSCert == "" || cfg.AdminTLSKey == "":
		return nil, nil, errors.New("give both --admin-tls-cert and --admin-tls-key")
	default:
		pair, err := tls.LoadX509KeyPair(cfg.AdminTLSCert, cfg.AdminTLSKey)
		if err != nil {
			return nil, nil, fmt.Errorf("admin TLS certificate: %w", err)
		}
		tc = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
		a.Secure = true
	}
	return a, tc, nil
}
