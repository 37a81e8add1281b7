package migrator

import (
	"strings"
	"testing"
)

// TestReleaseSettings: every setting of a release range is SET LOCAL, so it
// ends with the range's transaction and no later statement on the pooled
// connection runs without the fence; replica mode only when the role may
// set it, since SET of it fails the transaction otherwise.
func TestReleaseSettings(t *testing.T) {
	for _, tc := range []struct {
		replica bool
		want    []string
	}{
		{false, []string{"SET LOCAL lattice.migrator = 'on'"}},
		{true, []string{"SET LOCAL lattice.migrator = 'on'", "SET LOCAL session_replication_role = replica"}},
	} {
		got := strings.Split(releaseSettings(tc.replica), "; ")
		if strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("releaseSettings(%v) = %q, want %q", tc.replica, got, tc.want)
		}
	}
}
