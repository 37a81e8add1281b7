package integration

import (
	"context"
	"testing"
)

// TestParameterStatusAtStartup: a new client is told the backend's
// startup values, not what the last session that used the pooled backend
// set. pgx refuses the simple protocol unless client_encoding is UTF8 (pgx's TestConnSimpleProtocol failed
// through the proxy while TestConnSimpleProtocolRefusesNonUTF8ClientEncoding
// ran beside it).
func TestParameterStatusAtStartup(t *testing.T) {
	resetNodes(t)
	p := startProxy(t, 1, "--pool-size", "1")
	ctx := context.Background()
	a := connect(t, p.DSN("lattice"))
	mustExec(t, a, `SET client_encoding TO 'SQL_ASCII'`)
	mustExec(t, a, `SET application_name TO 'leaky'`)
	for i := range 3 {
		b := connect(t, p.DSN("lattice"))
		for name, want := range map[string]string{"client_encoding": "UTF8", "standard_conforming_strings": "on"} {
			if got := b.PgConn().ParameterStatus(name); got != want {
				t.Fatalf("client %d: ParameterStatus %s = %q, want %q", i, name, got, want)
			}
		}
		if got := b.PgConn().ParameterStatus("application_name"); got == "leaky" {
			t.Fatalf("client %d: application_name of another session", i)
		}
		var enc string
		if err := b.QueryRow(ctx, `SHOW client_encoding`).Scan(&enc); err != nil || enc != "UTF8" {
			t.Fatalf("client %d: SHOW client_encoding = %q, %v", i, enc, err)
		}
		b.Close(ctx)
		// a uses the backend again, so the next client finds its settings there.
		mustExec(t, a, `SELECT 1`)
	}
}
