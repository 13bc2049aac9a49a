package limits

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"net/http"
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
	// key is the key refused, for the error message (nil for key errors).
	key *Key
	// requested is the prompt of a RequestTooLarge refusal, tokens.
	requested int64
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
			Message: fmt.Sprintf("Rate limit reached for key %s on concurrent requests: limit %d. Retry when one of them finishes.", d.key.Name, d.key.maxConcurrent)}
	case RequestsPerMinute:
		return openai.RateLimited(fmt.Sprintf("key %s on requests per minute (RPM): limit %d. Please try again in %s.", d.key.Name, d.key.requests.perMinute, d.RetryAfter.Round(time.Millisecond)))
	case TokensPerMinute:
		e := openai.RateLimited(fmt.Sprintf("key %s on tokens per minute (TPM): limit %d. Please try again in %s.", d.key.Name, d.key.tokens.perMinute, d.RetryAfter.Round(time.Millisecond)))
		e.Type = typeTokens
		return e
	}
	return &openai.Error{Status: http.StatusTooManyRequests, Type: typeTokens, Code: openai.CodeRateLimited,
		Message: fmt.Sprintf("Request too large for key %s on tokens per minute (TPM): limit %d, requested %d. Send a shorter prompt.", d.key.Name, d.key.tokens.perMinute, d.requested)}
}

// Keys is the set of client API keys. A nil *Keys, or one built from no
// keys, requires none: Lookup admits every request with a nil *Key.
// Safe for concurrent use; the set itself is immutable (a reload builds a
// new one).
type Keys struct {
	byHash map[[sha256.Size]byte]*Key
	keys   []*Key
	// refused counts MissingKey and UnknownKey answers.
	refused [UnknownKey + 1]atomic.Uint64
}

// Key is one client key's state: its buckets and requests in flight. A nil
// *Key (keys off) admits everything.
type Key struct {
	Name          string
	requests      bucket
	tokens        bucket
	maxConcurrent int64
	inFlight      atomic.Int64
	limited       [numLimits]atomic.Uint64
}

// NewKeys builds the key set of validated configuration entries.
func NewKeys(cfg []APIKey) (*Keys, error) {
	ks := &Keys{byHash: make(map[[sha256.Size]byte]*Key, len(cfg))}
	for i, c := range cfg {
		sum, err := parseDigest(c.SHA256)
		if err != nil {
			return nil, invalid(fmt.Sprintf("api_keys[%d].sha256", i), c.SHA256, "must be 64 hex digits")
		}
		k := &Key{Name: c.Name, requests: newBucket(c.RequestsPerMinute), tokens: newBucket(c.TokensPerMinute), maxConcurrent: int64(c.MaxConcurrent)}
		ks.byHash[sum] = k
		ks.keys = append(ks.keys, k)
	}
	return ks, nil
}

// Enabled reports whether requests must carry a key.
func (ks *Keys) Enabled() bool { return ks != nil && len(ks.keys) > 0 }

var bearer = []byte("bearer")

// Lookup finds the key of a request from its Authorization header value
// ("Bearer <key>", the scheme in any case), or, when it sent none, from
// its x-api-key header's (apiKey: the key alone, as Anthropic's SDKs send
// it). It allocates nothing: the
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
	scheme, token, _ := bytes.Cut(bytes.TrimSpace(authorization), []byte{' '})
	token = bytes.TrimSpace(token)
	if len(bytes.TrimSpace(authorization)) == 0 {
		// None sent, or only spaces (an HTTP/2 value is not trimmed).
		scheme, token = bearer, bytes.TrimSpace(apiKey)
	}
	if len(token) == 0 || !bytes.EqualFold(scheme, bearer) {
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
	n := int64(promptTokens)
	if !k.tokens.fits(n) {
		return k.refuse(Decision{Limit: RequestTooLarge, requested: n})
	}
	if c := k.inFlight.Add(1); k.maxConcurrent > 0 && c > k.maxConcurrent {
		k.inFlight.Add(-1)
		// When a slot frees is unknown; a second is a short, typical wait.
		return k.refuse(Decision{Limit: Concurrency, RetryAfter: time.Second})
	}
	ns := now.UnixNano()
	ok, wait := k.requests.take(ns, 1)
	if !ok {
		k.release()
		return k.refuse(Decision{Limit: RequestsPerMinute, RetryAfter: wait})
	}
	if ok, wait = k.tokens.take(ns, n); !ok {
		k.requests.refund(1)
		k.release()
		return k.refuse(Decision{Limit: TokensPerMinute, RetryAfter: wait})
	}
	return Decision{}
}

// Done ends a request Admit admitted: it frees the concurrency slot and
// charges the completion tokens the pod produced to the token bucket.
func (k *Key) Done(now time.Time, completionTokens int) {
	if k == nil {
		return
	}
	k.tokens.charge(now.UnixNano(), int64(completionTokens))
	k.release()
}

func (k *Key) release() { k.inFlight.Add(-1) }

func (k *Key) refuse(d Decision) Decision {
	k.limited[d.Limit].Add(1)
	d.key = k
	return d
}

// InFlight is the number of the key's requests between Admit and Done.
func (k *Key) InFlight() int64 { return k.inFlight.Load() }
