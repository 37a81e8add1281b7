package shardmap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// AutonomicStatus is what a tree's split monitor and healer did at their
// last pass, and why, as the proxy holding the tree's lease wrote it, so
// that lattice_reshard_status and the page of any proxy report it.
type AutonomicStatus struct {
	Monitor string    `json:"monitor"`
	Healer  string    `json:"healer"`
	Proxy   string    `json:"proxy"`
	At      time.Time `json:"at"`
}

// AutonomicStatuses keeps the autonomic status of each tree. RedisStore
// implements it.
type AutonomicStatuses interface {
	// PutAutonomic stores st for the tree until ttl passes without
	// another pass: a status no proxy renews is gone, not stale.
	PutAutonomic(ctx context.Context, tenant, tree string, st *AutonomicStatus, ttl time.Duration) error
	// Autonomic returns the tree's status, nil if none is stored.
	Autonomic(ctx context.Context, tenant, tree string) (*AutonomicStatus, error)
}

var _ AutonomicStatuses = (*RedisStore)(nil)

func (s *RedisStore) autonomicKey(tenant, tree string) string {
	return s.tenantTag(tenant) + ":autonomic:" + tree
}

// PutAutonomic implements AutonomicStatuses.
func (s *RedisStore) PutAutonomic(ctx context.Context, tenant, tree string, st *AutonomicStatus, ttl time.Duration) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if err := s.client.Set(ctx, s.autonomicKey(tenant, tree), b, ttl).Err(); err != nil {
		return fmt.Errorf("shardmap: autonomic status of %s/%s: %w", tenant, tree, err)
	}
	return nil
}

// Autonomic implements AutonomicStatuses.
func (s *RedisStore) Autonomic(ctx context.Context, tenant, tree string) (*AutonomicStatus, error) {
	b, err := s.client.Get(ctx, s.autonomicKey(tenant, tree)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("shardmap: autonomic status of %s/%s: %w", tenant, tree, err)
	}
	var st AutonomicStatus
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("shardmap: autonomic status of %s/%s: %w", tenant, tree, err)
	}
	return &st, nil
}
