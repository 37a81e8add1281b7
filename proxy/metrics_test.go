package proxy

import (
	"strings"
	"testing"

	"github.com/lattice-db/lattice/router"
)

// TestQueryKindNames checks that every plan kind of the router has a metric
// label and that the proxy's own kinds come after the router's last one: a
// new router kind must be named here, not counted as "multi".
func TestQueryKindNames(t *testing.T) {
	for k := router.Kind(0); k < kindMulti; k++ {
		if strings.HasPrefix(k.String(), "Kind(") {
			t.Errorf("kind %d is not a router kind, but the proxy's kinds start at %d", k, kindMulti)
		}
		if queryKindNames[k] == "" {
			t.Errorf("router kind %s has no metric label", k)
		}
	}
	if s := kindMulti.String(); !strings.HasPrefix(s, "Kind(") {
		t.Errorf("router kind %s collides with the proxy's kind multi: name it in queryKindNames", s)
	}
	seen := map[string]bool{}
	for _, n := range queryKindNames {
		if n == "" || seen[n] {
			t.Errorf("label %q is empty or repeated", n)
		}
		seen[n] = true
	}
}
