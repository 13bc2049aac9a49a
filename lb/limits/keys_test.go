package limits

import (
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newTestKeys(t testing.TB, keys ...APIKey) *Keys {
	t.Helper()
	ks, err := NewKeys(keys)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func TestLookup(t *testing.T) {
	ks := newTestKeys(t, APIKey{Name: "a", SHA256: HashKey("sk-a")}, APIKey{Name: "b", SHA256: HashKey("sk-b")})
	f := func(header, wantKey string, want Limit) {
		t.Helper()
		k, d := ks.Lookup([]byte(header), nil)
		name := ""
		if k != nil {
			name = k.Name
		}
		if name != wantKey || d.Limit != want {
			t.Fatalf("Lookup(%q) = %q, %v; want %q, %v", header, name, d.Limit, wantKey, want)
		}
	}
	f("Bearer sk-a", "a", None)
	f("bearer sk-b", "b", None)
	f("BEARER   sk-a  ", "a", None)
	f("  Bearer sk-a", "a", None)
	f("", "", MissingKey)
	f("Bearer", "", MissingKey)
	f("Bearer ", "", MissingKey)
	f("Basic c2stYQ==", "", MissingKey)
	f("sk-a", "", MissingKey)
	f("Bearer sk-c", "", UnknownKey)
	f("Bearer sk-a ", "a", None)
	f("Bearer sk-aa", "", UnknownKey)
	f("Bearer sk-", "", UnknownKey)
	f("Bearer "+HashKey("sk-a"), "", UnknownKey) // the stored digest is not a key

	// Anthropic's SDKs send the key alone in x-api-key; a request's
	// bearer Authorization, when it sends one, is the one read, and one
	// of another scheme holds no key.
	for _, c := range []struct {
		authorization, apiKey, want string
		limit                       Limit
	}{
		{"", "sk-a", "a", None},
		{" ", "sk-a", "a", None},
		{"", " sk-b ", "b", None},
		{"Bearer sk-a", "sk-b", "a", None},
		{"Basic c2stYQ==", "sk-a", "a", None},
		{"Bearer ", "sk-a", "a", None},
		{"Bearer sk-c", "sk-a", "", UnknownKey},
		{"", "sk-c", "", UnknownKey},
		{"", "", "", MissingKey},
	} {
		k, d := ks.Lookup([]byte(c.authorization), []byte(c.apiKey))
		name := ""
		if k != nil {
			name = k.Name
		}
		if name != c.want || d.Limit != c.limit {
			t.Errorf("Lookup(%q, x-api-key %q) = %q, %v; want %q, %v", c.authorization, c.apiKey, name, d.Limit, c.want, c.limit)
		}
	}

	// No keys: everything passes with no key.
	for _, off := range []*Keys{nil, newTestKeys(t)} {
		if k, d := off.Lookup(nil, nil); k != nil || !d.OK() || off.Enabled() {
			t.Fatalf("keys off: %v %v", k, d)
		}
	}
	var nilKey *Key
	if d := nilKey.Admit(time.Now(), 1<<30); !d.OK() {
		t.Fatal("a nil key refused")
	}
	nilKey.Done(time.Now(), 5)
}

// TestAdmit steps a key through its limits on a fake clock. Each step is
// admit(prompt) or done(completion) at an offset from t0, with the
// expected limit and Retry-After.
func TestAdmit(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	type step struct {
		at        time.Duration
		done      bool
		tokens    int
		want      Limit
		wantAfter time.Duration
	}
	f := func(name string, cfg APIKey, steps []step) {
		t.Helper()
		cfg.Name, cfg.SHA256 = name, HashKey(name)
		k, _ := newTestKeys(t, cfg).Lookup([]byte("Bearer "+name), nil)
		for i, s := range steps {
			now := t0.Add(s.at)
			if s.done {
				k.Done(now, s.tokens)
				continue
			}
			d := k.Admit(now, s.tokens)
			if d.Limit != s.want || d.RetryAfter != s.wantAfter {
				t.Fatalf("%s step %d (%+v): got %v after %v", name, i, s, d.Limit, d.RetryAfter)
			}
		}
	}
	// 60 requests a minute: a burst of 60, then one a second.
	burst := make([]step, 0, 63)
	for range 60 {
		burst = append(burst, step{})
	}
	burst = append(burst, step{want: RequestsPerMinute, wantAfter: time.Second},
		step{at: 500 * time.Millisecond, want: RequestsPerMinute, wantAfter: 500 * time.Millisecond},
		step{at: time.Second}, step{at: time.Second, want: RequestsPerMinute, wantAfter: time.Second})
	f("rpm", APIKey{RequestsPerMinute: 60}, burst)

	// 600 tokens a minute (one per 100 ms): prompts charge at admission,
	// completions at Done and may run into debt.
	f("tpm", APIKey{TokensPerMinute: 600}, []step{
		{tokens: 500},
		{tokens: 100},
		{tokens: 1, want: TokensPerMinute, wantAfter: 100 * time.Millisecond},
		{at: time.Second, tokens: 10},
		{at: time.Second, done: true, tokens: 90},
		{at: time.Second, tokens: 1, want: TokensPerMinute, wantAfter: 9100 * time.Millisecond},
		{at: 10100 * time.Millisecond, tokens: 1},
		{at: 10100 * time.Millisecond, tokens: 601, want: RequestTooLarge},
		{at: time.Hour, tokens: 600},
	})

	// Two in flight at most; Done frees a slot.
	f("conc", APIKey{MaxConcurrent: 2}, []step{
		{}, {}, {want: Concurrency, wantAfter: time.Second},
		{done: true}, {}, {want: Concurrency, wantAfter: time.Second},
	})

	// A refusal by a later limit gives back what earlier ones took: the
	// token refusals below leave the slot and the request unused.
	f("mixed", APIKey{RequestsPerMinute: 2, TokensPerMinute: 60, MaxConcurrent: 1}, []step{
		{tokens: 70, want: RequestTooLarge},
		{tokens: 60},
		{tokens: 1, want: Concurrency, wantAfter: time.Second},
		{done: true},
		{tokens: 1, want: TokensPerMinute, wantAfter: time.Second},
		{tokens: 1, want: TokensPerMinute, wantAfter: time.Second},
		{at: time.Second, tokens: 1},
		{at: time.Second, done: true},
		{at: 2 * time.Second, tokens: 1, want: RequestsPerMinute, wantAfter: 28 * time.Second},
	})

	// No limits: anything goes.
	f("free", APIKey{}, []step{{tokens: 1 << 40}, {tokens: 1 << 40}, {done: true, tokens: 1 << 40}})
}

func TestDecisionError(t *testing.T) {
	ks := newTestKeys(t, APIKey{Name: "team-a", SHA256: HashKey("sk-secret"), RequestsPerMinute: 1, TokensPerMinute: 10, MaxConcurrent: 1})
	k, _ := ks.Lookup([]byte("Bearer sk-secret"), nil)
	now := time.Unix(1_700_000_000, 0)
	f := func(d Decision, status int, typ, code, inMsg string, retryAfter int) {
		t.Helper()
		if d.RetryAfterSeconds() != retryAfter {
			t.Fatalf("%v: Retry-After %d, want %d", d.Limit, d.RetryAfterSeconds(), retryAfter)
		}
		e := d.Error()
		if e.Status != status || e.Type != typ || e.Code != code || !strings.Contains(e.Message, inMsg) || strings.Contains(e.Message, "sk-secret") {
			t.Fatalf("%v: %+v", d.Limit, e)
		}
		var body struct {
			Error struct{ Message, Type, Code string }
		}
		if err := json.Unmarshal(e.AppendJSON(nil), &body); err != nil || body.Error.Type != typ {
			t.Fatalf("%v: body %s: %v", d.Limit, e.AppendJSON(nil), err)
		}
	}
	_, d := ks.Lookup(nil, nil)
	f(d, 401, "invalid_request_error", "invalid_api_key", "didn't provide an API key", 0)
	_, d = ks.Lookup([]byte("Bearer nope"), nil)
	f(d, 401, "invalid_request_error", "invalid_api_key", "Incorrect API key", 0)
	f(k.Admit(now, 11), 429, "tokens", "rate_limit_exceeded", "Request too large for key team-a on tokens per minute (TPM): limit 10, requested 11", 0)
	if !k.Admit(now, 10).OK() {
		t.Fatal("first request refused")
	}
	f(k.Admit(now, 1), 429, "requests", "rate_limit_exceeded", "key team-a on concurrent requests: limit 1", 1)
	k.Done(now, 0)
	f(k.Admit(now, 1), 429, "requests", "rate_limit_exceeded", "key team-a on requests per minute (RPM): limit 1. Please try again in 1m0s.", 60)
	now = now.Add(time.Minute)
	k.Done(now, 3)
	f(k.Admit(now, 8), 429, "tokens", "rate_limit_exceeded", "key team-a on tokens per minute (TPM): limit 10. Please try again in 6s.", 6)
	if e := (Decision{}).Error(); e != nil {
		t.Fatalf("admitted request has an error %v", e)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	f := func(l Limit, after time.Duration, want int) {
		t.Helper()
		if got := (Decision{Limit: l, RetryAfter: after}).RetryAfterSeconds(); got != want {
			t.Fatalf("%v %v: %d, want %d", l, after, got, want)
		}
	}
	f(RequestsPerMinute, 0, 1)
	f(RequestsPerMinute, time.Nanosecond, 1)
	f(RequestsPerMinute, time.Second, 1)
	f(RequestsPerMinute, time.Second+1, 2)
	f(TokensPerMinute, 59500*time.Millisecond, 60)
	f(Concurrency, time.Second, 1)
	f(None, time.Second, 0)
	f(MissingKey, time.Second, 0)
	f(RequestTooLarge, time.Second, 0)
}

func TestLimitString(t *testing.T) {
	for l := None; l < numLimits; l++ {
		if l.String() == "" || l.String() == "invalid" {
			t.Fatalf("limit %d has no name", l)
		}
	}
	if numLimits.String() != "invalid" {
		t.Fatal(numLimits.String())
	}
}

// TestAdmitAllocs checks the per-request path allocates nothing: Lookup,
// Admit (admitted and refused) and Done.
func TestAdmitAllocs(t *testing.T) {
	ks := newTestKeys(t, APIKey{Name: "a", SHA256: HashKey("sk-a"), RequestsPerMinute: 1 << 30, TokensPerMinute: 1 << 30, MaxConcurrent: 1})
	header := []byte("Bearer sk-a")
	now := time.Now()
	lines := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(1000, func() {
		k, d := ks.Lookup(header, nil)
		if !d.OK() {
			t.Fatal(d.Limit)
		}
		if d = k.Admit(now, 100); !d.OK() {
			t.Fatal(d.Limit)
		}
		lines = d.AppendHeaders(lines[:0], OpenAI)
		if d = k.Admit(now, 100); d.OK() {
			t.Fatal("concurrency cap not applied")
		}
		lines = d.AppendHeaders(lines[:0], Anthropic)
		k.Done(now, 10)
	}); n != 0 {
		t.Fatalf("%v allocations per request", n)
	}
}

// TestAdmitConcurrent runs admissions from many goroutines (run it with
// -race): the concurrency cap is never exceeded, the request bucket admits
// exactly its allowance, and every slot is back at the end.
func TestAdmitConcurrent(t *testing.T) {
	const workers, each, rpm, maxConc = 8, 500, 1000, 3
	ks := newTestKeys(t, APIKey{Name: "a", SHA256: HashKey("sk-a"), RequestsPerMinute: rpm, MaxConcurrent: maxConc})
	k, _ := ks.Lookup([]byte("Bearer sk-a"), nil)
	// A frozen clock: the bucket never refills, so exactly rpm requests can
	// be admitted however they interleave.
	now := time.Unix(1_700_000_000, 0)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, peak := 0, int64(0)
	// What holds a slot, counted by the test: k.InFlight also counts, for
	// an instant, an Admit that is about to be refused.
	var holding atomic.Int64
	for range workers {
		wg.Go(func() {
			for range each {
				d := k.Admit(now, 0)
				if !d.OK() {
					if d.Limit != Concurrency && d.Limit != RequestsPerMinute {
						t.Errorf("refused by %v", d.Limit)
					}
					continue
				}
				in := holding.Add(1)
				mu.Lock()
				admitted++
				peak = max(peak, in)
				mu.Unlock()
				holding.Add(-1)
				k.Done(now, 0)
			}
		})
	}
	wg.Wait()
	if admitted != rpm || peak > maxConc || k.InFlight() != 0 {
		t.Fatalf("admitted %d (want %d), peak in flight %d (cap %d), in flight at end %d", admitted, rpm, peak, maxConc, k.InFlight())
	}
}

// TestReload: a key kept by a reload is the same *Key, keeping its
// requests in flight and the units it took, counted at its new rate; a
// renamed or new key starts anew, and a removed one is unknown.
func TestReload(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	a := APIKey{Name: "a", SHA256: HashKey("sk-a"), RequestsPerMinute: 4, MaxConcurrent: 3}
	b := APIKey{Name: "b", SHA256: HashKey("sk-b"), RequestsPerMinute: 1}
	ks := newTestKeys(t, a, b)
	ka, _ := ks.Lookup([]byte("Bearer sk-a"), nil)
	kb, _ := ks.Lookup([]byte("Bearer sk-b"), nil)
	for range 2 {
		if d := ka.Admit(t0, 0); !d.OK() {
			t.Fatal(d.Limit)
		}
	}
	kb.Admit(t0, 0)
	f := func(cfg []APIKey, want func(next *Keys)) {
		t.Helper()
		next, err := ks.Reload(cfg)
		if err != nil {
			t.Fatal(err)
		}
		next.Install(t0)
		want(next)
		ks = next
	}
	// Halved: the two requests taken are the whole minute's.
	a.RequestsPerMinute = 2
	f([]APIKey{a, {Name: "b2", SHA256: b.SHA256, RequestsPerMinute: 1}}, func(next *Keys) {
		if k, _ := next.Lookup([]byte("Bearer sk-a"), nil); k != ka || k.InFlight() != 2 {
			t.Fatalf("a kept key is %p (was %p), %d in flight", k, ka, k.InFlight())
		}
		if d := ka.Admit(t0, 0); d.Limit != RequestsPerMinute || d.RetryAfter != 30*time.Second {
			t.Fatalf("after halving: %v after %v", d.Limit, d.RetryAfter)
		}
		if k, d := next.Lookup([]byte("Bearer sk-b"), nil); k == kb || k.Name != "b2" || !k.Admit(t0, 0).OK() {
			t.Fatalf("a renamed key: %v %v", k, d)
		}
	})
	// Doubled twice: room for six more at once.
	a.RequestsPerMinute = 8
	f([]APIKey{a}, func(next *Keys) {
		if _, d := next.Lookup([]byte("Bearer sk-b"), nil); d.Limit != UnknownKey {
			t.Fatalf("a removed key: %v", d.Limit)
		}
		ka.Done(t0, 0)
		ka.Done(t0, 0)
		for i := range 7 {
			d := ka.Admit(t0, 0)
			if d.OK() != (i < 6) {
				t.Fatalf("request %d after raising: %v", i, d.Limit)
			}
			if d.OK() {
				ka.Done(t0, 0)
			}
		}
	})
	// Off, then on again: nothing counted while there was no limit.
	a.RequestsPerMinute = 0
	f([]APIKey{a}, func(*Keys) {})
	a.RequestsPerMinute = 1
	f([]APIKey{a}, func(*Keys) {
		if d := ka.Admit(t0, 0); !d.OK() || ka.InFlight() != 1 {
			t.Fatalf("limit back on: %v, %d in flight", d.Limit, ka.InFlight())
		}
	})
}

// TestRefundAcrossReload drives Admit's steps by hand with a reload in
// between: the request taken at the old rate, the buckets rerated by
// Install, then the refund of the token bucket's refusal. The refund
// must never free units other requests took: 30 requests are in the
// bucket besides the refused one.
func TestRefundAcrossReload(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	ns := now.UnixNano()
	f := func(from, to int) {
		t.Helper()
		cfg := APIKey{Name: "a", SHA256: HashKey("sk-a"), RequestsPerMinute: from, TokensPerMinute: 1}
		ks := newTestKeys(t, cfg)
		k := ks.keys[0]
		lim := k.limits.Load()
		for range 30 {
			if d := k.Admit(now, 0); !d.OK() {
				t.Fatal(d.Limit)
			}
		}
		if ok, _ := k.requests.take(lim.requests, ns, 1); !ok {
			t.Fatal("request bucket refused")
		}
		cfg.RequestsPerMinute = to
		next, err := ks.Reload([]APIKey{cfg})
		if err != nil {
			t.Fatal(err)
		}
		next.Install(now)
		k.refundRequest(lim)
		interval := int64(time.Minute) / int64(to)
		if got := k.requests.tat.Load() - ns; got < 30*interval || got > 31*interval {
			t.Fatalf("%d to %d requests a minute: %v of requests left taken, want 30 or 31 of %v",
				from, to, time.Duration(got), time.Duration(interval))
		}
	}
	f(60, 6000)
	f(6000, 60)
}

func TestAppendHeaders(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	f := func(in Dialect, cfg APIKey, prompts []int, want string) {
		t.Helper()
		cfg.Name, cfg.SHA256 = "a", HashKey("sk-a")
		k, _ := newTestKeys(t, cfg).Lookup([]byte("Bearer sk-a"), nil)
		var d Decision
		for _, n := range prompts {
			d = k.Admit(t0, n)
		}
		if got := string(d.AppendHeaders(nil, in)); got != want {
			t.Fatalf("%+v after %v:\n%s\nwant\n%s", cfg, prompts, got, want)
		}
	}
	// Admitted: what is left after this request's take, and how long
	// until the bucket is full again.
	f(OpenAI, APIKey{RequestsPerMinute: 60, TokensPerMinute: 1000}, []int{0, 150},
		"x-ratelimit-limit-requests: 60\r\nx-ratelimit-remaining-requests: 58\r\nx-ratelimit-reset-requests: 2s\r\n"+
			"x-ratelimit-limit-tokens: 1000\r\nx-ratelimit-remaining-tokens: 850\r\nx-ratelimit-reset-tokens: 9s\r\n")
	// The limits the key has, only.
	f(OpenAI, APIKey{TokensPerMinute: 7}, []int{3},
		"x-ratelimit-limit-tokens: 7\r\nx-ratelimit-remaining-tokens: 4\r\nx-ratelimit-reset-tokens: 25.715s\r\n")
	// Refused: nothing taken, and retry-after-ms beside Retry-After.
	f(OpenAI, APIKey{RequestsPerMinute: 1}, []int{0, 0},
		"x-ratelimit-limit-requests: 1\r\nx-ratelimit-remaining-requests: 0\r\nx-ratelimit-reset-requests: 1m0s\r\nretry-after-ms: 60000\r\n")
	f(OpenAI, APIKey{RequestsPerMinute: 2, TokensPerMinute: 600}, []int{550, 100},
		"x-ratelimit-limit-requests: 2\r\nx-ratelimit-remaining-requests: 1\r\nx-ratelimit-reset-requests: 30s\r\n"+
			"x-ratelimit-limit-tokens: 600\r\nx-ratelimit-remaining-tokens: 50\r\nx-ratelimit-reset-tokens: 55s\r\nretry-after-ms: 5000\r\n")
	// Too large: no retry helps; no retry-after-ms, and the SDKs are told
	// not to.
	f(OpenAI, APIKey{TokensPerMinute: 10}, []int{11},
		"x-ratelimit-limit-tokens: 10\r\nx-ratelimit-remaining-tokens: 10\r\nx-ratelimit-reset-tokens: 0s\r\nx-should-retry: false\r\n")
	// A key with only a concurrency cap: its refusal's wait alone.
	f(OpenAI, APIKey{MaxConcurrent: 1}, []int{0, 0}, "retry-after-ms: 1000\r\n")
	// No rate limits, or none at all: no lines, as for keys off.
	f(OpenAI, APIKey{MaxConcurrent: 1}, []int{0}, "")
	f(OpenAI, APIKey{}, []int{0}, "")
	// Anthropic's names, each reset the moment the bucket is full again,
	// rounded up to the second: t0 is 2023-11-14T22:13:20Z.
	f(Anthropic, APIKey{RequestsPerMinute: 60, TokensPerMinute: 1000}, []int{0, 150},
		"anthropic-ratelimit-requests-limit: 60\r\nanthropic-ratelimit-requests-remaining: 58\r\nanthropic-ratelimit-requests-reset: 2023-11-14T22:13:22Z\r\n"+
			"anthropic-ratelimit-tokens-limit: 1000\r\nanthropic-ratelimit-tokens-remaining: 850\r\nanthropic-ratelimit-tokens-reset: 2023-11-14T22:13:29Z\r\n")
	f(Anthropic, APIKey{TokensPerMinute: 7}, []int{3},
		"anthropic-ratelimit-tokens-limit: 7\r\nanthropic-ratelimit-tokens-remaining: 4\r\nanthropic-ratelimit-tokens-reset: 2023-11-14T22:13:46Z\r\n")
	f(Anthropic, APIKey{RequestsPerMinute: 1}, []int{0, 0},
		"anthropic-ratelimit-requests-limit: 1\r\nanthropic-ratelimit-requests-remaining: 0\r\nanthropic-ratelimit-requests-reset: 2023-11-14T22:14:20Z\r\nretry-after-ms: 60000\r\n")
	f(Anthropic, APIKey{TokensPerMinute: 10}, []int{11},
		"anthropic-ratelimit-tokens-limit: 10\r\nanthropic-ratelimit-tokens-remaining: 10\r\nanthropic-ratelimit-tokens-reset: 2023-11-14T22:13:20Z\r\nx-should-retry: false\r\n")
	f(Anthropic, APIKey{MaxConcurrent: 1}, []int{0}, "")
	if got := (Decision{}).AppendHeaders(nil, Anthropic); len(got) != 0 {
		t.Fatalf("no key: %q", got)
	}
}

// TestAppendDuration checks the reset format against time.Duration's
// String, which OpenAI's values follow.
func TestAppendDuration(t *testing.T) {
	f := func(d time.Duration) {
		t.Helper()
		want := ((d + time.Millisecond - 1) / time.Millisecond * time.Millisecond).String()
		if got := string(appendDuration(nil, d)); got != want {
			t.Fatalf("%d ns: %q, want %q", int64(d), got, want)
		}
	}
	for ms := range 130_000 {
		f(time.Duration(ms) * time.Millisecond)
	}
	for _, d := range []time.Duration{1, 999_999, time.Millisecond + 1, 59*time.Second + 1, time.Hour, 25*time.Hour + 1500*time.Millisecond} {
		f(d)
	}
	if got := string(appendDuration(nil, -time.Second)); got != "0s" {
		t.Fatalf("negative: %q", got)
	}
}
