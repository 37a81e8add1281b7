package shardmap

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// DeploymentSecret is a random secret of the deployment named name, made
// by the first proxy that asks and kept in Redis (P:secret:<name>), so
// that every proxy derives the same values from it: the SCRAM salts shown
// for users that do not exist.
func (s *RedisStore) DeploymentSecret(ctx context.Context, name string) ([]byte, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	key := s.prefix + ":secret:" + name
	if err := s.client.SetNX(ctx, key, hex.EncodeToString(b), 0).Err(); err != nil {
		return nil, fmt.Errorf("shardmap: deployment secret %s: %w", name, err)
	}
	v, err := s.client.Get(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("shardmap: deployment secret %s: %w", name, err)
	}
	secret, err := hex.DecodeString(v)
	if err != nil || len(secret) < 16 {
		return nil, fmt.Errorf("shardmap: deployment secret %s is malformed in Redis", name)
	}
	return secret, nil
}
