package shardmap

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMigrationRecords(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, id := range []string{"b", "a", "c"} {
		m := &Migration{ID: id, Tenant: "t", Tree: "x", Kind: Split, Source: i, Target: 10 + i,
			Slots: [][2]int{{0, 7}}, Phase: PhasePrepare, Created: base.Add(time.Duration(i) * time.Second)}
		if err := s.PutMigration(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	m := &Migration{ID: "a", Tenant: "t", Tree: "x", Kind: Split, Source: 1, Target: 11, Phase: PhaseDrain, Created: base.Add(time.Second)}
	if err := s.PutMigration(ctx, m); err != nil {
		t.Fatal(err)
	}
	got, err := s.Migrations(ctx, "t", "x")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, g := range got {
		ids = append(ids, g.ID)
	}
	if !slices.Equal(ids, []string{"b", "a", "c"}) || got[1].Phase != PhaseDrain {
		t.Fatalf("got %v (phase of a %s), want b a c oldest first with a in drain", ids, got[1].Phase)
	}
	if other, _ := s.Migrations(ctx, "t", "y"); len(other) != 0 {
		t.Fatalf("another tree sees %d migrations", len(other))
	}
	if err := s.DeleteMigration(ctx, "t", "x", "a"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Migrations(ctx, "t", "x"); len(got) != 2 {
		t.Fatalf("after delete: %d records", len(got))
	}
}

func TestReshardIntent(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	if _, err := s.Reshard(ctx, "t", "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no reshard: got %v", err)
	}
	r := &Reshard{OpID: "op1", Tenant: "t", Tree: "x", Target: 16}
	if cur, err := s.StartReshard(ctx, r); err != nil || cur != nil {
		t.Fatalf("first start: %v %v", cur, err)
	}
	cur, err := s.StartReshard(ctx, &Reshard{OpID: "op2", Tenant: "t", Tree: "x", Target: 8})
	if err != nil || cur == nil || cur.OpID != "op1" || cur.Target != 16 {
		t.Fatalf("second start: got %+v %v, want the running op1", cur, err)
	}
	if all, err := s.Reshards(ctx); err != nil || len(all) != 1 || all[0].OpID != "op1" {
		t.Fatalf("Reshards: %v %v", all, err)
	}
	if err := s.FinishReshard(ctx, "t", "x", "op2"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reshard(ctx, "t", "x"); err != nil {
		t.Fatalf("finishing another op removed the reshard: %v", err)
	}
	if err := s.FinishReshard(ctx, "t", "x", "op1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reshard(ctx, "t", "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after finish: %v", err)
	}
	if all, err := s.Reshards(ctx); err != nil || len(all) != 0 {
		t.Fatalf("Reshards after finish: %v %v", all, err)
	}
	if n, _ := s.client.HLen(ctx, s.reshardsKey()).Result(); n != 0 {
		t.Fatalf("the index keeps %d entries after the finish", n)
	}
}

// A coordinator that lists the reshards between StartReshard's two writes
// (index entry, then intent) must not drop the entry: the intent would then
// never be found. Only an entry older than the grace without an intent goes.
func TestReshardIndexKeepsYoungEntries(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	if err := s.index(ctx, "t", "x", "op1"); err != nil { // the first write alone
		t.Fatal(err)
	}
	if all, err := s.Reshards(ctx); err != nil || len(all) != 0 {
		t.Fatalf("Reshards before the intent: %v %v", all, err)
	}
	if cur, err := s.StartReshard(ctx, &Reshard{OpID: "op1", Tenant: "t", Tree: "x", Target: 16}); err != nil || cur != nil {
		t.Fatalf("start: %v %v", cur, err)
	}
	old := "op9 " + strconv.FormatInt(time.Now().Add(-2*reshardIndexGrace).UnixMilli(), 10)
	if err := s.client.HSet(ctx, s.reshardsKey(), "t/y", old).Err(); err != nil {
		t.Fatal(err)
	}
	if all, err := s.Reshards(ctx); err != nil || len(all) != 1 || all[0].OpID != "op1" {
		t.Fatalf("Reshards: %v %v, want op1", all, err)
	}
	if left, _ := s.client.HKeys(ctx, s.reshardsKey()).Result(); !slices.Equal(left, []string{"t/x"}) {
		t.Fatalf("index after listing: %v, want only t/x (the old orphan dropped)", left)
	}
}

func TestLease(t *testing.T) {
	s, mr := newTestStore(t)
	ctx := context.Background()
	steps := []struct {
		owner string
		want  bool
	}{{"p1", true}, {"p2", false}, {"p1", true}}
	for _, st := range steps {
		got, err := s.AcquireLease(ctx, "t", "x", st.owner, time.Minute)
		if err != nil || got != st.want {
			t.Fatalf("%s: got %v %v, want %v", st.owner, got, err, st.want)
		}
	}
	mr.FastForward(61 * time.Second)
	if got, _ := s.AcquireLease(ctx, "t", "x", "p2", time.Minute); !got {
		t.Fatal("an expired lease was not taken over")
	}
	if err := s.ReleaseLease(ctx, "t", "x", "p1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.AcquireLease(ctx, "t", "x", "p1", time.Minute); got {
		t.Fatal("a release by a former owner freed the lease")
	}
	if err := s.ReleaseLease(ctx, "t", "x", "p2"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.AcquireLease(ctx, "t", "x", "p1", time.Minute); !got {
		t.Fatal("a released lease could not be taken")
	}
}

func TestProxyRegistryAndAcks(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	if err := s.RegisterProxy(ctx, "p1", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterProxy(ctx, "p2", time.Now().Add(-time.Second)); err != nil { // already expired
		t.Fatal(err)
	}
	live, err := s.LiveProxies(ctx)
	if err != nil || !slices.Equal(live, []string{"p1"}) {
		t.Fatalf("live: %v %v", live, err)
	}
	for _, e := range []uint64{3, 5, 4} {
		if err := s.AckEpoch(ctx, "t", "x", "p1", e); err != nil {
			t.Fatal(err)
		}
	}
	acks, err := s.Acks(ctx, "t", "x")
	if err != nil || acks["p1"] != 5 || len(acks) != 1 {
		t.Fatalf("acks: %v %v, want p1 at 5 (never backwards)", acks, err)
	}
	if err := s.ServeTenants(ctx, "p1", time.Now().Add(time.Minute), "t", "u"); err != nil {
		t.Fatal(err)
	}
	if err := s.ServeTenants(ctx, "p2", time.Now().Add(-time.Second), "t"); err != nil { // already expired
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tenant string
		want   []string
	}{{"t", []string{"p1"}}, {"u", []string{"p1"}}, {"v", nil}} {
		if got, err := s.TenantProxies(ctx, tc.tenant); err != nil || !slices.Equal(got, tc.want) {
			t.Fatalf("proxies of %s: %v %v, want %v", tc.tenant, got, err, tc.want)
		}
	}
	// p4 serves only another tenant: a freeze of t does not wait for it.
	if err := s.RegisterProxy(ctx, "p3", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := s.ServeTenants(ctx, "p3", time.Now().Add(time.Minute), "t"); err != nil {
		t.Fatal(err)
	}
	if err := s.ServeTenants(ctx, "p4", time.Now().Add(time.Minute), "u"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		epoch uint64
		want  []string
	}{{5, []string{"p3"}}, {6, []string{"p1", "p3"}}} {
		lag, err := s.Lagging(ctx, "t", "x", c.epoch)
		slices.Sort(lag.Lagging)
		if err != nil || !slices.Equal(lag.Lagging, c.want) {
			t.Fatalf("lagging behind epoch %d: %v %v, want %v (p2 expired, p1 acknowledged 5, p3 nothing, p4 serves u)", c.epoch, lag.Lagging, err, c.want)
		}
		slices.Sort(lag.Live)
		if !slices.Equal(lag.Live, []string{"p1", "p3"}) {
			t.Fatalf("live with the lag: %v, want [p1 p3] (p2 expired, p4 never registered as live)", lag.Live)
		}
	}
	if err := s.UnregisterProxy(ctx, "p3", "t"); err != nil {
		t.Fatal(err)
	}
	if err := s.UnregisterProxy(ctx, "p4", "u"); err != nil {
		t.Fatal(err)
	}
	if err := s.UnregisterProxy(ctx, "p1", "t", "u"); err != nil {
		t.Fatal(err)
	}
	if live, _ := s.LiveProxies(ctx); len(live) != 0 {
		t.Fatalf("after unregister: %v", live)
	}
	for _, tenant := range []string{"t", "u"} {
		if got, _ := s.TenantProxies(ctx, tenant); len(got) != 0 {
			t.Fatalf("after unregister, proxies of %s: %v", tenant, got)
		}
	}
}

// TestLateRenewalKeepsTheRegistration: a heartbeat's renewal can reach
// Redis after a newer one (go-redis retries a pipeline after a read
// timeout; a closed connection's kernel still delivers what it had sent
// once a one-way partition heals). It must not take the registration back:
// a proxy live in the global registry but missing from its tenant's would
// be neither lagging nor cut off, and a freeze would pass without it.
func TestLateRenewalKeepsTheRegistration(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	fresh, late := now.Add(time.Minute), now.Add(-time.Second)
	for _, tc := range []struct {
		name string
		late func(s *RedisStore) error
	}{
		{"tenant renewal", func(s *RedisStore) error { return s.ServeTenants(ctx, "p", late, "t") }},
		{"live renewal", func(s *RedisStore) error { return s.RegisterProxy(ctx, "p", late) }},
		{"both", func(s *RedisStore) error {
			if err := s.ServeTenants(ctx, "p", late, "t"); err != nil {
				return err
			}
			return s.RegisterProxy(ctx, "p", late)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestStore(t)
			if err := s.ServeTenants(ctx, "p", fresh, "t"); err != nil {
				t.Fatal(err)
			}
			if err := s.RegisterProxy(ctx, "p", fresh); err != nil {
				t.Fatal(err)
			}
			if err := tc.late(s); err != nil {
				t.Fatal(err)
			}
			lag, err := s.Lagging(ctx, "t", "x", 1)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(lag.Live, []string{"p"}) || !slices.Equal(lag.Lagging, []string{"p"}) {
				t.Fatalf("after a late renewal: live %v, lagging %v; want p live and lagging (it never acknowledged)", lag.Live, lag.Lagging)
			}
		})
	}
	// A late renewal of a proxy already gone does not bring it back.
	s, _ := newTestStore(t)
	if err := s.ServeTenants(ctx, "gone", late, "t"); err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterProxy(ctx, "gone", late); err != nil {
		t.Fatal(err)
	}
	if lag, err := s.Lagging(ctx, "t", "x", 1); err != nil || len(lag.Live) != 0 || len(lag.Lagging) != 0 {
		t.Fatalf("a late renewal of a gone proxy: %+v %v", lag, err)
	}
}

func TestDeleteTreeClearsCoordination(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	mustCreate(t, s, "t", "x")
	if err := s.PutMigration(ctx, &Migration{ID: "m", Tenant: "t", Tree: "x", Phase: PhasePrepare}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StartReshard(ctx, &Reshard{OpID: "o", Tenant: "t", Tree: "x", Target: 8}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTree(ctx, "t", "x"); err != nil {
		t.Fatal(err)
	}
	if m, _ := s.Migrations(ctx, "t", "x"); len(m) != 0 {
		t.Fatalf("%d migration records outlived the tree", len(m))
	}
	if _, err := s.Reshard(ctx, "t", "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the reshard outlived the tree: %v", err)
	}
}

func TestClusterIDIsCreatedOnce(t *testing.T) {
	s, mr := newTestStore(t)
	ctx := context.Background()
	first, err := s.ClusterID(ctx)
	if err != nil || len(first) != 8 {
		t.Fatalf("cluster id %q (%v), want 8 hex digits", first, err)
	}
	// Another store over the same Redis, as another proxy has, reads it.
	other := NewRedisStore(redis.NewClient(&redis.Options{Addr: mr.Addr()}), "test")
	defer other.Close()
	if again, err := other.ClusterID(ctx); err != nil || again != first {
		t.Fatalf("second read %q (%v), want %q", again, err, first)
	}
}
