package main

import "testing"

func TestByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"65536", 65536, true},
		{"64kB", 64 << 10, true},
		{"64MB", 64 << 20, true},
		{"1GB", 1 << 30, true},
		{"0", 0, false},
		{"-1MB", 0, false},
		{"lots", 0, false},
	}
	for _, tt := range tests {
		var b byteSize
		err := b.Set(tt.in)
		if (err == nil) != tt.ok || (tt.ok && int64(b) != tt.want) {
			t.Errorf("Set(%q) = %d, %v", tt.in, b, err)
		}
	}
}
