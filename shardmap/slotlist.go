package shardmap

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// SlotList is a map's slot table: slot -> shard index. Its JSON is the plain
// array of numbers encoding/json writes for []int, read and written by hand:
// every map read and every map event carries 4096 of them, and through
// reflection their decoding was a sixth of a race-built proxy's CPU during a
// reshard under load.
type SlotList []int

// MarshalJSON writes the list as a JSON array of integers.
func (l SlotList) MarshalJSON() ([]byte, error) {
	if l == nil {
		return []byte("null"), nil
	}
	b := make([]byte, 0, 2+len(l)*4)
	b = append(b, '[')
	for i, v := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(v), 10)
	}
	return append(b, ']'), nil
}

// UnmarshalJSON reads a JSON array of integers, or null. encoding/json has
// already checked that b is one valid JSON value.
func (l *SlotList) UnmarshalJSON(b []byte) error {
	i := skipSpace(b, 0)
	if bytes.HasPrefix(b[i:], []byte("null")) {
		return nil // as encoding/json leaves a slice on null
	}
	if i == len(b) || b[i] != '[' {
		return errNotSlotList
	}
	out := (*l)[:0]
	if n := bytes.Count(b, []byte(",")) + 1; cap(out) < n {
		out = make(SlotList, 0, n)
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		*l = out // empty, not nil, as encoding/json makes it
		return nil
	}
	for {
		j := i
		v := 0 // a null element leaves its int zero, as in encoding/json
		if bytes.HasPrefix(b[i:], []byte("null")) {
			j += 4
		} else {
			if j < len(b) && b[j] == '-' {
				j++
			}
			for j < len(b) && b[j] >= '0' && b[j] <= '9' {
				j++
			}
			var err error
			if v, err = strconv.Atoi(string(b[i:j])); err != nil {
				return fmt.Errorf("shardmap: slot list: %q is not an integer", b[i:min(j+1, len(b))])
			}
		}
		out = append(out, v)
		i = skipSpace(b, j)
		if i == len(b) {
			return errNotSlotList
		}
		if b[i] == ']' {
			break
		}
		if b[i] != ',' {
			return fmt.Errorf("shardmap: slot list: %q is not an integer", b[j:min(i+1, len(b))])
		}
		i = skipSpace(b, i+1)
	}
	if skipSpace(b, i+1) != len(b) {
		return errNotSlotList
	}
	*l = out
	return nil
}

var errNotSlotList = errors.New("shardmap: slot list: not a JSON array of integers")

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
