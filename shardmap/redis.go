package shardmap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lattice-db/lattice/secret"
)

// DefaultPrefix starts every key and the event channel of a store opened
// with OpenRedis.
const DefaultPrefix = "lattice"

// RedisStore is the Store kept in Redis (standalone, Sentinel or Cluster).
//
// Key layout, with P the prefix and T the tenant ('%', '{' and '}' in T
// percent-escaped so the hash tag always ends where T does):
//
//	P:{T}:trees       hash: tree name -> Tree JSON (the tenant's registry)
//	P:{T}:map:<tree>  hash: "epoch" -> decimal epoch, "map" -> Map JSON; a
//	                  colocation group's map is under the group's name
//	P:{T}:group:<g>   set: the members of colocation group g (group.go)
//	P:events          pub/sub channel carrying Event JSON
//
// All keys of a tenant share the hash tag {T}, so in Redis Cluster they live
// in one slot and a script can register a tree and its map atomically. The
// epoch sits in its own hash field so the compare-and-set script compares
// it without decoding the map.
type RedisStore struct {
	client  redis.UniversalClient
	prefix  string
	channel string
	decoded decodedMaps
}

var _ Store = (*RedisStore)(nil)

// NewRedisStore returns a store that keeps its keys under prefix (it must
// not contain '{' or '}'; "" means DefaultPrefix). Close closes client.
func NewRedisStore(client redis.UniversalClient, prefix string) *RedisStore {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	client.AddHook(unavailableHook{})
	return &RedisStore{client: client, prefix: prefix, channel: prefix + ":events"}
}

// OpenRedis connects to Redis and checks that it answers. Accepted URLs:
//
//	redis://[user:password@]host:port[/db][?option=value...]
//	rediss://...                      the same over TLS
//	redis-sentinel://[user:password@]host:port[,host:port...]/master[/db][?password=...]
//	rediss-sentinel://...             the same over TLS
//	redis-cluster://[user:password@]host:port[,host:port...][?option=value...]
//	rediss-cluster://...              the same over TLS
//
// In the sentinel form the user info authenticates to the sentinels and the
// password query parameter to the master. Options are go-redis's, in
// snake case (dial_timeout=3s, pool_size=20, ...).
func OpenRedis(ctx context.Context, rawURL string) (*RedisStore, error) {
	client, err := newUniversalClient(rawURL)
	if err != nil {
		// url.Parse's errors quote the whole URL, password and all.
		return nil, fmt.Errorf("shardmap: redis url: %w", secret.Error(err))
	}
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, fmt.Errorf("shardmap: connect to redis: %w", secret.Error(err))
	}
	return NewRedisStore(client, DefaultPrefix), nil
}

// Client kinds behind a URL.
const (
	modeSingle   = "single"
	modeSentinel = "sentinel"
	modeCluster  = "cluster"
)

func newUniversalClient(rawURL string) (redis.UniversalClient, error) {
	mode, u, err := goRedisURL(rawURL)
	if err != nil {
		return nil, err
	}
	switch mode {
	case modeSentinel:
		opt, err := redis.ParseFailoverURL(u)
		if err != nil {
			return nil, err
		}
		return redis.NewFailoverClient(opt), nil
	case modeCluster:
		opt, err := redis.ParseClusterURL(u)
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(opt), nil
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(opt), nil
}

// goRedisURL translates one of OpenRedis's URL forms into the client kind
// and the URL go-redis's parser for that kind takes, where extra hosts are
// addr parameters and the sentinel master is master_name.
func goRedisURL(rawURL string) (mode, u string, err error) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return "", "", errors.New("missing scheme")
	}
	switch scheme {
	case "redis", "rediss":
		return modeSingle, rawURL, nil
	case "redis-sentinel", "rediss-sentinel":
		mu, err := multiHostURL(strings.TrimSuffix(scheme, "-sentinel"), rest)
		if err != nil {
			return "", "", err
		}
		parts := strings.Split(strings.Trim(mu.Path, "/"), "/")
		if parts[0] == "" || len(parts) > 2 {
			return "", "", errors.New("sentinel url needs /master or /master/db")
		}
		q := mu.Query()
		q.Set("master_name", parts[0])
		mu.RawQuery = q.Encode()
		mu.Path = ""
		if len(parts) == 2 {
			mu.Path = "/" + parts[1]
		}
		return modeSentinel, mu.String(), nil
	case "redis-cluster", "rediss-cluster":
		mu, err := multiHostURL(strings.TrimSuffix(scheme, "-cluster"), rest)
		if err != nil {
			return "", "", err
		}
		return modeCluster, mu.String(), nil
	}
	return "", "", fmt.Errorf("unsupported scheme %q", scheme)
}

