package ledger

import (
	"strings"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v3"
)

// sessionTable remembers each session's last prompt size per model, for the
// session-delta rule: a chat resends its whole history each turn, but an
// engine still holding the conversation's KV computes only the new turn.
// Bounded (max keys, 256-byte keys, TTL) so a client cannot grow it.
type sessionTable struct {
	m   *xsync.MapOf[sessionKey, session]
	n   atomic.Int64 // keys stored; kept exact under the bucket locks of Compute
	ttl int64        // ns; 0 turns the rule off
	max int64
}

type sessionKey struct{ model, key string }

type session struct {
	tokens int64 // last prompt size (tokens)
	at     int64 // when seen, ledger-clock nanoseconds
}

func (t *sessionTable) init(ttl, max int64) {
	t.m = xsync.NewMapOf[sessionKey, session]()
	t.ttl, t.max = ttl, max
}

// delta records tokens as the session's last prompt size and returns the
// growth since the previous one, when that was seen within the TTL and was
// shorter. ok is false when the rule does not apply: no key, the rule off,
// a key over MaxSessionKeySize, a new session, or a full table (the new key
// is then not stored).
func (t *sessionTable) delta(model, key string, tokens, now int64) (d int64, ok bool) {
	if key == "" || t.ttl == 0 || len(key) > MaxSessionKeySize {
		return 0, false
	}
	// The table keeps its keys, and the caller's strings may be views of
	// pooled request buffers.
	k := sessionKey{strings.Clone(model), strings.Clone(key)}
	t.m.Compute(k, func(old session, loaded bool) (session, bool) {
		if loaded {
			if now-old.at <= t.ttl && old.tokens < tokens {
				d, ok = tokens-old.tokens, true
			}
			return session{tokens, now}, false
		}
		if t.n.Add(1) > t.max {
			t.n.Add(-1)
			return old, true // delete: do not store
		}
		return session{tokens, now}, false
	})
	return d, ok
}

// expire forgets the sessions last seen more than the TTL before now.
func (t *sessionTable) expire(now int64) {
	if t.ttl == 0 {
		return
	}
	t.m.Range(func(k sessionKey, s session) bool {
		if now-s.at > t.ttl {
			// Re-check under the bucket lock: a turn may have refreshed it.
			t.m.Compute(k, func(old session, loaded bool) (session, bool) {
				if loaded && now-old.at > t.ttl {
					t.n.Add(-1)
					return old, true
				}
				return old, !loaded
			})
		}
		return true
	})
}

// len returns the number of stored sessions.
func (t *sessionTable) len() int { return int(t.n.Load()) }
