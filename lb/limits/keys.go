package limits

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"pdlb/lb/openai"
)

// Limit names what refused a request; None admits it.
type Limit uint8

// The limits, in the order Lookup and Admit check them.
const (
	None Limit = iota
	// MissingKey: keys are configured and the request carries none.
	MissingKey
	// UnknownKey: the bearer token is no configured key.
	UnknownKey
	// Concurrency: the key has max_concurrent requests in flight.
	Concurrency
	// RequestsPerMinute: the key's request bucket is empty.
	RequestsPerMinute
	// TokensPerMinute: the key's token bucket cannot take the prompt now.
	TokensPerMinute
	// RequestTooLarge: the prompt alone is more than the key's
	// tokens_per_minute, so no wait would let it through.
	RequestTooLarge
	numLimits
)

var limitNames = [numLimits]string{"none", "missing_key", "unknown_key", "max_concurrent", "requests_per_minute", "tokens_per_minute", "request_too_large"}

// String is the limit's name as configuration and metrics spell it.
func (l Limit) String() string {
	if l < numLimits {
		return limitNames[l]
	}
	return "invalid"
}

// Decision is the answer to one request: admitted (Limit None), or refused
// by Limit, to be retried after RetryAfter (0: retrying will not help).
type Decision struct {
	Limit      Limit
	RetryAfter time.Duration
	// key is the key refused and limits its limits then, for the error
	// message (nil for key errors).
	key    *Key
	limits *keyLimits
	// requested is the prompt of a RequestTooLarge refusal, tokens.
	requested int64
	// The key's standing when it was decided (bucket.standing), for its
	// rate-limit headers: requests and tokens left, and the time until
	// each bucket is full again; zero for a rate the key does not limit.
	requestsLeft, tokensLeft   int64
	requestsReset, tokensReset time.Duration
	// at is when it was decided, unix ns: Anthropic's resets are moments.
	at int64
}

// OK reports whether the request is admitted.
func (d Decision) OK() bool { return d.Limit == None }

// RetryAfterSeconds is the Retry-After header's value: RetryAfter rounded
// up to whole seconds, at least 1 for a refusal worth retrying, 0 when
// retrying will not help (no header then).
func (d Decision) RetryAfterSeconds() int {
	switch d.Limit {
	case None, MissingKey, UnknownKey, RequestTooLarge:
		return 0
	}
	return max(int((d.RetryAfter+time.Second-1)/time.Second), 1)
}

// Dialect is the API whose rate-limit headers AppendHeaders writes.
type Dialect uint8

const (
	// OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}, the
	// reset the time until the bucket is full again ("6m0s").
	OpenAI Dialect = iota
	// Anthropic: anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset},
	// the reset the moment the bucket is full again, in RFC 3339.
	Anthropic
)

// RateLimitHeaders are the names of the fields of a key's standing that
// AppendHeaders writes: for each Dialect, in its spelling, limit,
// remaining and reset of its requests, then of its tokens.
var RateLimitHeaders = [...]string{
	"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
	"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens",
	"anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset",
	"anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset",
}

// RetryAfterMillis is the field AppendHeaders adds to a refusal: its wait
// in milliseconds. Not one of RateLimitHeaders: an admitted request's
// standing has no wait, so a pod's answer keeps its own.
const RetryAfterMillis = "retry-after-ms"

// ShouldRetry is the field AppendHeaders sets to false on a refusal that
// no retry gets past, which the SDKs obey over their own retry policy.
const ShouldRetry = "x-should-retry"

// AppendHeaders appends the header lines ("name: value\r\n") that show a
// keyed client its standing, as the API of dialect does on every answer:
// for each of requests_per_minute and tokens_per_minute the key has, its
// allowance (limit), what is left after this request (remaining) and when
// the bucket is full again (reset). OpenAI's reset is the time until
// then, as time.Duration writes it ("1s", "6m0s", "20ms"), Anthropic's
// the moment, rounded up to the second in UTC ("2026-01-02T15:04:05Z").
// Anthropic's tokens-* fields are its most restrictive token limit's,
// which the key's one token bucket (prompts and completions) is. A
// refusal worth retrying adds retry-after-ms, RetryAfter in milliseconds
// rounded up, which the OpenAI and Anthropic SDKs read before
// Retry-After's whole seconds; a RequestTooLarge refusal adds
// x-should-retry: false. A decision without a key's limits (keys off,
// key errors, an admission of a nil *Key) appends nothing. It allocates
// nothing when dst has room.
func (d Decision) AppendHeaders(dst []byte, dialect Dialect) []byte {
	if d.limits == nil {
		return dst
	}
	names := RateLimitHeaders[6*int(dialect):]
	dst = d.appendStanding(dst, dialect, names[0:3], d.limits.requests, d.requestsLeft, d.requestsReset)
	dst = d.appendStanding(dst, dialect, names[3:6], d.limits.tokens, d.tokensLeft, d.tokensReset)
	switch {
	case d.RetryAfterSeconds() > 0:
		ms := (d.RetryAfter + time.Millisecond - 1) / time.Millisecond
		dst = append(append(dst, RetryAfterMillis...), ": "...)
		dst = append(strconv.AppendInt(dst, int64(max(ms, 1)), 10), "\r\n"...)
	case d.Limit == RequestTooLarge:
		// The OpenAI and Anthropic SDKs retry every 429 (twice, by
		// default) unless it says otherwise; no wait lets this through.
		dst = append(dst, ShouldRetry+": false\r\n"...)
	}
	return dst
}