// multiHostURL turns "user@h1:p1,h2:p2/path?q" into scheme://user@h1:p1/path?q&addr=h2:p2,
// the form go-redis parses: net/url refuses a comma-separated host list.
func multiHostURL(scheme, rest string) (*url.URL, error) {
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	userinfo, hosts := "", authority
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		userinfo, hosts = authority[:i+1], authority[i+1:]
	}
	addrs := strings.Split(hosts, ",")
	u, err := url.Parse(scheme + "://" + userinfo + addrs[0] + tail)
	if err != nil {
		return nil, err
	}
	q := u.Query()
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	u.RawQuery = q.Encode()
	return u, nil
}

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

func (s *RedisStore) tenantTag(tenant string) string {
	return s.prefix + ":{" + tagEscaper.Replace(tenant) + "}"
}

func (s *RedisStore) treesKey(tenant string) string { return s.tenantTag(tenant) + ":trees" }

func (s *RedisStore) mapKey(tenant, tree string) string {
	return s.tenantTag(tenant) + ":map:" + tree
}

// Every write is a script so that the check, the write and the PUBLISH
// happen as one step: no event announces a change that did not happen, and
// no change goes unannounced because the writer died in between.
var (
	// KEYS: trees, map, group members. ARGV: name, tree JSON, epoch, map
	// JSON, channel, event, group ("" for a tree alone). A map without a
	// registry entry is a colocation group's (group.go); a tree created
	// with a group is its first member (lattice recover-map).
	createScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 2 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], 'epoch', ARGV[3], 'map', ARGV[4])
if ARGV[7] ~= '' then redis.call('SADD', KEYS[3], ARGV[1]) end
redis.call('PUBLISH', ARGV[5], ARGV[6])
return 1`)

	// KEYS: trees. ARGV: name, expected tree JSON, tree JSON, channel, event.
	// Returns -1 if the tree does not exist, 0 when it is not the expected one.
	swapTreeScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return -1 end
if cur ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1`)

	// KEYS: map, trees. ARGV: expected epoch, new epoch, map JSON,
	// channel, event without its closing brace, tree name. Returns -1 if
	// the map does not exist, 0 on an epoch mismatch. The event carries the
	// map and the creation time of the tree it was written for
	// (CarriedMap).
	swapScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'epoch')
if not cur then return -1 end
if cur ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'epoch', ARGV[2], 'map', ARGV[3])
local ev = ARGV[5]
local def = redis.call('HGET', KEYS[2], ARGV[6])
if def then
  local created = cjson.decode(def).created
  if type(created) == 'string' then ev = ev .. ',"created":' .. cjson.encode(created) .. ',"map":' .. ARGV[3] end
