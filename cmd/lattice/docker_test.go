package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgpassfile"
	"go.yaml.in/yaml/v3"

	"github.com/lattice-db/lattice/pgshard"
	"github.com/lattice-db/lattice/proxy"
)

// The deployment in docker/ cannot be started here (no Docker engine), so
// this checks what it relies on: the services, the node and Redis settings
// the proxy needs, that every setting given to a proxy is a `lattice serve`
// flag with a value it accepts, that Prometheus scrapes both proxies'
// admin endpoints, and that the Dockerfile builds this command with cgo.

const dockerDir = "../../docker"

type composeService struct {
	Image       string            `yaml:"image"`
	Build       *composeBuild     `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
	DependsOn   any               `yaml:"depends_on"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

func readCompose(t *testing.T) map[string]composeService {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dockerDir, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return doc.Services
}

// pgSetting finds `-c name=value` in a postgres command line.
func pgSetting(cmd []string, name string) string {
	for i := 0; i+1 < len(cmd); i++ {
		if cmd[i] == "-c" {
			if k, v, ok := strings.Cut(cmd[i+1], "="); ok && k == name {
				return v
			}
		}
	}
	return ""
}

func TestComposeNodesAndRedis(t *testing.T) {
	svcs := readCompose(t)
	for _, name := range []string{"pg1", "pg2", "pg3", "redis", "proxy1", "proxy2", "prometheus"} {
		if _, ok := svcs[name]; !ok {
			t.Fatalf("compose.yaml has no service %s", name)
		}
	}
	// The settings localnode gives the test nodes (localnode/postgres.go).
	want := map[string]string{
		"wal_level":                 "logical",
		"max_replication_slots":     "64",
		"max_wal_senders":           "64",
		"max_prepared_transactions": "64",
		"max_connections":           "300",
	}
	for _, name := range []string{"pg1", "pg2", "pg3"} {
		s := svcs[name]
		if !strings.HasPrefix(s.Image, "postgres:15") {
			t.Errorf("%s runs %s, want postgres:15", name, s.Image)
		}
		for k, v := range want {
			if got := pgSetting(s.Command, k); got != v {
				t.Errorf("%s: %s = %q, want %q", name, k, got, v)
			}
		}
	}
	redis := strings.Join(svcs["redis"].Command, " ")
	if !strings.Contains(redis, "--appendonly yes") {
		t.Errorf("redis runs %q: the shard map needs the append-only file (--appendonly yes)", redis)
	}
}

// TestComposeProxies checks every proxy setting against `lattice serve`.
func TestComposeProxies(t *testing.T) {
	svcs := readCompose(t)
	for _, name := range []string{"proxy1", "proxy2"} {
		t.Run(name, func(t *testing.T) {
			s := svcs[name]
			if s.Build == nil || s.Build.Dockerfile != "docker/Dockerfile" {
				t.Fatalf("%s builds %+v, want docker/Dockerfile", name, s.Build)
			}
			if _, err := os.Stat(filepath.Join(dockerDir, s.Build.Context, s.Build.Dockerfile)); err != nil {
				t.Fatalf("build context and Dockerfile: %v", err)
			}
			if len(s.Command) == 0 || s.Command[0] != "serve" {
				t.Fatalf("%s runs %v, want serve", name, s.Command)
			}
			var cfg serveConfig
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			cfg.flags(fs)
			if err := fs.Parse(s.Command[1:]); err != nil {
				t.Fatalf("command %v: %v", s.Command, err)
			}
			for env, v := range s.Environment {
				f := fs.Lookup(strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "LATTICE_")), "_", "-"))
				if !strings.HasPrefix(env, "LATTICE_") || f == nil {
					t.Errorf("%s is not a lattice serve flag", env)
					continue
				}
				if err := f.Value.Set(v); err != nil {
					t.Errorf("%s=%q: %v", env, v, err)
				}
			}
			if len(cfg.Nodes) != 3 {
				t.Fatalf("%d nodes, want 3", len(cfg.Nodes))
			}
			for i, n := range cfg.Nodes {
				u, err := url.Parse(n.DSN)
				if err != nil {
					t.Fatalf("node %s: %v", n.Name, err)
				}
				if host := u.Hostname(); host != fmt.Sprintf("pg%d", i+1) {
					t.Errorf("node %s is on %q, want service pg%d", n.Name, host, i+1)
				}
			}
			if u, err := url.Parse(cfg.Redis); err != nil || u.Scheme != "redis" || svcs[u.Hostname()].Image == "" {
				t.Errorf("redis %q is not the compose service (%v)", cfg.Redis, err)
			}
			// Listening beyond loopback needs a users file, mounted from docker/.
			if loopback(cfg.Listen) || cfg.UsersFile == "" {
				t.Fatalf("listen %q, users file %q", cfg.Listen, cfg.UsersFile)
			}
			var local string
			for _, v := range s.Volumes {
				if src, dst, _ := strings.Cut(strings.TrimSuffix(v, ":ro"), ":"); dst == cfg.UsersFile {
					local = filepath.Join(dockerDir, src)
				}
			}
			if local == "" {
				t.Fatalf("no volume mounts %s", cfg.UsersFile)
			}
			if _, err := proxy.LoadUsers(local); err != nil {
				t.Fatalf("users file: %v", err)
			}
			// Clients reach the nodes as the tenant's role, whose password
			// the mounted pgpass file gives.
			pf, err := pgpassfile.ReadPassfile(mounted(t, s.Volumes, cfg.PgPass))
			if err != nil || pf.FindPassword("pg1", "5432", "lattice", pgshard.TenantRole("lattice")) == "" {
				t.Errorf("pgpass %q has no password for role %s (%v)", cfg.PgPass, pgshard.TenantRole("lattice"), err)
			}
			// The DSNs' user is the control role, apart from the tenant's,
			// the nodes' superuser; its password is in the pgpass file, out
			// of the environment (and so of Redis, which keeps the DSNs).
			for _, n := range cfg.Nodes {
				u, _ := url.Parse(n.DSN)
				pg := svcs[u.Hostname()].Environment
				user := u.User.Username()
				if _, has := u.User.Password(); has || user == pgshard.TenantRole("lattice") || user != pg["POSTGRES_USER"] ||
					pf == nil || pf.FindPassword(u.Hostname(), u.Port(), u.Path[1:], user) != pg["POSTGRES_PASSWORD"] {
					t.Errorf("node %s: DSN user %q (password in the DSN: %v), want the control role %q without a password, which the pgpass file gives", n.Name, user, has, pg["POSTGRES_USER"])
				}
			}
			if u, err := url.Parse(cfg.Redis); err == nil && u.User != nil {
				t.Errorf("redis URL %q carries credentials in the environment: use --redis-url-file", cfg.Redis)
			}
			// An admin endpoint beyond loopback needs a token, mounted too.
			cfg.AdminTokenFile = mounted(t, s.Volumes, cfg.AdminTokenFile)
			if _, _, err := adminAccess(cfg); err != nil {
				t.Errorf("admin access: %v", err)
			}
			if _, port, err := net.SplitHostPort(cfg.Admin); err != nil || !slices.ContainsFunc(s.Ports, func(p string) bool { return strings.HasSuffix(p, ":"+port) }) {
				t.Errorf("admin %q is not published (%v)", cfg.Admin, s.Ports)
			}
		})
	}
}

