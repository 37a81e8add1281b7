package pgshard

import "sync"

// looks runs the looks of one key one at a time and lets the calls that
// arrive meanwhile share one: a call joins the look of its key that starts
// next, never one that has already started, so the look a call gets reads
// what exists after the call began. Present relies on that: a freeze's
// look for proxies cut off from Redis must see every presence session that
// exists after it read the live proxies. Sharing keeps the looks of
// concurrent freezes and releases to one query per node at a time, on one
// connection, rather than one each on a growing pool.
type looks[K comparable, V any] struct {
	run func(K) (V, error) // one look, in a goroutine of its own

	mu     sync.Mutex
	queues map[K]*lookQueue[V] // keys with a look running; removed when it ends with none waiting
}

type lookQueue[V any] struct {
	next *look[V] // starts when the running look ends; nil while no call waits for it
}

type look[V any] struct {
	done chan struct{} // closed once val and err are set
	val  V
	err  error
}

func newLooks[K comparable, V any](run func(K) (V, error)) *looks[K, V] {
	return &looks[K, V]{run: run, queues: map[K]*lookQueue[V]{}}
}

// join returns the look of key that starts next, and starts it at once if
// no look of key runs.
func (ls *looks[K, V]) join(key K) *look[V] {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if q := ls.queues[key]; q != nil {
		if q.next == nil {
			q.next = &look[V]{done: make(chan struct{})}
		}
		return q.next
	}
	l := &look[V]{done: make(chan struct{})}
	ls.queues[key] = &lookQueue[V]{}
	ls.start(key, l)
	return l
}

// start runs l, then the look queued behind it, if any. Called with mu
// held, and l already out of reach of join.
func (ls *looks[K, V]) start(key K, l *look[V]) {
	go func() {
		l.val, l.err = ls.run(key)
		close(l.done)
		ls.mu.Lock()
		defer ls.mu.Unlock()
		q := ls.queues[key]
		if q.next == nil {
			delete(ls.queues, key)
			return
		}
		next := q.next
		q.next = nil
		ls.start(key, next)
	}()
}
