package proxy

import (
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TestRelayedNoticesBounded: a maintenance statement's notices are kept up
// to maxRelayedNotices, in order, and the rest are counted in one warning.
func TestRelayedNoticesBounded(t *testing.T) {
	for _, n := range []int{0, 1, maxRelayedNotices, maxRelayedNotices + 1, maxRelayedNotices + 7} {
		var r relayedNotices
		for i := range n {
			r.add(&pgconn.Notice{Severity: "INFO", SeverityUnlocalized: "INFO", Code: "00000", Message: string(rune('a' + i%26))})
		}
		want := min(n, maxRelayedNotices)
		if n > maxRelayedNotices {
			want++
		}
		if len(r.msgs) != want {
			t.Fatalf("%d notices: %d kept, want %d", n, len(r.msgs), want)
		}
		for i := range min(n, maxRelayedNotices) {
			if m := r.msgs[i].(*pgproto3.NoticeResponse); m.Message != string(rune('a'+i%26)) || m.Severity != "INFO" {
				t.Fatalf("%d notices: message %d is %s %q", n, i, m.Severity, m.Message)
			}
		}
		if n > maxRelayedNotices {
			last := r.msgs[maxRelayedNotices].(*pgproto3.NoticeResponse)
			if last.Severity != "WARNING" || !strings.HasPrefix(last.Message, strconv.Itoa(n-maxRelayedNotices)+" more notices") {
				t.Fatalf("%d notices: the last is %s %q", n, last.Severity, last.Message)
			}
		}
	}
}
