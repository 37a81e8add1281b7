package proxy

import (
	"testing"
	"time"
)

func TestParseTimeout(t *testing.T) {
	tests := []struct {
		stmt string
		want time.Duration
	}{
		{`SET "statement_timeout" = '5000'`, 5 * time.Second},
		{`SET statement_timeout = 250`, 250 * time.Millisecond},
		{`set statement_timeout to '1.5s'`, 1500 * time.Millisecond},
		{`SET SESSION statement_timeout TO '2 min'`, 2 * time.Minute},
		{`SET LOCAL statement_timeout = '300ms';`, 300 * time.Millisecond},
		{`SET statement_timeout = '1h'`, time.Hour},
		{`SET statement_timeout = 0`, 0},
		{`SET statement_timeout = DEFAULT`, 0},
		{`SET statement_timeout TO '5 fortnights'`, 0},
	}
	for _, tt := range tests {
		if got := parseTimeout(tt.stmt); got != tt.want {
			t.Errorf("parseTimeout(%q) = %v, want %v", tt.stmt, got, tt.want)
		}
	}
}

func TestStatementTimeoutOrder(t *testing.T) {
	params := map[string]string{}
	withStatementTimeout(params, 2*time.Second)
	s := &session{settings: newSettings(params, nil)}
	if got := s.statementTimeout(); got != 2*time.Second {
		t.Fatalf("startup default: %v", got)
	}
	s.settings.apply(`SET statement_timeout = '300ms'`)
	if got := s.statementTimeout(); got != 300*time.Millisecond {
		t.Fatalf("after SET: %v", got)
	}
	s.tx.local = []string{`SET LOCAL statement_timeout = 50`}
	if got := s.statementTimeout(); got != 50*time.Millisecond {
		t.Fatalf("after SET LOCAL: %v", got)
	}
	s.tx.local = nil
	s.settings.apply(`RESET statement_timeout`)
	if got := s.statementTimeout(); got != 2*time.Second {
		t.Fatalf("after RESET: %v", got)
	}
	// A client's own startup value wins over the proxy's default.
	own := map[string]string{"statement_timeout": "7s"}
	withStatementTimeout(own, 2*time.Second)
	if own["statement_timeout"] != "7s" {
		t.Fatalf("client startup value replaced: %v", own)
	}
}
