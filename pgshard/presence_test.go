package pgshard

import (
	"net"
	"strings"
	"testing"
	"time"
)

func TestPresenceName(t *testing.T) {
	long := strings.Repeat("a-very-long-kubernetes-pod-name-", 3)
	a, b := PresenceName("0123abcd", long+"-1"), PresenceName("0123abcd", long+"-2")
	if a == b {
		t.Fatalf("two proxies share the name %q", a)
	}
	for _, n := range []string{a, b} {
		if len(n) > 63 || !strings.HasPrefix(n, presencePrefix+"0123abcd/") {
			t.Fatalf("name %q: longer than application_name keeps, or without the deployment", n)
		}
	}
}

func TestPresenceHeldSince(t *testing.T) {
	c, err := NewCluster([]Node{{Name: "n1", DSN: "postgres://x@h1/db"}, {Name: "n2", DSN: "postgres://x@h2/db"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := NewPresence(c, "lattice proxy test/p", nil)
	t0 := time.Now()
	for _, tc := range []struct {
		name  string
		marks map[string]time.Time // zero: the session ended
		at    time.Time
		want  bool
	}{
		{"nothing open", nil, t0, false},
		{"one node of two", map[string]time.Time{"n1": t0}, t0, false},
		{"both, before the time asked", map[string]time.Time{"n2": t0.Add(-time.Second)}, t0, true},
		{"one opened after the time asked", map[string]time.Time{"n1": t0.Add(time.Second)}, t0, false},
		{"opened again, and the time asked is later", nil, t0.Add(2 * time.Second), true},
		{"one ended", map[string]time.Time{"n2": {}}, t0.Add(2 * time.Second), false},
	} {
		for node, since := range tc.marks {
			p.mark(node, since, nil)
		}
		if got := p.HeldSince(tc.at); got != tc.want {
			t.Fatalf("%s: HeldSince = %v, want %v", tc.name, got, tc.want)
		}
	}

	// A node that joins counts at once: a proxy cut off from Redis is not
	// present on it, so it must not count itself present everywhere.
	p.mark("n2", t0, nil)
	if !p.HeldSince(t0.Add(2 * time.Second)) {
		t.Fatal("HeldSince = false with both nodes held")
	}
	if _, err := c.SetNodes(append(c.Nodes(), Node{Name: "n3", DSN: "postgres://x@h3/db"})); err != nil {
		t.Fatal(err)
	}
	if p.HeldSince(t0.Add(2 * time.Second)) {
		t.Fatal("HeldSince = true although nothing is held on the node that joined")
	}
}

// TestPresenceHoldsReplaced: a node's entry changed (a drain), so a new
// hold took its session over before the old hold stopped; the old hold's
// end leaves the new session held, and neither peeks at the other's socket.
func TestPresenceHoldsReplaced(t *testing.T) {
	c, err := NewCluster([]Node{{Name: "n1", DSN: "postgres://x@h1/db"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := NewPresence(c, "lattice proxy test/p", nil)
	oldConn, peer := net.Pipe()
	defer oldConn.Close()
	defer peer.Close()
	newConn, peer2 := net.Pipe()
	defer newConn.Close()
	defer peer2.Close()
	t0 := time.Now()
	p.mark("n1", t0, oldConn)
	p.mark("n1", t0.Add(time.Second), newConn)
	if p.open("n1", oldConn) {
		t.Error("the old hold sees the new hold's session as its own")
	}
	p.mark("n1", time.Time{}, oldConn)
	if !p.open("n1", newConn) || !p.HeldSince(t0.Add(2*time.Second)) {
		t.Error("the old hold's end ended the new hold's session")
	}
}