// appendStanding appends the limit, remaining and reset lines, named
// names, of a bucket at rate r (none when r has no limit), the reset as
// dialect writes it.
func (d Decision) appendStanding(dst []byte, dialect Dialect, names []string, r rate, left int64, reset time.Duration) []byte {
	if !r.limited() {
		return dst
	}
	dst = append(append(dst, names[0]...), ": "...)
	dst = append(strconv.AppendInt(dst, r.perMinute, 10), "\r\n"...)
	dst = append(append(dst, names[1]...), ": "...)
	dst = append(strconv.AppendInt(dst, left, 10), "\r\n"...)
	dst = append(append(dst, names[2]...), ": "...)
	if dialect == Anthropic {
		// Rounded up, as the duration is: by then the bucket is full.
		full := (d.at + int64(reset) + int64(time.Second) - 1) / int64(time.Second)
		dst = time.Unix(full, 0).UTC().AppendFormat(dst, time.RFC3339)
	} else {
		dst = appendDuration(dst, reset)
	}
	return append(dst, "\r\n"...)
}

// appendDuration appends d rounded up to the millisecond as
// time.Duration's String writes it ("0s", "20ms", "1.5s", "6m0s",
// "1h0m0s"), without String's allocation. Rounded up, a client that
// waits it finds its bucket full.
func appendDuration(dst []byte, d time.Duration) []byte {
	ms := int64((max(d, 0) + time.Millisecond - 1) / time.Millisecond)
	switch {
	case ms == 0:
		return append(dst, "0s"...)
	case ms < 1000:
		return append(strconv.AppendInt(dst, ms, 10), "ms"...)
	}
	s, frac := ms/1000, ms%1000
	if s >= 3600 {
		dst = append(strconv.AppendInt(dst, s/3600, 10), 'h')
	}
	if s >= 60 {
		dst = append(strconv.AppendInt(dst, s/60%60, 10), 'm')
	}
	dst = strconv.AppendInt(dst, s%60, 10)
	if frac > 0 {
		// Three digits less their trailing zeros: 1.5s, 1.05s, 1.005s.
		digits := [3]byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
		n := 3
		for digits[n-1] == '0' {
			n--
		}
		dst = append(append(dst, '.'), digits[:n]...)
	}
	return append(dst, 's')
}

// OpenAI's error type for a token-rate limit and code for a bad key.
const (
	typeTokens        = "tokens"
	codeInvalidAPIKey = "invalid_api_key"
)

// Error is the refusal in OpenAI's shape: 401 invalid_api_key for a
// missing or unknown key, 429 rate_limit_exceeded (type requests or
// tokens) for a limit. It allocates, so only refusals pay for it; it is nil
// for an admitted request. The key itself never appears in a message.
func (d Decision) Error() *openai.Error {
	switch d.Limit {
	case None:
		return nil
	case MissingKey:
		return &openai.Error{Status: http.StatusUnauthorized, Type: openai.TypeInvalidRequest, Code: codeInvalidAPIKey,
			Message: "You didn't provide an API key. Send it in an Authorization header (Authorization: Bearer YOUR_KEY) or an x-api-key header."}
	case UnknownKey:
		return &openai.Error{Status: http.StatusUnauthorized, Type: openai.TypeInvalidRequest, Code: codeInvalidAPIKey,
			Message: "Incorrect API key provided."}
	case Concurrency:
		return &openai.Error{Status: http.StatusTooManyRequests, Type: openai.TypeRequests, Code: openai.CodeRateLimited,
			Message: fmt.Sprintf("Rate limit reached for key %s on concurrent requests: limit %d. Retry when one of them finishes.", d.key.Name, d.limits.maxConcurrent)}
	case RequestsPerMinute:
		return openai.RateLimited(fmt.Sprintf("key %s on requests per minute (RPM): limit %d. Please try again in %s.", d.key.Name, d.limits.requests.perMinute, d.RetryAfter.Round(time.Millisecond)))
	case TokensPerMinute:
		e := openai.RateLimited(fmt.Sprintf("key %s on tokens per minute (TPM): limit %d. Please try again in %s.", d.key.Name, d.limits.tokens.perMinute, d.RetryAfter.Round(time.Millisecond)))
		e.Type = typeTokens
		return e
	}
	return &openai.Error{Status: http.StatusTooManyRequests, Type: typeTokens, Code: openai.CodeRateLimited,
		Message: fmt.Sprintf("Request too large for key %s on tokens per minute (TPM): limit %d, requested %d. Send a shorter prompt.", d.key.Name, d.limits.tokens.perMinute, d.requested)}
}

