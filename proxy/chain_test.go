package proxy

import (
	"slices"
	"testing"
)

func TestChainedLocal(t *testing.T) {
	cases := []struct {
		local, want []string
	}{
		{nil, nil},
		{[]string{"SET LOCAL statement_timeout = 5"}, nil},
		{[]string{"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"}, []string{"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"}},
		{[]string{"set transaction read only", "SET CONSTRAINTS ALL DEFERRED", "SET LOCAL x.y = 1", "SET TRANSACTION DEFERRABLE"},
			[]string{"set transaction read only", "SET TRANSACTION DEFERRABLE"}},
		{[]string{"SET TRANSACTION SNAPSHOT '00000003-0000001B-1'"}, nil},
	}
	for _, c := range cases {
		if got := chainedLocal(c.local); !slices.Equal(got, c.want) {
			t.Errorf("chainedLocal(%q) = %q, want %q", c.local, got, c.want)
		}
	}
}
