package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Real network partitions for the fault tests. Each proxy under test runs
// in a network namespace of its own, joined by a veth pair to a bridge on
// the host; the fault cluster's nodes and redis-server also listen on the
// bridge's address. A partition is iptables rules inside one namespace, so
// it cuts that proxy alone, in one direction or both. This kernel has no
// netem qdisc, so loss is iptables' statistic match and delay a tbf rate
// limit.

// netID keeps the bridge, namespaces and subnet of one test process apart
// from another's, so two worktrees can run partition tests at once:
// LATTICE_NETNS_ID (0-249) picks it, else the process id does.
var netID = func() int {
	if v, err := strconv.Atoi(os.Getenv("LATTICE_NETNS_ID")); err == nil && v >= 0 && v < 250 {
		return v
	}
	return os.Getpid() % 250
}()

var (
	netBridge = fmt.Sprintf("lt%d-br", netID)
	netPrefix = fmt.Sprintf("10.231.%d.", netID)
	netHostIP = netPrefix + "1" // the host on the bridge: nodes and redis
)

// netNS is one namespace on the bridge.
type netNS struct {
	name, veth, ip string
	// dropped is how many packets the rules of the last healed partition
	// dropped: proof that it cut something.
	dropped int
}

var netOnce sync.Mutex

// requireNetNS skips the test unless it runs as root with ip and iptables
// and can make a namespace.
func requireNetNS(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network partitions need root (network namespaces, veth, iptables)")
	}
	for _, tool := range []string{"ip", "iptables", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("network partitions need %s (apt-get install -y iproute2 iptables)", tool)
		}
	}
	probe := fmt.Sprintf("lt%d-probe", netID)
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		t.Skipf("network namespaces unavailable: %v: %s", err, out)
	}
	_ = exec.Command("ip", "netns", "del", probe).Run()
}

func sh(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// setupBridge creates the bridge with the host's address, removed when the
// test ends.
func setupBridge(t *testing.T) {
	t.Helper()
	netOnce.Lock()
	t.Cleanup(netOnce.Unlock) // one partition test at a time owns the bridge
	_ = exec.Command("ip", "link", "del", netBridge).Run()
	sh(t, "ip", "link", "add", netBridge, "type", "bridge")
	sh(t, "ip", "addr", "add", netHostIP+"/24", "dev", netBridge)
	sh(t, "ip", "link", "set", netBridge, "up")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", netBridge).Run() })
}

// newNetNS makes namespace i (1..200) on the bridge, removed when the
// test ends.
func newNetNS(t *testing.T, i int) *netNS {
	t.Helper()
	n := &netNS{name: fmt.Sprintf("lt%d-ns%d", netID, i), veth: fmt.Sprintf("lt%d-v%d", netID, i), ip: netPrefix + strconv.Itoa(10+i)}
	_ = exec.Command("ip", "netns", "del", n.name).Run()
	_ = exec.Command("ip", "link", "del", n.veth).Run()
	sh(t, "ip", "netns", "add", n.name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", n.name).Run()
		_ = exec.Command("ip", "link", "del", n.veth).Run()
	})
	sh(t, "ip", "link", "add", n.veth, "type", "veth", "peer", "name", "eth0", "netns", n.name)
	sh(t, "ip", "link", "set", n.veth, "master", netBridge)
	sh(t, "ip", "link", "set", n.veth, "up")
	n.exec(t, "ip", "addr", "add", n.ip+"/24", "dev", "eth0")
	n.exec(t, "ip", "link", "set", "eth0", "up")
	n.exec(t, "ip", "link", "set", "lo", "up")
	return n
}

// exec runs a command inside the namespace.
func (n *netNS) exec(t *testing.T, args ...string) {
	t.Helper()
	sh(t, append([]string{"ip", "netns", "exec", n.name}, args...)...)
}

// Directions of a partition, seen from the namespace.
const (
	cutOut  = "out"  // what the namespace sends to the port is dropped
	cutIn   = "in"   // what the port sends back is dropped
	cutBoth = "both" // both
)

// cut drops the namespace's TCP traffic with the host's port, in dir,
// until heal is called (or the test ends).
func (n *netNS) cut(t *testing.T, port int, dir string) (heal func()) {
	t.Helper()
	p := strconv.Itoa(port)
	var rules [][]string
	if dir == cutOut || dir == cutBoth {
		rules = append(rules, []string{"OUTPUT", "-p", "tcp", "-d", netHostIP, "--dport", p, "-j", "DROP"})
	}
	if dir == cutIn || dir == cutBoth {
		rules = append(rules, []string{"INPUT", "-p", "tcp", "-s", netHostIP, "--sport", p, "-j", "DROP"})
	}
	return n.rules(t, rules)
}

// lossy drops each packet between the namespace and the host's ports with
// probability p, both ways, until heal is called.
func (n *netNS) lossy(t *testing.T, p float64, ports ...int) (heal func()) {
	t.Helper()
	prob := strconv.FormatFloat(p, 'f', 3, 64)
	stat := []string{"-m", "statistic", "--mode", "random", "--probability", prob, "-j", "DROP"}
	var rules [][]string
	for _, port := range ports {
		ps := strconv.Itoa(port)
		rules = append(rules, append([]string{"OUTPUT", "-p", "tcp", "-d", netHostIP, "--dport", ps}, stat...),
			append([]string{"INPUT", "-p", "tcp", "-s", netHostIP, "--sport", ps}, stat...))
	}
	return n.rules(t, rules)
}