// Keys is the set of client API keys. A nil *Keys, or one built from no
// keys, requires none: Lookup admits every request with a nil *Key.
// Safe for concurrent use; the set itself is immutable (a reload builds a
// new one, Reload).
type Keys struct {
	byHash map[[sha256.Size]byte]*Key
	keys   []*Key
	// limits are keys[i]'s limits in this set, which Install gives them.
	limits []*keyLimits
	// refused counts MissingKey and UnknownKey answers, across reloads.
	refused *[UnknownKey + 1]atomic.Uint64
}

// Key is one client key's state: its limits, buckets and requests in
// flight. A nil *Key (keys off) admits everything. A key a reload keeps is
// the same *Key, so its requests in flight end on it and its counts go on.
type Key struct {
	Name string
	// digest is the key's SHA-256, which only its holder and the
	// gateway's api_keys know: it signs the ids made for the key (TagID).
	digest   [sha256.Size]byte
	limits   atomic.Pointer[keyLimits]
	requests bucket
	tokens   bucket
	inFlight atomic.Int64
	limited  [numLimits]atomic.Uint64
}

// keyLimits are a key's limits, replaced whole by a reload.
type keyLimits struct {
	requests, tokens rate
	maxConcurrent    int64
}

// NewKeys builds the key set of validated configuration entries.
func NewKeys(cfg []APIKey) (*Keys, error) {
	ks, err := (*Keys)(nil).Reload(cfg)
	if err == nil {
		ks.Install(time.Now())
	}
	return ks, err
}

// Reload builds the key set of validated configuration entries that is to
// follow ks (nil: none): a key of the same digest and name is ks's *Key,
// to take its new limits from Install; others are new. ks is unchanged
// until then, so a reload refused later leaves it whole.
func (ks *Keys) Reload(cfg []APIKey) (*Keys, error) {
	next := &Keys{byHash: make(map[[sha256.Size]byte]*Key, len(cfg)), refused: new([UnknownKey + 1]atomic.Uint64)}
	if ks != nil {
		next.refused = ks.refused
	}
	for i, c := range cfg {
		sum, err := parseDigest(c.SHA256)
		if err != nil {
			return nil, invalid(fmt.Sprintf("api_keys[%d].sha256", i), c.SHA256, "must be 64 hex digits")
		}
		var k *Key
		if ks != nil {
			k = ks.byHash[sum]
		}
		if k == nil || k.Name != c.Name {
			k = &Key{Name: c.Name, digest: sum}
		}
		next.byHash[sum] = k
		next.keys = append(next.keys, k)
		next.limits = append(next.limits, &keyLimits{requests: newRate(c.RequestsPerMinute), tokens: newRate(c.TokensPerMinute), maxConcurrent: int64(c.MaxConcurrent)})
	}
	return next, nil
}

// Install gives ks's keys their limits at now: a kept key whose rate
// changed keeps the units it took this minute (bucket.rerate).
func (ks *Keys) Install(now time.Time) {
	for i, k := range ks.keys {
		to := ks.limits[i]
		if from := k.limits.Swap(to); from != nil && *from != *to {
			k.requests.rerate(from.requests, to.requests, now.UnixNano())
			k.tokens.rerate(from.tokens, to.tokens, now.UnixNano())
		}
	}
}

// TagID makes id k's: its second half becomes a tag of its first (an
// HMAC-SHA256 under k's digest, cut to 8 bytes), which no other key's
// holder can make and any gateway with the same api_keys can check
// (TaggedID).
func (k *Key) TagID(id *[16]byte) {
	copy(id[8:], k.tag(id[:8]))
}

// TaggedID reports whether id was made k's by TagID.
func (k *Key) TaggedID(id [16]byte) bool {
	return hmac.Equal(id[8:], k.tag(id[:8]))
}