end
redis.call('PUBLISH', ARGV[4], ev .. '}')
return 1`)
)

// Trees implements Store.
func (s *RedisStore) Trees(ctx context.Context, tenant string) ([]*Tree, error) {
	vals, err := s.client.HGetAll(ctx, s.treesKey(tenant)).Result()
	if err != nil {
		return nil, fmt.Errorf("shardmap: list trees of %s: %w", tenant, err)
	}
	trees := make([]*Tree, 0, len(vals))
	for name, v := range vals {
		t := new(Tree)
		if err := json.Unmarshal([]byte(v), t); err != nil {
			return nil, fmt.Errorf("shardmap: decode tree %s/%s: %w", tenant, name, err)
		}
		trees = append(trees, t)
	}
	slices.SortFunc(trees, func(a, b *Tree) int { return strings.Compare(a.Name, b.Name) })
	return trees, nil
}

// Tree implements Store.
func (s *RedisStore) Tree(ctx context.Context, tenant, name string) (*Tree, error) {
	v, err := s.client.HGet(ctx, s.treesKey(tenant), name).Result()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("shardmap: tree %s/%s: %w", tenant, name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("shardmap: read tree %s/%s: %w", tenant, name, err)
	}
	t := new(Tree)
	if err := json.Unmarshal([]byte(v), t); err != nil {
		return nil, fmt.Errorf("shardmap: decode tree %s/%s: %w", tenant, name, err)
	}
	return t, nil
}

// Map implements Store.
func (s *RedisStore) Map(ctx context.Context, tenant, tree string) (*Map, error) {
	key := s.mapKey(tenant, tree)
	v, err := s.client.HGet(ctx, key, "map").Result()
	if errors.Is(err, redis.Nil) {
		s.decoded.forget(key)
		return nil, fmt.Errorf("shardmap: map of %s/%s: %w", tenant, tree, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("shardmap: read map of %s/%s: %w", tenant, tree, err)
	}
	m, err := s.decoded.decode(key, v)
	if err != nil {
		return nil, fmt.Errorf("shardmap: decode map of %s/%s: %w", tenant, tree, err)
	}
	return m, nil
}

// MapEpochs implements Store.
func (s *RedisStore) MapEpochs(ctx context.Context, tenant string, names []string) (map[string]uint64, error) {
	cmds := make([]*redis.StringCmd, len(names))
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, name := range names {
			cmds[i] = p.HGet(ctx, s.mapKey(tenant, name), "epoch")
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("shardmap: read map epochs of %s: %w", tenant, err)
	}
	out := make(map[string]uint64, len(names))
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("shardmap: read map epoch of %s/%s: %w", tenant, names[i], err)
		}
		e, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("shardmap: map epoch of %s/%s: %w", tenant, names[i], err)
		}
		out[names[i]] = e
	}
	return out, nil
}

// CreateTree implements Store.
func (s *RedisStore) CreateTree(ctx context.Context, t *Tree, m *Map) error {
	if t.Tenant != m.Tenant || t.MapName() != m.Tree {
		return fmt.Errorf("shardmap: create tree %s/%s with the map of %s/%s", t.Tenant, t.Name, m.Tenant, m.Tree)
	}
	if t.Created.IsZero() {
		t.Created = time.Now().UTC()
	}
	tj, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("shardmap: encode tree %s/%s: %w", t.Tenant, t.Name, err)
	}
	mj, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("shardmap: encode map of %s/%s: %w", t.Tenant, t.Name, err)
	}
	n, err := createScript.Run(ctx, s.client,
		[]string{s.treesKey(t.Tenant), s.mapKey(t.Tenant, t.MapName()), s.groupKey(t.Tenant, t.MapName())},
		t.Name, tj, strconv.FormatUint(m.Epoch, 10), mj,
		s.channel, s.event(EventTree, t.Tenant, t.Name, 0), t.Group).Int()
	if err != nil {
		return fmt.Errorf("shardmap: create tree %s/%s: %w", t.Tenant, t.Name, err)
	}
	switch n {
	case 0:
		return fmt.Errorf("shardmap: create tree %s/%s: %w", t.Tenant, t.Name, ErrExists)
	case 2:
		return fmt.Errorf("shardmap: create tree %s/%s: %w", t.Tenant, t.Name, ErrNameInUse)
	}
	return nil
}

// SwapTree implements Store. The stored entry is compared as JSON: entries
// are only ever written by json.Marshal of a Tree, which prev re-encodes to
// the same bytes.
func (s *RedisStore) SwapTree(ctx context.Context, t, prev *Tree) error {
	if t.Tenant != prev.Tenant || t.Name != prev.Name {
		return fmt.Errorf("shardmap: swap tree %s/%s for %s/%s", prev.Tenant, prev.Name, t.Tenant, t.Name)
	}
	pj, err := json.Marshal(prev)
	if err != nil {
		return fmt.Errorf("shardmap: encode tree %s/%s: %w", t.Tenant, t.Name, err)
	}
	tj, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("shardmap: encode tree %s/%s: %w", t.Tenant, t.Name, err)
	}
	n, err := swapTreeScript.Run(ctx, s.client, []string{s.treesKey(t.Tenant)},
		t.Name, pj, tj, s.channel, s.event(EventTree, t.Tenant, t.Name, 0)).Int()
	if err != nil {
		return fmt.Errorf("shardmap: swap tree %s/%s: %w", t.Tenant, t.Name, err)
	}
	switch n {
	case -1:
		return fmt.Errorf("shardmap: swap tree %s/%s: %w", t.Tenant, t.Name, ErrNotFound)
	case 0:
		return fmt.Errorf("shardmap: swap tree %s/%s: %w", t.Tenant, t.Name, ErrConflict)
	}
	return nil
}

// SwapMap implements Store.
func (s *RedisStore) SwapMap(ctx context.Context, m *Map, expected uint64) error {
	next := *m
	next.Epoch = expected + 1
	mj := encodeMap(&next)
	ev := s.event(EventMap, m.Tenant, m.Tree, next.Epoch)
	key := s.mapKey(m.Tenant, m.Tree)
	n, err := swapScript.Run(ctx, s.client, []string{key, s.treesKey(m.Tenant)},
		strconv.FormatUint(expected, 10), strconv.FormatUint(next.Epoch, 10), mj,
		s.channel, ev[:len(ev)-1], m.Tree).Int()
	if err != nil {
		return fmt.Errorf("shardmap: swap map of %s/%s: %w", m.Tenant, m.Tree, err)
	}
	switch n {
	case -1:
		return fmt.Errorf("shardmap: swap map of %s/%s: %w", m.Tenant, m.Tree, ErrNotFound)
	case 0:
		return fmt.Errorf("shardmap: swap map of %s/%s at epoch %d: %w", m.Tenant, m.Tree, expected, ErrConflict)
	}
	m.Epoch = next.Epoch
	s.decoded.put(key, string(mj), &next)
	return nil
}

func (s *RedisStore) event(kind EventKind, tenant, tree string, epoch uint64) []byte {
	b, _ := json.Marshal(Event{Kind: kind, Tenant: tenant, Tree: tree, Epoch: epoch}) // strings and a number always encode
	return b
}

// Subscribe implements Store. go-redis's PubSub re-subscribes after a
// reconnect and pings the connection, so the channel outlives a Redis restart.
func (s *RedisStore) Subscribe(ctx context.Context) (<-chan Event, error) {
	ps := s.client.Subscribe(ctx, s.channel)
	// Wait for the confirmation so that every publish after this returns is seen.
	if _, err := ps.Receive(ctx); err != nil {
		ps.Close()
		return nil, fmt.Errorf("shardmap: subscribe to %s: %w", s.channel, err)
	}
	msgs := ps.Channel()
	out := make(chan Event, 64)
	go func() {
		defer close(out)
		defer ps.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case msg, ok := <-msgs:
				if !ok {
					return
				}
				ev, err := decodeEvent(msg.Payload)
				if err != nil {
					slog.WarnContext(ctx, "shardmap: ignoring malformed event", "channel", s.channel, "err", err)
					continue
				}
				if ev.Carried != nil {
					key := s.mapKey(ev.Tenant, ev.Tree)
					ev.Carried.decode = func(raw []byte) (*Map, error) { return s.decoded.decode(key, string(raw)) }
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// Close implements Store.
func (s *RedisStore) Close() error { return s.client.Close() }
