package lb_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"pdlb/internal/redistest"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/limits"
)

// TestRateLimitHeaders: a keyed client sees its key's standing as
// OpenAI's API shows it, on every answer (a whole 200, a streamed one,
// the 429 that refuses it, with retry-after-ms beside Retry-After), on
// both front ends, over HTTP/1.1 with a connection per request and a kept
// one (the event loop writes the head itself), and over h2. A key with no
// rate limit gets none of the fields.
func TestRateLimitHeaders(t *testing.T) {
	const stream = `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":8,"stream":true}`
	clients := rateClients()
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := rateGateway(t, fe, clients, limits.APIKey{Name: "free", SHA256: limits.HashKey("sk-free"), MaxConcurrent: 10})
			for _, via := range clients {
				t.Run(via.name, func(t *testing.T) {
					auth := "Bearer sk-" + via.name
					// Each admitted request takes one of 3 requests a
					// minute: 20s more until the bucket is full again.
					for i, c := range []struct {
						body   string
						status int
						left   int64
					}{{chatBody, 200, 2}, {stream, 200, 1}, {chatBody, 200, 0}, {chatBody, 429, 0}} {
						resp, b := send(t, via.c, s, "POST", "/v1/chat/completions", c.body, "Content-Type", "application/json", "Authorization", auth)
						if resp.StatusCode != c.status {
							t.Fatalf("request %d: %d %s, want %d", i, resp.StatusCode, b, c.status)
						}
						h := resp.Header
						f := answerFields{t: t, i: i, h: h}
						duration := func(name string) time.Duration {
							t.Helper()
							d, err := time.ParseDuration(f.field(name))
							if err != nil {
								t.Fatalf("request %d: %s: %v", i, name, err)
							}
							return d
						}
						if f.number("x-ratelimit-limit-requests") != 3 || f.number("x-ratelimit-limit-tokens") != 100 {
							t.Fatalf("request %d: limits %v", i, h)
						}
						if n := f.number("x-ratelimit-remaining-requests"); n != c.left {
							t.Fatalf("request %d: %d requests left, want %d", i, n, c.left)
						}
						taken := min(i+1, 3)
						if d := duration("x-ratelimit-reset-requests"); d > time.Duration(taken)*20*time.Second || d <= time.Duration(taken)*20*time.Second-5*time.Second {
							t.Fatalf("request %d: requests reset in %v, want %d x 20s less the time the test took", i, d, taken)
						}
						// Prompts (and completions, charged at their end)
						// of about 10 tokens, each 6s to refill: never
						// the whole minute's, never full again.
						if n, d := f.number("x-ratelimit-remaining-tokens"), duration("x-ratelimit-reset-tokens"); n < 0 || n >= 100 || d <= 0 || d > time.Minute {
							t.Fatalf("request %d: %d tokens left, reset in %v", i, n, d)
						}
						if c.status == 200 {
							if v := h.Values("retry-after-ms"); len(v) != 0 {
								t.Fatalf("request %d: a 200 with retry-after-ms %q", i, v)
							}
							continue
						}
						// The next request frees 20s after the first was
						// taken: Retry-After is its whole seconds.
						ms := f.number("retry-after-ms")
						if ms <= 0 || ms > 20_000 || h.Get("Retry-After") != strconv.FormatInt((ms+999)/1000, 10) {
							t.Fatalf("refused: retry-after-ms %d, Retry-After %q", ms, h.Get("Retry-After"))
						}
					}
					resp, b := send(t, via.c, s, "POST", "/v1/chat/completions", chatBody, "Content-Type", "application/json", "Authorization", "Bearer sk-free")
					if resp.StatusCode != 200 {
						t.Fatalf("a key without rate limits: %d %s", resp.StatusCode, b)
					}
					for name := range resp.Header {
						if _, ok := rateLimitFields[http.CanonicalHeaderKey(name)]; ok {
							t.Fatalf("a key without rate limits got %s: %q", name, resp.Header.Get(name))
						}
					}
				})
			}
		})
	}
}

var rateLimitFields = func() map[string]bool {
	m := map[string]bool{}
	for _, name := range append(limits.RateLimitHeaders[:], limits.RetryAfterMillis) {
		m[http.CanonicalHeaderKey(name)] = true
	}
	return m
}()

