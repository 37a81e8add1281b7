package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/lattice-db/lattice/pgshard"
)

// Secrets come from files or the environment, never from argv, which every
// local user can read in /proc/PID/cmdline.

// Environment variables read directly: they are not flags, so that no
// secret can be given on the command line.
const (
	adminTokenEnv = "LATTICE_ADMIN_TOKEN"
	redisURLEnv   = "LATTICE_REDIS_URL"
)

// minTokenLen keeps guessable tokens out: 16 bytes is 128 bits of hex.
const minTokenLen = 16

// maxSecretFile bounds a secret file: a token or a URL.
const maxSecretFile = 64 << 10

// readSecretFile reads a file holding one secret, without its surrounding
// white space.
func readSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if len(b) > maxSecretFile {
		return "", fmt.Errorf("%s: longer than %d bytes", path, maxSecretFile)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// fromFileOrEnv is the secret in file when it is given, else in the
// environment variable env, else "". The variable is removed from the
// environment so that the processes the proxy starts (the demo's nodes)
// do not inherit it.
func fromFileOrEnv(file, env string) (string, error) {
	v, inEnv := os.LookupEnv(env)
	if inEnv {
		os.Unsetenv(env)
	}
	if file != "" {
		return readSecretFile(file)
	}
	return strings.TrimSpace(v), nil
}

// adminToken is the admin endpoint's token, or "" when none is configured.
func adminToken(file string) (string, error) {
	tok, err := fromFileOrEnv(file, adminTokenEnv)
	if err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	if tok != "" && len(tok) < minTokenLen {
		return "", fmt.Errorf("admin token: shorter than %d characters; make one with: openssl rand -hex 32", minTokenLen)
	}
	return tok, nil
}

// loadRedisURL is --redis, else the URL in --redis-url-file, else
// $LATTICE_REDIS_URL; "" runs the embedded server.
func loadRedisURL(flagValue, file string) (string, error) {
	if flagValue != "" && file != "" {
		return "", errors.New("give --redis or --redis-url-file, not both")
	}
	if flagValue != "" {
		return flagValue, nil
	}
	u, err := fromFileOrEnv(file, redisURLEnv)
	if err != nil {
		return "", fmt.Errorf("redis url: %w", err)
	}
	return u, nil
}

// nodesFile reads NAME=DSN lines (blank lines and # comments skipped), for
// DSNs that must not be in argv.
func nodesFile(path string, into *nodeFlags) error {
	s, err := readSecretFile(path)
	if err != nil {
		return fmt.Errorf("nodes file: %w", err)
	}
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, dsn, ok := strings.Cut(line, "=")
		if !ok || name == "" || dsn == "" {
			return fmt.Errorf("nodes file %s, line %d: want NAME=DSN", path, i+1)
		}
		*into = append(*into, pgshard.Node{Name: strings.TrimSpace(name), DSN: strings.TrimSpace(dsn)})
	}
	return nil
}
