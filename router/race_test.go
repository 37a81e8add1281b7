//go:build race

package router

// raceEnabled: the race detector's sync.Pool drops what is put in it at
// random, so allocation counts of pooled paths mean nothing under it.
const raceEnabled = true
