package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
)

func TestServeRefusesCopyWorkers(t *testing.T) {
	for _, n := range []int{-1, maxCopyWorkers + 1} {
		var cfg serveConfig
		cfg.Migration.CopyWorkers = n
		err := serve(context.Background(), cfg, slog.Default(), nil)
		if err == nil || !strings.Contains(err.Error(), "--copy-workers") {
			t.Errorf("--copy-workers %d: %v, want a refusal that names the flag", n, err)
		}
	}
}
