package proxy

import "crypto/rand"

// The salt shown for a user that does not exist must be what any proxy of
// the deployment shows for that name, at any time, as for a real user;
// else comparing two proxies' answers, or one proxy's before and after a
// restart, tells which names exist. So it is derived from a secret the
// deployment keeps (SetMockSecret, from Redis), and the exchange shows the
// iteration count the real users have.

// processMockKey serves until SetMockSecret is called (and for Handshake
// used alone, as in tests).
var processMockKey = func() []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}()

// SetMockSecret makes the salts of unknown users derive from secret, which
// every proxy of the deployment shares.
func (u *Users) SetMockSecret(secret []byte) { u.mockKey = secret }

// mockVerifier is the verifier shown for a user that does not exist: its
// salt stable per name, and keys no proof hashes to.
func (u *Users) mockVerifier(name string) scramVerifier {
	key := u.mockKey
	if key == nil {
		key = processMockKey
	}
	return scramVerifier{
		iterations: u.mockIterations(),
		salt:       hmacSHA256(key, name)[:scramSaltLen],
		storedKey:  make([]byte, 32),
		serverKey:  make([]byte, 32),
	}
}

// mockIterations is the iteration count most of the real users have (the
// lowest of the most common, for a stable answer), or PostgreSQL's default.
func (u *Users) mockIterations() int {
	counts := map[int]int{}
	best, bestN := scramIterations, 0
	for _, user := range u.byName {
		counts[user.verifier.iterations]++
	}
	for it, n := range counts {
		if n > bestN || n == bestN && it < best {
			best, bestN = it, n
		}
	}
	return best
}
