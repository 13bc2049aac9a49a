package ledger

import (
	"log/slog"
	"time"
)

// sweep is one janitor pass at the ledger clock's now.
func (l *Ledger) sweep() {
	now := l.now()
	l.expireCharges(now)
	l.sessions.expire(now)
	l.dropIdle(now)
}

// expireCharges force-releases every charge older than the TTL: its release
// never arrived (a lost callback, a bug), and it must not pin load on a pod
// for ever. A late release of it is then a no-op.
func (l *Ledger) expireCharges(now int64) {
	for _, e := range l.charges.takeOlder(now-l.ttl, nil) {
		e.c.release()
		l.log.Warn("ledger: charge outlived its TTL, force-released",
			slog.Uint64("request_id", e.id),
			slog.Duration("age", time.Duration(now-e.c.at)),
			slog.Duration("ttl", time.Duration(l.ttl)),
			slog.String("prefill_pod", l.nameOf(e.c.prefill)),
			slog.String("decode_pod", l.nameOf(e.c.decode)),
			slog.Int64("active_tokens", e.c.active),
			slog.Int64("kv_tokens", e.c.kv),
			slog.Int64("decode_tokens", e.c.decodeTokens))
	}
}

// dropIdle drops the pods that sat at zero, untouched, for IdleDropAfter:
// their series vanish and OnDrop is told. A pod the gateway still has stays
// registered and comes back with its next charge; one it no longer has is
// forgotten.
func (l *Ledger) dropIdle(now int64) {
	var dropped []string
	var forgot []*pod
	l.mu.Lock()
	kept := l.pods[:0]
	for _, p := range l.pods {
		s := p.slot
		ops := s.ops.Load()
		switch {
		case !s.zero():
			p.zeroSince = -1
		case ops != p.seenOps || p.zeroSince < 0:
			// Charged and released since the last sweep: zero from now on.
			p.zeroSince = now
		}
		p.seenOps = ops
		idle := p.zeroSince >= 0 && now-p.zeroSince >= int64(IdleDropAfter)
		if idle && !s.dropped.Load() {
			// Mark, then re-check: a charge racing with us either sees the
			// mark and clears it, or is seen here and the drop is undone.
			s.dropped.Store(true)
			if s.ops.Load() != p.seenOps || !s.zero() {
				s.dropped.Store(false)
				idle = false
			} else {
				dropped = append(dropped, p.name)
			}
		}
		if idle && !p.live {
			delete(l.byID, p.slot.id)
			forgot = append(forgot, p)
			continue
		}
		kept = append(kept, p)
	}
	clear(l.pods[len(kept):])
	l.pods = kept
	// A forgotten pod's charges stay in its name's counter while another
	// pod of that name (its successor) is registered.
	for _, f := range forgot {
		for _, p := range kept {
			if p.name == f.name {
				p.carried += f.slot.ops.Load() + f.carried
				break
			}
		}
	}
	l.mu.Unlock()
	if l.onDrop != nil {
		for _, name := range dropped {
			l.onDrop(name)
		}
	}
}

// nameOf returns the name of the pod whose slot is s, "" for none.
func (l *Ledger) nameOf(s *podSlot) string {
	if s == nil {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.pods {
		if p.slot == s {
			return p.name
		}
	}
	return ""
}
