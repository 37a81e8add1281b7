package proxy

import "testing"

func TestTagWrites(t *testing.T) {
	tests := []struct {
		tag   string
		write bool
		rows  int64
	}{
		{"INSERT 0 1", true, 1},
		{"INSERT 0 25", true, 25},
		{"UPDATE 3", true, 3},
		{"DELETE 0", true, 0},
		{"MERGE 2", true, 2},
		{"COPY 7", true, 7},
		{"SELECT 1", false, 0},
		{"FETCH 10", false, 0},
		{"", false, 0},
		{"COMMIT", false, 0},
		{"CREATE TABLE", false, 0},
		{"DECLARE CURSOR", false, 0},
	}
	for _, tc := range tests {
		w, n := tagWrites([]byte(tc.tag))
		if w != tc.write || n != tc.rows {
			t.Errorf("%q: write %v rows %d, want %v %d", tc.tag, w, n, tc.write, tc.rows)
		}
	}
}

// Reading the tag runs on every counted statement: it must not allocate.
func TestTagWritesNoAlloc(t *testing.T) {
	tags := [][]byte{[]byte("SELECT 1"), []byte("UPDATE 1"), []byte("INSERT 0 12")}
	if n := testing.AllocsPerRun(1000, func() {
		for _, tag := range tags {
			_, _ = tagWrites(tag)
			loadMark{}.done(tag)
		}
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
