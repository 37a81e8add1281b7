package shardmap

import "sync"

// decodedMaps keeps, per map key, the stored JSON last read or written and
// its decoded map. A migration reads its tree's map many times between two
// changes (the coordinator's tick, each step's check, the status
// functions), and decoding 4,096 slots and every shard each time was most
// of the migrator's CPU; comparing the stored bytes with the kept ones is
// a memcmp. Callers get a clone, since they change the maps they read.
//
// At most maxDecodedMaps are kept: a tree dropped by another proxy is
// never read here again, so nothing else would let its entry go.
type decodedMaps struct {
	mu    sync.Mutex
	byKey map[string]decodedMap
}

const maxDecodedMaps = 1024

type decodedMap struct {
	raw string
	m   *Map
}

// decode returns the map raw holds, stored under key: a clone of the kept
// one if raw is what was kept, decoded (and kept) otherwise.
func (d *decodedMaps) decode(key, raw string) (*Map, error) {
	if m, ok := d.get(key, raw); ok {
		return m, nil
	}
	m, err := decodeMap([]byte(raw))
	if err != nil {
		return nil, err
	}
	d.put(key, raw, m)
	return m, nil
}

// get returns a clone of the map decoded from raw under key, if that is
// the one kept.
func (d *decodedMaps) get(key, raw string) (*Map, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.byKey[key]
	if !ok || e.raw != raw {
		return nil, false
	}
	return e.m.Clone(), true
}

// put keeps a clone of m as the map stored under key as raw.
func (d *decodedMaps) put(key, raw string, m *Map) {
	c := m.Clone()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byKey == nil {
		d.byKey = make(map[string]decodedMap)
	}
	if _, ok := d.byKey[key]; !ok && len(d.byKey) >= maxDecodedMaps {
		for k := range d.byKey { // any one: the next read of it decodes
			delete(d.byKey, k)
			break
		}
	}
	d.byKey[key] = decodedMap{raw: raw, m: c}
}

// forget drops what is kept under key (the map is gone).
func (d *decodedMaps) forget(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.byKey, key)
}
