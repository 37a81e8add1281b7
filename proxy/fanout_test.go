package proxy

import (
	"testing"

	"github.com/lattice-db/lattice/sqlstate"
)

// TestMergeError keeps the SQLSTATE, message and hint of the error that
// stops a merge, such as ORDER BY on a type it cannot order.
func TestMergeError(t *testing.T) {
	err := sqlstate.New(sqlstate.FeatureNotSupported, "ORDER BY on a column of type oid 114 across several shards is not supported").
		WithHint("order by integers")
	got := mergeError(err)
	if got.Code != sqlstate.FeatureNotSupported || got.Message != err.Message || got.Hint != err.Hint || got.Severity != "ERROR" {
		t.Errorf("mergeError = %+v, want the code, message and hint of %+v", got, err)
	}
}
