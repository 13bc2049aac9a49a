package limits

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// syncScript is one exchange of the keys' buckets with the other replicas:
// it adds each bucket's cost taken on this replica since the last exchange
// to the bucket the replicas share, and returns the shared tat of every
// bucket any replica took units from lately: the others are full. An
// exchange is numbered, and one whose number is not above the last its
// replica got added adds nothing: an exchange whose reply was lost is sent
// again, and Redis may have added it already.
//
//	KEYS[1]   the buckets taken from lately (sorted set, score: when the
//	          bucket is full and gone, unix µs)
//	KEYS[2]   the number of this replica's last exchange added
//	ARGV[1]   this replica's clock, unix µs
//	ARGV[2]   how long a full bucket is kept, ms
//	ARGV[3]   the buckets' key prefix
//	ARGV[4]   this exchange's number (unused when it carries no cost)
//	ARGV[5]   how long the number is kept, ms
//	ARGV[6..] pairs of a bucket's name and its cost since the last
//	          exchange, µs (negative: a refund)
//
// It returns {name, tat, name, tat, ...}. Microseconds keep the values
// exact in Lua's doubles (2^53 µs is 285 years). Units taken from a full
// bucket count from the exchange on, up to an interval after they were
// taken: their refill starts that much late.
var syncScript = redis.NewScript(`
local now, keep, pre = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
if #ARGV > 5 and tonumber(ARGV[4]) > tonumber(redis.call('GET', KEYS[2]) or 0) then
  redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5])
  for i = 6, #ARGV, 2 do
    local k, c = pre .. ARGV[i], tonumber(ARGV[i + 1])
    local tat = tonumber(redis.call('GET', k) or 0)
    if c > 0 then tat = math.max(tat, now) end
    tat = tat + c
    local ttl = math.floor(math.max(tat - now, 0) / 1000) + keep
    redis.call('SET', k, string.format('%.0f', tat), 'PX', ttl)
    redis.call('ZADD', KEYS[1], now + ttl * 1000, ARGV[i])
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], keep * 2)
local out = {}
for _, name in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local tat = redis.call('GET', pre .. name)
  if tat then
    out[#out + 1] = name
    out[#out + 1] = tat
  end
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
// alone, and the units it took then are shared once Redis is back. An
// exchange reads only the buckets some replica took from in the last
// minute, so a key set of thousands costs what its busy keys cost.
// Replicas share a key's buckets by a hash of its digest, under the
// prefix; give them the same api_keys.
type Sync struct {
	keys func() *Keys
	rdb  redis.UniversalClient
	// The script's KEYS: the recently used buckets, and the number of
	// this replica's last exchange (its name random, made once).
	scriptKeys []string
	prefix     string
	interval   time.Duration
	log        *slog.Logger
	down       atomic.Bool // the last exchange failed; written by Run's goroutine alone

	// The set last exchanged and its limited buckets by their names in
	// Redis, made once a set; and the scratch of one exchange. Run's
	// goroutine's, as are seq, the number of the last exchange sent, and
	// unanswered, the arguments of one that failed, to send again before
	// the next (nil: none).
	set        *Keys
	buckets    map[string]*bucket
	args       []any
	tats       []int64
	seq        int64
	unanswered []any
}

// keepFull is how long Redis keeps a bucket that is full: a minute, the
// longest a bucket takes to fill, so a key idle for longer costs nothing.
// keepSeq is how long it keeps a replica's last exchange number: an
// exchange sent again later than that after Redis added it (its reply
// lost, Redis unreachable since) would be added twice.
const (
	keepFull = time.Minute
	keepSeq  = 24 * time.Hour
)

// syncHead is the count of syncScript's arguments before the costs (the
// script's #ARGV > 5: an exchange that carries some).
const syncHead = 5

// NewSync shares the buckets of keys' current set (keys is called at every
// exchange: a reload's set is shared from the next) through rdb every
// interval, under prefix (Redis's hash tag, as the shared ledger's). Give
// rdb the short timeouts of the shared ledger's client.
func NewSync(keys func() *Keys, rdb redis.UniversalClient, prefix string, interval time.Duration, log *slog.Logger) *Sync {
	pre := "{" + prefix + "}:keys:"
	replica := pre + "seq:" + strconv.FormatUint(rand.Uint64(), 36)
	return &Sync{keys: keys, rdb: rdb, scriptKeys: []string{pre + "active", replica}, prefix: pre, interval: interval, log: log}
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
	if ks != s.set {
		s.name(ks)
	}
	if len(s.buckets) == 0 && s.unanswered == nil {
		return
	}
	err := s.resend(ctx)
	if err == nil && len(s.buckets) > 0 {
		s.args = append(s.args[:0], time.Now().UnixMicro(), keepFull.Milliseconds(), s.prefix, 0, keepSeq.Milliseconds())
		for name, b := range s.buckets {
			ns := b.unsynced.Swap(0)
			us := ns / 1000
			b.unsynced.Add(ns - us*1000) // the rest, for the next
			if us != 0 {
				s.args = append(s.args, name, us)
			}
		}
		costs := len(s.args) > syncHead
		if costs {
			s.seq++
			s.args[3] = s.seq
		}
		err = s.send(ctx, s.args)
		if err != nil && costs {
			// Redis may have added the units, its reply lost: sent again
			// under the same number, they are added once.
			s.unanswered = slices.Clone(s.args)
		}
	}
	if err != nil {
		if ctx.Err() == nil && !s.down.Swap(true) {
			s.log.Warn("api_keys: rate limits not shared (Redis unreachable or failing): each replica limits its keys alone", "err", err)
		}
		return
	}
	if s.down.Swap(false) {
		s.log.Info("api_keys: rate limits shared again")
	}
}

// resend sends again the exchange whose reply did not come, if any.
func (s *Sync) resend(ctx context.Context) error {
	if s.unanswered == nil {
		return nil
	}
	// Its units count from now, as every exchange's.
	s.unanswered[0] = time.Now().UnixMicro()
	if err := s.send(ctx, s.unanswered); err != nil {
		return err
	}
	s.unanswered = nil
	return nil
}

// send runs the exchange of args and adopts the shared buckets it returns.
func (s *Sync) send(ctx context.Context, args []any) error {
	res, err := syncScript.Run(ctx, s.rdb, s.scriptKeys, args...).StringSlice()
	if err != nil {
		return err
	}
	return s.adopt(res)
}

// Up reports whether the last exchange worked (true before the first).
func (s *Sync) Up() bool { return !s.down.Load() }

// name names the limited buckets of ks, the set to exchange from now on
// (its limits installed): a bucket's name is a hash of its key's digest,
// not the digest, which signs the ids made for the key (TagID) and must
// not be readable by whoever can read Redis.
func (s *Sync) name(ks *Keys) {
	s.set, s.buckets = ks, map[string]*bucket{}
	if ks == nil {
		return
	}
	for _, k := range ks.keys {
		sum := sha256.Sum256(append([]byte("pdlb rate-limit buckets\x00"), k.digest[:]...))
		base := hex.EncodeToString(sum[:16])
		lim := k.limits.Load()
		for _, b := range []struct {
			b      *bucket
			r      rate
			suffix string
		}{{&k.requests, lim.requests, ":requests"}, {&k.tokens, lim.tokens, ":tokens"}} {
			if b.r.limited() {
				s.buckets[base+b.suffix] = b.b
			}
		}
	}
}

var errBadReply = errors.New("malformed reply from Redis")

// adopt takes the shared buckets of an exchange's reply, {name, tat, ...}
// (unix µs), into the set's.
func (s *Sync) adopt(res []string) error {
	if len(res)%2 != 0 {
		return errBadReply
	}
	s.tats = s.tats[:0]
	for i := 1; i < len(res); i += 2 {
		tat, err := strconv.ParseInt(res[i], 10, 64)
		if err != nil {
			return errBadReply
		}
		s.tats = append(s.tats, tat)
	}
	for i, tat := range s.tats {
		if b := s.buckets[res[2*i]]; b != nil {
			b.adopt(tat * 1000)
		}
	}
	return nil
}