// throttle limits what the namespace sends to rate (tc tbf), which delays
// it by the queue, until heal is called.
func (n *netNS) throttle(t *testing.T, rate string) (heal func()) {
	t.Helper()
	n.exec(t, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "16kbit", "latency", "400ms")
	var once sync.Once
	heal = func() {
		once.Do(func() {
			_ = exec.Command("ip", "netns", "exec", n.name, "tc", "qdisc", "del", "dev", "eth0", "root").Run()
		})
	}
	t.Cleanup(heal)
	return heal
}

func (n *netNS) rules(t *testing.T, rules [][]string) (heal func()) {
	t.Helper()
	for _, r := range rules {
		n.exec(t, append([]string{"iptables", "-A"}, r...)...)
	}
	var once sync.Once
	heal = func() {
		once.Do(func() {
			n.dropped = n.droppedPackets()
			for _, r := range rules {
				_ = exec.Command("ip", append([]string{"netns", "exec", n.name, "iptables", "-D"}, r...)...).Run()
			}
		})
	}
	t.Cleanup(heal)
	return heal
}

// droppedPackets sums the packet counters of the namespace's DROP rules.
func (n *netNS) droppedPackets() int {
	total := 0
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		out, err := exec.Command("ip", "netns", "exec", n.name, "iptables", "-L", chain, "-v", "-x", "-n").Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) > 2 && f[2] == "DROP" {
				if c, err := strconv.Atoi(f[0]); err == nil {
					total += c
				}
			}
		}
	}
	return total
}

// exposeToNetNS makes the fault cluster's nodes and redis-server accept
// the namespaces on the bridge: the nodes listen on the host's bridge
// address too (restarted) and trust the bridge's subnet, as they trust
// loopback; redis binds there too.
func (fc *faultCluster) exposeToNetNS(t *testing.T, ctx context.Context) {
	t.Helper()
	for i, p := range fc.nodes {
		hba, err := os.OpenFile(filepath.Join(p.Dir, "pg_hba.conf"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = hba.WriteString("host all all " + netPrefix + "0/24 trust\nhost replication all " + netPrefix + "0/24 trust\n")
		hba.Close()
		if err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, fc.nodeDSN(i))
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, "ALTER SYSTEM SET listen_addresses = '127.0.0.1,"+netHostIP+"'")
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Restart(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rdb, err := redisClient(fc.redis.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	for _, kv := range [][2]string{{"protected-mode", "no"}, {"bind", "127.0.0.1 " + netHostIP}} {
		if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatalf("redis CONFIG SET %s: %v", kv[0], err)
		}
	}
}

// nodePort and redisPort are the host ports a partition cuts.
func (fc *faultCluster) nodePort(i int) int { return fc.nodes[i].Port }

func (fc *faultCluster) redisPort(t *testing.T) int {
	t.Helper()
	addr := strings.TrimPrefix(fc.redis.URL(), "redis://")
	addr, _, _ = strings.Cut(addr, "/")
	_, p, _ := strings.Cut(addr, ":")
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("redis port of %s: %v", fc.redis.URL(), err)
	}
	return port
}

// proxyIn starts `lattice serve` inside ns over the cluster, reaching the
// nodes and redis at the host's bridge address. It listens on the
// namespace's address, so it needs a users file: the clients connect as
// user "lt" with password "lt-pw" (proxyInDSN).
func (fc *faultCluster) proxyIn(t *testing.T, ns *netNS, users string, args ...string) *proxyProc {
	t.Helper()
	dsns := make([]string, len(fc.nodes))
	for i, p := range fc.nodes {
		dsns[i] = fmt.Sprintf("postgres://lattice@%s:%d/lattice?sslmode=disable&connect_timeout=3", netHostIP, p.Port)
	}
	redisURL := fmt.Sprintf("redis://%s:%d/0", netHostIP, fc.redisPort(t))
	return startProxyAt(t, ns.ip, []string{"ip", "netns", "exec", ns.name}, redisURL, dsns, nil,
		append([]string{"--users-file", users}, args...)...)
}

// netUsers writes the users file of proxyIn's proxies.
func netUsers(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(path, []byte(runLattice(t, "passwd lt lattice", "lt-pw")), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// proxyInDSN is the DSN of a proxy started by proxyIn.
func proxyInDSN(p *proxyProc) string {
	return fmt.Sprintf("postgres://lt:lt-pw@%s/lattice?sslmode=disable", p.Addr)
}

// startNetPair starts a fault cluster of 3 nodes reachable from two
// network namespaces, and a proxy in each: A coordinates, B does not. It
// returns the cluster, the namespaces and a pool on each proxy.
func startNetPair(t *testing.T, ctx context.Context) (fc *faultCluster, nsA, nsB *netNS, a, b *pgxpool.Pool) {
	t.Helper()
	fc = startFaultCluster(t, 3)
	setupBridge(t)
	nsA, nsB = newNetNS(t, 1), newNetNS(t, 2)
	fc.exposeToNetNS(t, ctx)
	users := netUsers(t)
	var pools []*pgxpool.Pool
	for _, p := range []*proxyProc{fc.proxyIn(t, nsA, users), fc.proxyIn(t, nsB, users, "--coordinator=false")} {
		pool, err := pgxpool.New(ctx, proxyInDSN(p))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pools = append(pools, pool)
	}
	return fc, nsA, nsB, pools[0], pools[1]
}
