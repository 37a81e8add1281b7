package pgshard

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestLooksJoinOnlyUnstarted: a call made while a look runs does not get
// that look's answer, read before the call, but the next look's, which
// starts once the running one ends and serves every call that waited for
// it; looks of one key never overlap, those of another key are not held up.
func TestLooksJoinOnlyUnstarted(t *testing.T) {
	type result struct{ look int }
	var started, running atomic.Int32
	release := make(chan struct{})
	ls := newLooks(func(key string) (result, error) {
		n := int(started.Add(1))
		if running.Add(1) > 1 {
			t.Errorf("two looks of one key ran at once")
		}
		defer running.Add(-1)
		if key == "a" {
			<-release
		}
		return result{n}, nil
	})
	wait := func(l *look[result]) result {
		t.Helper()
		select {
		case <-l.done:
			return l.val
		case <-time.After(10 * time.Second):
			t.Fatal("a look did not end")
			return result{}
		}
	}

	first := ls.join("a") // starts look 1 at once
	for started.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	// Calls made while look 1 runs.
	second, third := ls.join("a"), ls.join("a")
	if second == first || third != second {
		t.Fatal("calls made while a look runs must share the next look, not the running one")
	}
	select {
	case <-second.done:
		t.Fatal("the next look ended before the running one")
	case <-time.After(50 * time.Millisecond):
	}
	if n := started.Load(); n != 1 {
		t.Fatalf("%d looks started while the first ran, want 1", n)
	}
	release <- struct{}{}
	if got := wait(first); got.look != 1 {
		t.Fatalf("first call got look %d, want 1", got.look)
	}
	release <- struct{}{}
	if got := wait(second); got.look != 2 {
		t.Fatalf("second call got look %d, want 2 (started after it)", got.look)
	}
	if got := wait(third); got.look != 2 {
		t.Fatalf("third call got look %d, want 2 (shared)", got.look)
	}

	// With no look running, a call starts its own at once.
	other := ls.join("b")
	if got := wait(other); got.look != 3 {
		t.Fatalf("key b got look %d, want 3", got.look)
	}
	again := ls.join("a")
	release <- struct{}{}
	if got := wait(again); got.look != 4 {
		t.Fatalf("a call after the looks ended got look %d, want a new one, 4", got.look)
	}
}
