package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// syncScript is one sync round trip: replace this replica's published
// load, refresh its membership, and return every other live replica's
// load. TIME is Redis's, so the ages of all replicas are extrapolated on
// one clock, whatever the replicas' clocks say.
//
//	KEYS[1] replica set (sorted set, score = expiry ms)
//	KEYS[2] this replica's hash: field pod key, value "tokens seqs ageMs
//	        active kv inFlight queued" (Shared.args);
//	        field "@at" = Redis ms when written
//	ARGV[1] replica id, ARGV[2] expiry ms, ARGV[3] hash key prefix,
//	ARGV[4..] field/value pairs
//
// It returns {now_ms, hash, hash, ...}, one flat field/value array per other
// replica. Every key shares the {prefix} hash tag, so a cluster keeps them
// in one slot. unpack bounds a replica to about 3,900 pods with load.
var syncScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('DEL', KEYS[2])
if #ARGV > 3 then
  redis.call('HSET', KEYS[2], '@at', now, unpack(ARGV, 4))
  redis.call('PEXPIRE', KEYS[2], ttl)
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local out = {now}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if id ~= ARGV[1] then
    local h = redis.call('HGETALL', ARGV[3] .. id)
    if #h > 0 then out[#out + 1] = h end
  end
end
return out
`)

// DefaultKeyPrefix is SharedOptions.KeyPrefix's default.
const DefaultKeyPrefix = "pdlb"

// SharedOptions configures a Shared.
type SharedOptions struct {
	// ReplicaID names this gateway replica (default: 16 random hex digits).
	// Replicas sharing a ledger need distinct ids.
	ReplicaID string
	// KeyPrefix namespaces the Redis keys (default "pdlb"); replicas of one
	// gateway share it.
	KeyPrefix string
	// Interval and Expiry are Config's shared_sync_interval_ms and
	// shared_expiry_ms (defaults 50 ms and 2 s).
	Interval, Expiry time.Duration
	// Logger receives the unreachable / reachable-again messages (default
	// slog.Default()).
	Logger *slog.Logger
}

// Shared shares the ledger with the other gateway replicas through Redis.
// A background loop publishes this replica's per-pod load (decode and
// prefill charges, and the pod's own requests in flight and queued prefill
// tokens; with an expiry, so a dead replica's load vanishes) and reads the
// others' in the same round trip; Decode, Prefill and Remote add them to
// the local counters, so the replicas route as one. Pods are matched by
// Member.Key. No routing decision waits on Redis: while it is unreachable
// each replica scores with its own load only, and sharing resumes when it
// returns.
type Shared struct {
	l        *Ledger
	rdb      redis.UniversalClient
	id       string
	keys     []string // replica set, own hash
	hashPre  string
	interval time.Duration
	expiryMs int64
	log      *slog.Logger
	down     atomic.Bool // the last round trip failed; written by the loop goroutine alone
}

// NewReplicaID returns a new replica id: 16 random hex digits.
func NewReplicaID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NewShared shares l through rdb. Give rdb short timeouts (dial, read and
// write of a few sync intervals), MaxRetries -1 and DialerRetries 1: a sync
// that fails is simply tried again on the next tick, and Redis going away
// should stop the sharing within a tick or two.
func NewShared(l *Ledger, rdb redis.UniversalClient, o SharedOptions) *Shared {
	if o.ReplicaID == "" {
		o.ReplicaID = NewReplicaID()
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	if o.Interval <= 0 {
		o.Interval = DefaultSharedSyncIntervalMs * time.Millisecond
	}
	if o.Expiry <= 0 {
		o.Expiry = DefaultSharedExpiryMs * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	pre := "{" + o.KeyPrefix + "}:decode:"
	return &Shared{
		l:        l,
		rdb:      rdb,
		id:       o.ReplicaID,
		keys:     []string{pre + "replicas", pre + "r:" + o.ReplicaID},
		hashPre:  pre + "r:",
		interval: o.Interval,
		expiryMs: o.Expiry.Milliseconds(),
		log:      o.Logger,
	}
}

// Run syncs every Interval until ctx ends, then withdraws this replica's
// charges so the others stop counting them at once.
func (s *Shared) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.sync(ctx)
		select {
		case <-ctx.Done():
			s.withdraw()
			return
		case <-t.C:
		}
	}
}

// sync is one round trip; on failure the remote view is cleared (stale
// load is worse than none) and the failure logged once until a sync works.
func (s *Shared) sync(ctx context.Context) {
	nowMs := s.l.now() / int64(time.Millisecond)
	res, err := syncScript.Run(ctx, s.rdb, s.keys, s.args(nowMs)...).Slice()
	if err == nil {
		var remote map[string]remoteLoad
		if remote, err = parseRemote(res, nowMs); err == nil {
			s.l.setRemote(remote)
			if s.down.Swap(false) {
				s.log.Info("ledger: shared decode ledger reachable again", slog.String("replica", s.id))
			}
			return
		}
	}
	if ctx.Err() != nil {
		return
	}
	s.l.setRemote(nil)
	if !s.down.Swap(true) {
		s.log.Warn("ledger: shared decode ledger unreachable, scoring with this replica's charges only",
			slog.String("replica", s.id), slog.Any("err", err))
	}
}

// Up reports whether the last round trip worked (true before the first).
func (s *Shared) Up() bool { return !s.down.Load() }

// args builds the script's ARGV: this replica's load per pod key as of
// nowMs (ledger clock): "tokens seqs ageMs active kv inFlight queued", the
// decode charges, the prefill charges and the pod's own counts. Replicas
// before seqs published requests there and ageMs summed over requests:
// a reader extrapolates the age by the count beside it either way, so
// mixed releases read each other, the older ones' growth per request.
func (s *Shared) args(nowMs int64) []any {
	args := []any{s.id, s.expiryMs, s.hashPre}
	s.l.mu.Lock()
	sums := s.l.sumBy(podKey, func(p *pod) (counters, bool) {
		sl := p.slot
		v := counters{sl.decode.Load(), sl.decodeSeqs.Load(), 0, sl.active.Load(), sl.kv.Load()}
		v[2] = v[1]*nowMs - sl.routedMs.Load()
		if p.load != nil {
			v[5], v[6] = p.load.InFlight(), p.load.QueuedPrefill()
		}
		return v, v != counters{}
	})
	s.l.mu.Unlock()
	for _, n := range sums {
		v := n.v
		args = append(args, n.pod.key, fmt.Sprintf("%d %d %d %d %d %d %d", v[0], v[1], v[2], v[3], v[4], v[5], v[6]))
	}
	return args
}

var errBadReply = errors.New("ledger: malformed shared-ledger reply")

// parseRemote sums the other replicas' hashes per pod, with their ages
// brought forward to the reply's Redis time and stamped with the local
// clock's asOfMs.
func parseRemote(res []any, asOfMs int64) (map[string]remoteLoad, error) {
	if len(res) == 0 {
		return nil, errBadReply
	}
	now, ok := res[0].(int64)
	if !ok {
		return nil, errBadReply
	}
	out := map[string]remoteLoad{}
	for _, h := range res[1:] {
		kv, ok := h.([]any)
		if !ok || len(kv)%2 != 0 {
			return nil, errBadReply
		}
		at := now
		for i := 0; i < len(kv); i += 2 {
			if kv[i] == "@at" {
				v, _ := kv[i+1].(string)
				if at, ok = parseInt(v); !ok {
					return nil, errBadReply
				}
			}
		}
		for i := 0; i < len(kv); i += 2 {
			key, _ := kv[i].(string)
			v, _ := kv[i+1].(string)
			if key == "@at" {
				continue
			}
			// A replica of an older release publishes the decode charges
			// alone: the first three fields; one of a later release may
			// add fields after the seventh, which are not read here.
			var n [7]int64
			f := strings.Fields(v)
			if len(f) != 3 && len(f) < len(n) {
				return nil, errBadReply
			}
			for j := range min(len(f), len(n)) {
				if n[j], ok = parseInt(f[j]); !ok {
					return nil, errBadReply
				}
			}
			r := out[key]
			r.tokens += n[0]
			r.seqs += n[1]
			r.ageMs += n[2] + n[1]*(now-at)
			r.active += n[3]
			r.kv += n[4]
			r.inFlight += n[5]
			r.queued += n[6]
			r.asOfMs = asOfMs
			out[key] = r
		}
	}
	return out, nil
}

func parseInt(s string) (int64, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

// withdraw deletes this replica's published charges on shutdown.
func (s *Shared) withdraw() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s.rdb.Del(ctx, s.keys[1])
	s.rdb.ZRem(ctx, s.keys[0], s.id)
}

// setRemote installs the other replicas' load per pod key; nil clears it.
func (l *Ledger) setRemote(remote map[string]remoteLoad) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.pods {
		r, ok := remote[p.key]
		if !ok {
			if p.slot.remote.Load() != nil {
				p.slot.remote.Store(nil)
			}
			continue
		}
		p.slot.remote.Store(&r)
	}
}