// TestRateLimitHeadersReplacePods: the rate-limit fields of a pod (an
// OpenAI-compatible proxy behind the gateway, say) give way to the
// gateway's own for a key it limits, so the client reads one value; a
// request its key does not limit gets the pod's, as it would without
// the gateway.
func TestRateLimitHeadersReplacePods(t *testing.T) {
	pod := fakePod(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-RateLimit-Limit-Requests: 999\r\nx-ratelimit-remaining-tokens: 5\r\nContent-Length: %d\r\n\r\n%s", len(okAnswer), okAnswer)
	})
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod}}, func(c *config.Config) {
				c.Frontend = fe
				c.Access.APIKeys = []limits.APIKey{
					{Name: "rated", SHA256: limits.HashKey("sk-rated"), RequestsPerMinute: 10},
					{Name: "free", SHA256: limits.HashKey("sk-free")},
				}
			})
			bothClients(t, func(t *testing.T, via *http.Client) {
				f := func(key, limit, tokens string) {
					t.Helper()
					resp, b := send(t, via, s, "POST", "/v1/chat/completions", chatBody, "Content-Type", "application/json", "Authorization", "Bearer "+key)
					if resp.StatusCode != 200 {
						t.Fatalf("%s: %d %s", key, resp.StatusCode, b)
					}
					if got := resp.Header.Values("x-ratelimit-limit-requests"); len(got) != 1 || got[0] != limit {
						t.Fatalf("%s: x-ratelimit-limit-requests %q, want %q", key, got, limit)
					}
					if got := resp.Header.Get("x-ratelimit-remaining-tokens"); got != tokens {
						t.Fatalf("%s: x-ratelimit-remaining-tokens %q, want %q", key, got, tokens)
					}
				}
				f("sk-rated", "10", "")
				f("sk-free", "999", "5")
			})
		})
	}
}

// TestRateLimitHeadersMessages: on Anthropic's Messages API a keyed
// client sees its standing as Anthropic's API shows it, on every answer
// and both front ends, over HTTP/1.1 and h2:
// anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}, the
// reset the whole second (RFC 3339, UTC) by which the bucket is full
// again, and none of OpenAI's names; its 429 carries retry-after, and
// retry-after-ms, which Anthropic's SDKs read first.
func TestRateLimitHeadersMessages(t *testing.T) {
	const (
		body   = `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hello there"}]}`
		stream = `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hello there"}]}`
	)
	clients := rateClients()
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := rateGateway(t, fe, clients)
			for _, via := range clients {
				t.Run(via.name, func(t *testing.T) {
					for i, c := range []struct {
						body   string
						status int
						left   int64
					}{{body, 200, 2}, {stream, 200, 1}, {body, 200, 0}, {body, 429, 0}} {
						resp, b := send(t, via.c, s, "POST", "/v1/messages", c.body, "Content-Type", "application/json", "x-api-key", "sk-"+via.name, "anthropic-version", "2023-06-01")
						now := time.Now()
						if resp.StatusCode != c.status {
							t.Fatalf("request %d: %d %s, want %d", i, resp.StatusCode, b, c.status)
						}
						h := resp.Header
						f := answerFields{t: t, i: i, h: h}
						// As Anthropic's API writes it: 2025-08-21T12:40:59Z.
						reset := func(name string) time.Duration {
							t.Helper()
							v := f.field(name)
							at, err := time.Parse(time.RFC3339, v)
							if err != nil || !strings.HasSuffix(v, "Z") || at.Nanosecond() != 0 {
								t.Fatalf("request %d: %s %q, want a whole second in UTC (%v)", i, name, v, err)
							}
							return at.Sub(now)
						}
						if f.number("anthropic-ratelimit-requests-limit") != 3 || f.number("anthropic-ratelimit-tokens-limit") != 100 {
							t.Fatalf("request %d: limits %v", i, h)
						}
						if n := f.number("anthropic-ratelimit-requests-remaining"); n != c.left {
							t.Fatalf("request %d: %d requests left, want %d", i, n, c.left)
						}
						// Each admitted request takes 20s of the bucket;
						// rounded up to the second, full again within
						// a second past that, less the time the test took.
						taken := time.Duration(min(i+1, 3)) * 20 * time.Second
						if d := reset("anthropic-ratelimit-requests-reset"); d > taken+time.Second || d <= taken-5*time.Second {
							t.Fatalf("request %d: requests full again in %v, want about %v", i, d, taken)
						}
						if n, d := f.number("anthropic-ratelimit-tokens-remaining"), reset("anthropic-ratelimit-tokens-reset"); n < 0 || n >= 100 || d <= -time.Second || d > time.Minute+time.Second {
							t.Fatalf("request %d: %d tokens left, full again in %v", i, n, d)
						}
						for name := range h {
							if strings.HasPrefix(strings.ToLower(name), "x-ratelimit-") {
								t.Fatalf("request %d: OpenAI's %s on a Messages answer", i, name)
							}
						}
						if c.status == 200 {
							if v := h.Values("retry-after-ms"); len(v) != 0 {
								t.Fatalf("request %d: a 200 with retry-after-ms %q", i, v)
							}
							continue
						}
						if !strings.Contains(b, `"rate_limit_error"`) {
							t.Fatalf("refused: %s, want Anthropic's rate_limit_error", b)
						}
						ms := f.number("retry-after-ms")
						if ms <= 0 || ms > 20_000 || h.Get("Retry-After") != strconv.FormatInt((ms+999)/1000, 10) {
							t.Fatalf("refused: retry-after-ms %d, Retry-After %q", ms, h.Get("Retry-After"))
						}
					}
				})
			}
		})
	}
}

