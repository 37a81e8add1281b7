package autonomic

import "time"

// Config tunes the monitor and the healer. Zero values take the defaults.
type Config struct {
	// SplitWrites: a shard writing more than this many rows per second is
	// hot, whatever the rest of the tree does (1000).
	SplitWrites float64
	// SplitMeanMultiple: a shard writing more than this multiple of the
	// tree's mean per shard is hot (4), if it also writes SplitFloor.
	SplitMeanMultiple float64
	// SplitFloor keeps a nearly idle tree from splitting for its
	// proportions alone (ColdWrites: what healing may fold is never hot).
	SplitFloor float64
	// SplitWindow: how long a shard stays hot before it is split, and how
	// long the monitor waits after a split before it splits again, so
	// that the next decision reads load that the new layout took (1 min).
	SplitWindow time.Duration
	// MaxShards caps autonomic growth, not a reshard (256).
	MaxShards int
	// ColdWrites: a tree is quiet while no shard writes more than this
	// (SplitWrites / 10), and a pair is folded only if it writes less
	// than this together. Far below the split threshold: the hysteresis.
	ColdWrites float64
	// UniformMultiple: a tree's load is uniform while no shard writes more
	// than this multiple of the mean (1.5, below SplitMeanMultiple), or
	// while it writes less than one row a second.
	UniformMultiple float64
	// HealWindow: how long the tree stays quiet and uniform before a fold,
	// counted again after every split (10 min).
	HealWindow time.Duration
	// MaxConcurrent bounds the migrations in flight that the monitor and
	// the healer start for one tree (4, --max-concurrent-migrations).
	MaxConcurrent int
}

// WithDefaults fills the zero values.
func (c Config) WithDefaults() Config {
	if c.SplitWrites <= 0 {
		c.SplitWrites = 1000
	}
	if c.SplitMeanMultiple <= 0 {
		c.SplitMeanMultiple = 4
	}
	if c.SplitWindow <= 0 {
		c.SplitWindow = time.Minute
	}
	if c.MaxShards <= 0 {
		c.MaxShards = 256
	}
	if c.ColdWrites <= 0 {
		c.ColdWrites = c.SplitWrites / 10
	}
	if c.SplitFloor <= 0 {
		c.SplitFloor = c.ColdWrites
	}
	if c.UniformMultiple <= 0 {
		c.UniformMultiple = 1.5
	}
	if c.HealWindow <= 0 {
		c.HealWindow = 10 * time.Minute
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 4
	}
	return c
}
