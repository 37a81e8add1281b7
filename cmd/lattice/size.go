package main

import (
	"fmt"
	"strconv"
	"strings"
)

// byteSize is a flag value in bytes, written as PostgreSQL writes memory
// settings: 65536, 64kB, 64MB, 1GB.
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(v string) error {
	s := strings.TrimSpace(v)
	scale := int64(1)
	for _, u := range []struct {
		suffix string
		scale  int64
	}{{"kB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, scale = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.scale
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/scale {
		return fmt.Errorf("invalid size %q: want a positive number of bytes, optionally with kB, MB or GB", v)
	}
	*b = byteSize(n * scale)
	return nil
}
