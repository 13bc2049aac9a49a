package limits

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// syncScript is one exchange of the keys' buckets with the other replicas:
// it adds each bucket's cost taken on this replica since the last exchange
// to the bucket the replicas share, and returns every shared bucket's tat.
//
//	KEYS[i]   bucket i's shared tat, unix µs (none: full)
//	ARGV[1]   this replica's clock, unix µs
//	ARGV[2]   how long a full bucket is kept, ms
//	ARGV[2+i] bucket i's cost since the last exchange, µs (negative: a
//	          refund)
//
// Microseconds keep the values exact in Lua's doubles (2^53 µs is 285
// years). A bucket expires once full for ARGV[2]: then it reads as full.
var syncScript = redis.NewScript(`
local now, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i, k in ipairs(KEYS) do
  local tat = tonumber(redis.call('GET', k) or 0)
  local c = tonumber(ARGV[2 + i])
  if c ~= 0 then
    if c > 0 then tat = math.max(tat, now) end
    tat = tat + c
    redis.call('SET', k, string.format('%.0f', tat), 'PX', math.floor(math.max(tat - now, 0) / 1000) + keep)
  end
  out[i] = tat
end
return out
`)

// Sync shares the keys' rate-limit buckets with the other gateway replicas
// through Redis, so that a key gets its limits across them all, not at
// each: every interval it adds the units each replica took to the shared
// bucket and takes the others' into its own. No request waits on Redis: a
// replica admits on its own bucket, which lags the others' units by an
// interval at most (behind N replicas a key may get N intervals of its
// allowance more a minute); while Redis is unreachable each replica limits
// alone, and the units it took then are shared once Redis is back.
// Replicas share a key's buckets by a hash of its digest, under the
// prefix; give them the same api_keys.
type Sync struct {
	keys     func() *Keys
	rdb      redis.UniversalClient
	prefix   string
	interval time.Duration
	log      *slog.Logger
	down     bool // the last exchange failed; only Run's goroutine touches it

	// The set last exchanged and its keys' names in Redis, made once a
	// set; and the scratch of one exchange. Run's goroutine's.
	set   *Keys
	base  [][2]string // requests', tokens'
	names []string
	args  []any
	sent  []sentCost
}

type sentCost struct {
	b  *bucket
	us int64
}

// keepFull is how long Redis keeps a bucket that is full: a minute, the
// longest a bucket takes to fill, so a key idle for longer costs nothing.
const keepFull = time.Minute

// NewSync shares the buckets of keys' current set (keys is called at every
// exchange: a reload's set is shared from the next) through rdb every
// interval, under prefix (Redis's hash tag, as the shared ledger's). Give
// rdb the short timeouts of the shared ledger's client.
func NewSync(keys func() *Keys, rdb redis.UniversalClient, prefix string, interval time.Duration, log *slog.Logger) *Sync {
	return &Sync{keys: keys, rdb: rdb, prefix: "{" + prefix + "}:keys:", interval: interval, log: log}
}

// Run exchanges every interval until ctx ends.
func (s *Sync) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.Exchange(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Exchange is one exchange with Redis, made by Run every interval (and by
// tests at will); a failed one is logged once until one works.
func (s *Sync) Exchange(ctx context.Context) {
	ks := s.keys()
	if !ks.Enabled() {
		return
	}
	if ks != s.set {
		s.set, s.base = ks, s.base[:0]
		for _, k := range ks.keys {
			name := s.prefix + sharedName(k)
			s.base = append(s.base, [2]string{name + ":requests", name + ":tokens"})
		}
	}
	s.names, s.sent = s.names[:0], s.sent[:0]
	s.args = append(s.args[:0], time.Now().UnixMicro(), keepFull.Milliseconds())
	for i, k := range ks.keys {
		lim := k.limits.Load()
		s.add(&k.requests, lim.requests, s.base[i][0])
		s.add(&k.tokens, lim.tokens, s.base[i][1])
	}
	if len(s.names) == 0 {
		return
	}
	tats, err := syncScript.Run(ctx, s.rdb, s.names, s.args...).Int64Slice()
	if err == nil && len(tats) != len(s.sent) {
		err = errBadReply
	}
	if err != nil {
		// Shared at the next exchange that works.
		for _, c := range s.sent {
			c.b.unsynced.Add(c.us * 1000)
		}
		if !s.down && ctx.Err() == nil {
			s.down = true
			s.log.Warn("api_keys: rate limits not shared, Redis unreachable: each replica limits its keys alone", "err", err)
		}
		return
	}
	for i, c := range s.sent {
		c.b.adopt(tats[i] * 1000)
	}
	if s.down {
		s.down = false
		s.log.Info("api_keys: rate limits shared again")
	}
}

var errBadReply = errors.New("malformed reply from Redis")

// sharedName names k's buckets in Redis: a hash of its digest, not the
// digest itself, which signs the ids made for k (TagID) and must not be
// readable by whoever can read Redis.
func sharedName(k *Key) string {
	sum := sha256.Sum256(append([]byte("pdlb rate-limit buckets\x00"), k.digest[:]...))
	return hex.EncodeToString(sum[:16])
}

// add puts bucket b, limited at r and named name in Redis, in the
// exchange: its cost since the last one, in whole µs (the rest stays for
// the next).
func (s *Sync) add(b *bucket, r rate, name string) {
	if !r.limited() {
		return
	}
	ns := b.unsynced.Swap(0)
	us := ns / 1000
	b.unsynced.Add(ns - us*1000)
	s.names = append(s.names, name)
	s.args = append(s.args, us)
	s.sent = append(s.sent, sentCost{b, us})
}