func (k *Key) tag(nonce []byte) []byte {
	m := hmac.New(sha256.New, k.digest[:])
	m.Write(nonce)
	return m.Sum(nil)[:8]
}

// Enabled reports whether requests must carry a key.
func (ks *Keys) Enabled() bool { return ks != nil && len(ks.keys) > 0 }

var bearer = []byte("bearer")

// Lookup finds the key of a request from its Authorization header value
// ("Bearer <key>", the scheme in any case), or, when that holds no bearer
// key (none sent, or another scheme's credentials, a proxy's Basic say),
// from its x-api-key header's (apiKey: the key alone, as Anthropic's SDKs
// send it). It allocates nothing: the
// token is hashed into an array on the stack and the map is keyed by the
// digest.
//
// Looking up by digest instead of comparing keys is what makes a timing
// attack useless: how long the lookup takes depends on the digest of what
// the client sent, and learning which digests are present does not help
// find a key whose digest matches (SHA-256 is preimage-resistant).
func (ks *Keys) Lookup(authorization, apiKey []byte) (*Key, Decision) {
	if !ks.Enabled() {
		return nil, Decision{}
	}
	// An HTTP/2 value is not trimmed: only spaces is none sent.
	scheme, token, _ := bytes.Cut(bytes.TrimSpace(authorization), []byte{' '})
	token = bytes.TrimSpace(token)
	if len(token) == 0 || !bytes.EqualFold(scheme, bearer) {
		token = bytes.TrimSpace(apiKey)
	}
	if len(token) == 0 {
		ks.refused[MissingKey].Add(1)
		return nil, Decision{Limit: MissingKey}
	}
	k := ks.byHash[sha256.Sum256(token)]
	if k == nil {
		ks.refused[UnknownKey].Add(1)
		return nil, Decision{Limit: UnknownKey}
	}
	return k, Decision{}
}

// Admit starts a request of promptTokens on k at now: it takes a
// concurrency slot, one request from the request bucket and the prompt from
// the token bucket, or none of them and says which limit refused. An
// admitted request must end with exactly one Done. It allocates nothing.
func (k *Key) Admit(now time.Time, promptTokens int) Decision {
	if k == nil {
		return Decision{}
	}
	lim, n, ns := k.limits.Load(), int64(promptTokens), now.UnixNano()
	if !lim.tokens.fits(n) {
		return k.refuse(lim, ns, Decision{Limit: RequestTooLarge, requested: n})
	}
	if c := k.inFlight.Add(1); lim.maxConcurrent > 0 && c > lim.maxConcurrent {
		k.inFlight.Add(-1)
		// When a slot frees is unknown; a second is a short, typical wait.
		return k.refuse(lim, ns, Decision{Limit: Concurrency, RetryAfter: time.Second})
	}
	ok, wait := k.requests.take(lim.requests, ns, 1)
	if !ok {
		k.release()
		return k.refuse(lim, ns, Decision{Limit: RequestsPerMinute, RetryAfter: wait})
	}
	if ok, wait = k.tokens.take(lim.tokens, ns, n); !ok {
		k.refundRequest(lim)
		k.release()
		return k.refuse(lim, ns, Decision{Limit: TokensPerMinute, RetryAfter: wait})
	}
	return k.decided(lim, ns, Decision{})
}

// Done ends a request Admit admitted: it frees the concurrency slot and
// charges the completion tokens the pod produced to the token bucket.
func (k *Key) Done(now time.Time, completionTokens int) {
	if k == nil {
		return
	}
	k.tokens.charge(k.limits.Load().tokens, now.UnixNano(), int64(completionTokens))
	k.release()
}

func (k *Key) release() { k.inFlight.Add(-1) }

// refundRequest gives back the request Admit took at lim, unless a reload
// has changed the key's request rate since (bucket.refund).
func (k *Key) refundRequest(lim *keyLimits) {
	k.requests.refund(lim.requests, 1, func() bool { return k.limits.Load().requests == lim.requests })
}

func (k *Key) refuse(lim *keyLimits, now int64, d Decision) Decision {
	k.limited[d.Limit].Add(1)
	return k.decided(lim, now, d)
}

// decided is d, for k under lim, with k's standing at now (unix ns).
func (k *Key) decided(lim *keyLimits, now int64, d Decision) Decision {
	d.key, d.limits, d.at = k, lim, now
	if lim.requests.limited() {
		d.requestsLeft, d.requestsReset = k.requests.standing(lim.requests, now)
	}
	if lim.tokens.limited() {
		d.tokensLeft, d.tokensReset = k.tokens.standing(lim.tokens, now)
	}
	return d
}

// InFlight is the number of the key's requests between Admit and Done.
func (k *Key) InFlight() int64 { return k.inFlight.Load() }