// TestRateLimitHeadersKeepPodsRetry: a pod's 429 reaches a keyed client
// with both of its waits, retry-after-ms and Retry-After: the gateway's
// standing replaces the pod's, but an admitted request's has no wait of
// its own to put in their place.
func TestRateLimitHeadersKeepPodsRetry(t *testing.T) {
	const refusal = `{"error":{"message":"busy","type":"requests","code":"rate_limit_exceeded"}}`
	pod := fakePod(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 2\r\nretry-after-ms: 1500\r\nContent-Length: %d\r\n\r\n%s", len(refusal), refusal)
	})
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: pod}}, func(c *config.Config) {
				c.Frontend = fe
				c.Access.APIKeys = []limits.APIKey{{Name: "rated", SHA256: limits.HashKey("sk-rated"), RequestsPerMinute: 1000}}
			})
			bothClients(t, func(t *testing.T, via *http.Client) {
				resp, b := send(t, via, s, "POST", "/v1/chat/completions", chatBody, "Content-Type", "application/json", "Authorization", "Bearer sk-rated")
				if resp.StatusCode != 429 || resp.Header.Get("x-ratelimit-limit-requests") != "1000" {
					t.Fatalf("%d %s %v, want the pod's 429 with the key's standing", resp.StatusCode, b, resp.Header)
				}
				if ms, s := resp.Header.Values("retry-after-ms"), resp.Header.Values("Retry-After"); len(ms) != 1 || ms[0] != "1500" || len(s) != 1 || s[0] != "2" {
					t.Fatalf("retry-after-ms %q, Retry-After %q; want the pod's 1500 and 2", ms, s)
				}
			})
		})
	}
}

// answerFields reads the fields of request i's answer, each of which must
// come once.
type answerFields struct {
	t *testing.T
	i int
	h http.Header
}

func (a answerFields) field(name string) string {
	a.t.Helper()
	if v := a.h.Values(name); len(v) != 1 {
		a.t.Fatalf("request %d: %s %q, want one value", a.i, name, v)
	}
	return a.h.Get(name)
}

func (a answerFields) number(name string) int64 {
	a.t.Helper()
	n, err := strconv.ParseInt(a.field(name), 10, 64)
	if err != nil {
		a.t.Fatalf("request %d: %s: %v", a.i, name, err)
	}
	return n
}

// rateClient is a client the rate-limit tests send through, with a key of
// its name.
type rateClient struct {
	name string
	c    *http.Client
}

// rateClients are a connection per request, a kept one, and h2.
func rateClients() []rateClient {
	return []rateClient{{"close", client}, {"keepalive", &http.Client{Timeout: 20 * time.Second}}, {"h2", h2cClient()}}
}

// rateGateway is a gateway on front end fe over one sim pod of model m,
// with a key "sk-NAME" of 3 requests and 100 tokens a minute for each of
// clients, and the keys of more.
func rateGateway(t *testing.T, fe string, clients []rateClient, more ...limits.APIKey) *lb.Server {
	t.Helper()
	keys := more
	for _, c := range clients {
		keys = append(keys, limits.APIKey{Name: c.name, SHA256: limits.HashKey("sk-" + c.name), RequestsPerMinute: 3, TokensPerMinute: 100})
	}
	return testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) {
		c.Frontend = fe
		c.Access.APIKeys = keys
	})
}