// TestPrometheusScrapesProxies checks the scrape targets against the
// proxies' admin addresses.
func TestPrometheusScrapesProxies(t *testing.T) {
	svcs := readCompose(t)
	raw, err := os.ReadFile(filepath.Join(dockerDir, "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		ScrapeConfigs []struct {
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(raw, &conf); err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, sc := range conf.ScrapeConfigs {
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("metrics path %q", sc.MetricsPath)
		}
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	for _, name := range []string{"proxy1", "proxy2"} {
		_, port, _ := net.SplitHostPort(svcs[name].Environment["LATTICE_ADMIN"])
		if want := name + ":" + port; !slices.Contains(targets, want) {
			t.Errorf("prometheus does not scrape %s (targets %v)", want, targets)
		}
	}
	mounted := slices.ContainsFunc(svcs["prometheus"].Volumes, func(v string) bool {
		return strings.HasPrefix(v, "./prometheus.yml:/etc/prometheus/prometheus.yml")
	})
	if !mounted {
		t.Errorf("prometheus.yml is not mounted: %v", svcs["prometheus"].Volumes)
	}
}

// TestDockerfile checks the image is built from this command with cgo on
// the Go release go.mod names, and that .dockerignore keeps the sources.
func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(dockerDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	df := string(raw)
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(mod))
	if goVersion == nil {
		t.Fatal("go.mod names no go version")
	}
	for _, want := range []string{
		"FROM golang:" + goVersion[1] + "-bookworm AS build",
		"CGO_ENABLED=1 go build",
		"./cmd/lattice",
		"FROM gcr.io/distroless/cc-debian12", // glibc of the builder's Debian release
		`ENTRYPOINT ["/usr/local/bin/lattice"]`,
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile has no %q", want)
		}
	}
	f, err := os.Open("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Every folder with non-test Go code may be part of the build.
	keeps := []string{"go.mod", "go.sum", "cmd"}
	sources, err := filepath.Glob("../../*/*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range sources {
		if dir := filepath.Base(filepath.Dir(src)); !strings.HasSuffix(src, "_test.go") && !slices.Contains(keeps, dir) {
			keeps = append(keeps, dir)
		}
	}
	if len(keeps) < 8 {
		t.Fatalf("found only %v", keeps)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		for _, keep := range keeps {
			if ok, _ := filepath.Match(line, keep); ok {
				t.Errorf(".dockerignore line %q leaves %s out of the build", line, keep)
			}
		}
	}
}

// mounted is the file under docker/ that volumes mount at path, or path
// when none does.
func mounted(t *testing.T, volumes []string, path string) string {
	t.Helper()
	for _, v := range volumes {
		if src, dst, _ := strings.Cut(strings.TrimSuffix(v, ":ro"), ":"); path != "" && dst == path {
			return filepath.Join(dockerDir, src)
		}
	}
	return path
}