// TestTokenizerSpendsNoTokens: the tokenizer APIs (/tokenize, /detokenize,
// /v1/messages/count_tokens), which the engine's API server answers
// without the engine, spend a keyed client's request but none of its
// tokens_per_minute: Anthropic's SDK counts a conversation's tokens before
// sending it, and that must not halve what the key may send.
func TestTokenizerSpendsNoTokens(t *testing.T) {
	const (
		count = `{"model":"m","messages":[{"role":"user","content":"` + "a fairly long message to count, the kind an agent sends before each turn of a long conversation" + `"}]}`
		tok   = `{"model":"m","prompt":"` + "a fairly long message to count, the kind an agent sends before each turn of a long conversation" + `"}`
	)
	clients := rateClients()[1:2]
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := rateGateway(t, fe, clients)
			for i, c := range []struct{ path, body, tokens string }{
				{"/v1/messages/count_tokens", count, "anthropic-ratelimit-tokens-remaining"},
				{"/tokenize", tok, "x-ratelimit-remaining-tokens"},
			} {
				resp, b := send(t, clients[0].c, s, "POST", c.path, c.body, "Content-Type", "application/json", "x-api-key", "sk-keepalive", "anthropic-version", "2023-06-01")
				if resp.StatusCode != 200 {
					t.Fatalf("%s: %d %s", c.path, resp.StatusCode, b)
				}
				f := answerFields{t: t, i: i, h: resp.Header}
				if n := f.number(c.tokens); n != 100 {
					t.Fatalf("%s: %s %d, want the whole 100: counting spends no tokens", c.path, c.tokens, n)
				}
			}
		})
	}
}

// TestReplicasShareKeyLimits: two replicas sharing Redis limit a key as
// one: after the key's 3 requests a minute went through one, the other
// refuses it within a sync interval or two, where alone it would admit 3
// more.
func TestReplicasShareKeyLimits(t *testing.T) {
	srv := redistest.Start(t, 0)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	pods := podsOf("m", testFleet(t, "m", 1, 100)...)
	key := limits.APIKey{Name: "shared", SHA256: limits.HashKey("sk-shared"), RequestsPerMinute: 3}
	replica := func(id string) *lb.Server {
		return testGateway(t, pods, func(c *config.Config) {
			c.Access.APIKeys = []limits.APIKey{key}
			c.Redis.Address, c.Redis.ReplicaID = srv.Addr(), id
			c.TokenLoad.SharedSyncIntervalMs = 10
		})
	}
	a, b := replica("a"), replica("b")
	ask := func(s *lb.Server) int {
		resp, _ := send(t, client, s, "POST", "/v1/chat/completions", chat("", "hi", 1, false), "Content-Type", "application/json", "Authorization", "Bearer sk-shared")
		return resp.StatusCode
	}
	for i := range 3 {
		if code := ask(a); code != 200 {
			t.Fatalf("request %d through a: %d", i, code)
		}
	}
	testwait.For(t, "a's requests in Redis", func() bool {
		keys, err := rdb.Keys(context.Background(), "{pdlb}:keys:*:requests").Result()
		return err == nil && len(keys) == 1
	})
	admitted, code := 0, ask(b)
	for ; code == 200; code = ask(b) {
		if admitted++; admitted == 3 {
			t.Fatal("b admitted the key's 3 requests a minute after a took them")
		}
		time.Sleep(50 * time.Millisecond) // b's next exchange
	}
	if code != 429 {
		t.Fatalf("b answered %d, want the key's 429", code)
	}

	// pdlb_redis_exchange_up says when the replicas stop sharing, and
	// when they share again.
	up := func(want float64) {
		t.Helper()
		for _, loop := range []string{"ledger", "api_keys"} {
			testwait.For(t, fmt.Sprintf("b's %s exchange up=%v", loop, want), func() bool {
				return metricValue(t, b, fmt.Sprintf(`pdlb_redis_exchange_up{loop=%q}`, loop)) == want
			})
		}
	}
	up(1)
	port := srv.Port
	srv.Stop()
	up(0)
	redistest.Start(t, port)
	up(1)
}
