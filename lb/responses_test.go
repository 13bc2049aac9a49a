package lb_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
)

// responsesPod is a fake pod serving the Responses API as vLLM does with
// VLLM_ENABLE_RESPONSES_API_STORE=1: a response stored (store, default
// true) under its request_id (else a random id) lives in this pod's
// memory alone, and a follow-up naming one it does not hold
// (previous_response_id), or a retrieval of one, gets vLLM's 404.
type responsesPod struct {
	mu     sync.Mutex
	stored map[string]bool
	bodies []string // the POST bodies it got
	byID   []string // the method and target of each request by id
	n      int
}

// lastBody returns the body of the last POST p got.
func (p *responsesPod) lastBody() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bodies[len(p.bodies)-1]
}

func (p *responsesPod) serve(c net.Conn, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	notFound := func(id string) {
		answerJSON(c, 404, fmt.Sprintf(`{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"response_id","code":404}}`, id))
	}
	if id, ok := strings.CutPrefix(r.URL.Path, "/v1/responses/"); ok {
		p.byID = append(p.byID, r.Method+" "+r.RequestURI)
		id, _, _ = strings.Cut(id, "/") // cancel
		if !p.stored[id] {
			notFound(id)
			return
		}
		if r.Method == http.MethodDelete {
			delete(p.stored, id)
		}
		answerJSON(c, 200, `{"id":"`+id+`","object":"response","status":"completed"}`)
		return
	}
	b, _ := io.ReadAll(r.Body)
	p.bodies = append(p.bodies, string(b))
	var req struct {
		RequestID string  `json:"request_id"`
		Previous  *string `json:"previous_response_id"`
		Store     *bool   `json:"store"`
		Stream    bool    `json:"stream"`
	}
	if json.Unmarshal(b, &req) != nil {
		answerJSON(c, 400, `{"error":{"message":"bad JSON"}}`)
		return
	}
	if req.Previous != nil && !p.stored[*req.Previous] {
		notFound(*req.Previous)
		return
	}
	p.n++
	id := req.RequestID
	if id == "" {
		id = fmt.Sprintf("resp_pod%p%d", p, p.n)
	}
	if req.Store == nil || *req.Store {
		p.stored[id] = true
	}
	resp := `{"id":"` + id + `","object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],` +
		`"usage":{"input_tokens":5,"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":12}}`
	if !req.Stream {
		answerJSON(c, 200, resp)
		return
	}
	// vLLM's stream: named events, no [DONE]; the connection's close
	// ends it.
	io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
	fmt.Fprintf(c, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":%q,\"usage\":null}}\n\n", id)
	io.WriteString(c, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n")
	fmt.Fprintf(c, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":%s}\n\n", resp)
}

// TestResponses: a stored response lives on the pod that made it, and
// every request naming it reaches that pod, on either front end and
// client: follow-ups (previous_response_id), retrievals, deletions; the
// gateway names the response (request_id) when the client did not.
func TestResponses(t *testing.T) {
	pods := map[string]*responsesPod{}
	var cfgPods []config.Pod
	for _, name := range []string{"a", "b", "c"} {
		p := &responsesPod{stored: map[string]bool{}}
		pods[name] = p
		cfgPods = append(cfgPods, config.Pod{Name: name, Model: "m", Address: fakePod(t, p.serve)})
	}
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, cfgPods, func(c *config.Config) { c.Frontend = fe })
			bothClients(t, func(t *testing.T, via *http.Client) { testResponses(t, s, via, pods) })
		})
	}
}

func testResponses(t *testing.T, s *lb.Server, via *http.Client, pods map[string]*responsesPod) {
	idOf := func(b string) string {
		var r struct{ ID string }
		if json.Unmarshal([]byte(b), &r) != nil || r.ID == "" {
			t.Fatalf("no id in %s", b)
		}
		return r.ID
	}
	resp, b := send(t, via, s, http.MethodPost, "/v1/responses", `{"model":"m","input":"hello"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("first: %d %s", resp.StatusCode, b)
	}
	id, home := idOf(b), resp.Header.Get("x-pdlb-pod")
	if !strings.HasPrefix(id, "resp_") || len(id) != len("resp_")+32 {
		t.Errorf("the gateway named the response %q, not as vLLM names one", id)
	}
	// Each follow-up reaches the pod holding the one before it; by load,
	// two of three would land on a pod that answers 404.
	for i := range 12 {
		resp, b = send(t, via, s, http.MethodPost, "/v1/responses", `{"model":"m","input":"more","previous_response_id":"`+id+`"}`)
		if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != home {
			t.Fatalf("follow-up %d of %s (on %s): %d on %s: %s", i, id, home, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
		}
		id = idOf(b)
	}
	// Streamed: relayed whole, no error event added for the [DONE] a
	// Responses stream never sends; its follow-up goes home too.
	resp, b = send(t, via, s, http.MethodPost, "/v1/responses", `{"model":"m","input":"more","stream":true,"previous_response_id":"`+id+`"}`)
	if resp.StatusCode != 200 || strings.Count(b, "event: ") != 3 || !strings.HasSuffix(b, "\n\n") || strings.Contains(b, "error") {
		t.Fatalf("stream: %d %q", resp.StatusCode, b)
	}
	var ev struct{ Response struct{ ID string } }
	_, data, _ := strings.Cut(b, "data: ")
	data, _, _ = strings.Cut(data, "\n")
	if json.Unmarshal([]byte(data), &ev) != nil {
		t.Fatalf("stream's first event: %q", data)
	}
	id = ev.Response.ID
	if resp, b = send(t, via, s, http.MethodPost, "/v1/responses", `{"model":"m","input":"x","previous_response_id":"`+id+`"}`); resp.StatusCode != 200 {
		t.Fatalf("after the stream: %d %s", resp.StatusCode, b)
	}
	// The client's own request_id names its response.
	own := "resp_mine" + strings.ReplaceAll(t.Name(), "/", "_")
	if resp, b = send(t, via, s, http.MethodPost, "/v1/responses", `{"model":"m","request_id":"`+own+`","input":"x"}`); resp.StatusCode != 200 || idOf(b) != own {
		t.Fatalf("own id: %d %s", resp.StatusCode, b)
	}
	home = resp.Header.Get("x-pdlb-pod")
	// One a path escapes: it reaches the pod as the client escaped it.
	odd := "resp_ a?b#c%d" // not "/": no route of vLLM's matches one, escaped or not
	if resp, b = send(t, via, s, http.MethodPost, "/v1/responses", `{"model":"m","request_id":"`+odd+`","input":"x"}`); resp.StatusCode != 200 {
		t.Fatalf("odd id: %d %s", resp.StatusCode, b)
	}
	if resp, b = send(t, via, s, http.MethodGet, "/v1/responses/resp_%20a%3Fb%23c%25d", ""); resp.StatusCode != 200 || idOf(b) != odd {
		t.Errorf("odd id's retrieval: %d %s", resp.StatusCode, b)
	}
	// null or "": vLLM's to judge, and the body goes as it came.
	for _, body := range []string{`{"model":"m","request_id":"","input":"x"}`, `{"model":"m","input":"x","request_id":null}`} {
		resp, _ = send(t, via, s, http.MethodPost, "/v1/responses", body)
		if got := pods[resp.Header.Get("x-pdlb-pod")].lastBody(); got != body {
			t.Errorf("the pod got %s for %s", got, body)
		}
	}
	// One too long to remember: answered, and found by asking the pods.
	long := "resp_" + strings.Repeat("x", 300)
	if resp, b = send(t, via, s, http.MethodPost, "/v1/responses", `{"model":"m","request_id":"`+long+`","input":"x"}`); resp.StatusCode != 200 || idOf(b) != long {
		t.Fatalf("long id: %d %s", resp.StatusCode, b)
	}
	if resp, b = send(t, via, s, http.MethodGet, "/v1/responses/"+long, ""); resp.StatusCode != 200 || idOf(b) != long {
		t.Errorf("a 305-byte id's retrieval: %d %s", resp.StatusCode, b)
	}
	// Retrieval, cancel and deletion by id go home as well, with their
	// method and query, on the path the gateway routed (dot segments
	// resolved).
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/v1/responses/" + own},
		{http.MethodGet, "/v1/responses/zz/../" + own + "?a=1"},
		{http.MethodPost, "/v1/responses/" + own + "/cancel"},
		{http.MethodGet, "/v1/responses/" + own + "?stream=false&starting_after=3"},
		{http.MethodGet, "/v1/responses/" + own + "/input_items?limit=5"},
		{http.MethodDelete, "/v1/responses/" + own},
	} {
		if resp, b = send(t, via, s, r.method, r.path, ""); resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != home || idOf(b) != own {
			t.Fatalf("%s %s: %d on %s (home %s): %s", r.method, r.path, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), home, b)
		}
		p := pods[home]
		p.mu.Lock()
		got := p.byID[len(p.byID)-1]
		p.mu.Unlock()
		if want := r.method + " " + strings.Replace(r.path, "zz/../", "", 1); got != want {
			t.Errorf("%s %s reached the pod as %s", r.method, r.path, got)
		}
	}
	if resp, _ = send(t, via, s, http.MethodGet, "/v1/responses/"+own+"/", ""); resp.StatusCode != 404 || resp.Header.Get("x-pdlb-pod") != "" {
		t.Errorf("a trailing slash: %d on %q", resp.StatusCode, resp.Header.Get("x-pdlb-pod"))
	}
	// Deleted: no pod holds it, each says so (vLLM's 404).
	resp, b = send(t, via, s, http.MethodGet, "/v1/responses/"+own, "")
	if resp.StatusCode != 404 || !strings.Contains(b, `"message":"Response with id '`+own+`' not found."`) || !strings.Contains(b, `"param":"response_id"`) {
		t.Errorf("deleted: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	if resp, _ = send(t, via, s, http.MethodPut, "/v1/responses/"+own, ""); resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, DELETE" {
		t.Errorf("PUT: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	// Not stored: the body goes byte for byte, by load.
	body := `{"model":"m","store":false,"input":"x"}`
	if resp, b = send(t, via, s, http.MethodPost, "/v1/responses", body); resp.StatusCode != 200 {
		t.Fatalf("store false: %d %s", resp.StatusCode, b)
	}
	if got := pods[resp.Header.Get("x-pdlb-pod")].lastBody(); got != body {
		t.Errorf("store false: the pod got %s", got)
	}
}

// TestResponsesHomeDown: a follow-up whose response lives on a pod found
// dead gets 503 naming that pod, not another pod's 404; a gateway with
// max_stored_responses 0 names nothing and follows by load.
func TestResponsesHomeDown(t *testing.T) {
	var down atomic.Bool
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &responsesPod{stored: map[string]bool{}}
	b := &responsesPod{stored: map[string]bool{}}
	pods := []config.Pod{
		{Name: "a", Model: "m", Address: scriptedPod(t, ln, podScript{checks: func() bool { return !down.Load() }, serve: a.serve})},
		{Name: "b", Model: "m", Address: fakePod(t, b.serve)},
	}
	s := testGateway(t, pods, func(c *config.Config) {
		c.Health.Timeout, c.Health.UnhealthyAfter = 50*time.Millisecond, 2
	})
	// Until one lands on a.
	var id string
	for id == "" {
		if resp, body := post(t, s, "/v1/responses", `{"model":"m","input":"x"}`); resp.Header.Get("x-pdlb-pod") == "a" {
			id = body[strings.Index(body, "resp_") : strings.Index(body, "resp_")+len("resp_")+32]
		}
	}
	down.Store(true)
	testwait.For(t, "pod a found dead", func() bool { return metricValue(t, s, `pdlb_pod_healthy{pod="a"}`) == 0 })
	resp, body := post(t, s, "/v1/responses", `{"model":"m","input":"x","previous_response_id":"`+id+`"}`)
	if resp.StatusCode != 503 || !strings.Contains(body, "pod `a`") {
		t.Errorf("follow-up of a response on a dead pod: %d %s", resp.StatusCode, body)
	}

	off := testGateway(t, pods[1:], func(c *config.Config) { c.MaxStoredResponses = 0 })
	body = `{"model":"m","input":"x"}`
	if resp, _ := post(t, off, "/v1/responses", body); resp.StatusCode != 200 {
		t.Fatalf("max_stored_responses 0: %d", resp.StatusCode)
	}
	if got := b.lastBody(); got != body {
		t.Errorf("max_stored_responses 0: the pod got %s", got)
	}
}

// TestResponsesConversation: a conversation's requests (one
// prompt_cache_key, stored or not) go to the pod its last one went to,
// where its earlier turns are cached; when that pod is unavailable, to
// another, which it then keeps.
func TestResponsesConversation(t *testing.T) {
	var down [3]atomic.Bool
	var pods []config.Pod
	for i := range down {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := &responsesPod{stored: map[string]bool{}}
		pods = append(pods, config.Pod{Name: fmt.Sprint(i), Model: "m",
			Address: scriptedPod(t, ln, podScript{checks: func() bool { return !down[i].Load() }, serve: p.serve})})
	}
	s := testGateway(t, pods, func(c *config.Config) {
		c.Health.Timeout, c.Health.UnhealthyAfter = 50*time.Millisecond, 2
	})
	turns := func(n int) string {
		t.Helper()
		var on string
		for i := range n {
			resp, b := post(t, s, "/v1/responses", `{"model":"m","input":"x","store":false,"prompt_cache_key":"conv-1"}`)
			if resp.StatusCode != 200 || (on != "" && resp.Header.Get("x-pdlb-pod") != on) {
				t.Fatalf("turn %d: %d on %s, the conversation's pod %s: %s", i, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), on, b)
			}
			on = resp.Header.Get("x-pdlb-pod")
		}
		return on
	}
	first := turns(10)
	i, _ := strconv.Atoi(first)
	down[i].Store(true)
	testwait.For(t, "the conversation's pod found dead", func() bool {
		return metricValue(t, s, `pdlb_pod_healthy{pod="`+first+`"}`) == 0
	})
	if next := turns(10); next == first {
		t.Errorf("the conversation stayed on its dead pod %s", first)
	}
}

// TestResponsesPinnedHedge: with first-byte hedging on, a follow-up bound
// to its response's pod waits for that pod's answer; cut at the
// first-byte deadline it would have nowhere else to go (a 504 for an
// answer on its way).
func TestResponsesPinnedHedge(t *testing.T) {
	slow := func(name string) config.Pod {
		p := &responsesPod{stored: map[string]bool{}}
		return config.Pod{Name: name, Model: "m", Address: fakePod(t, func(c net.Conn, r *http.Request) {
			if r.ContentLength > 60 {
				time.Sleep(400 * time.Millisecond) // a follow-up: templating, a queue
			}
			p.serve(c, r)
		})}
	}
	s := testGateway(t, []config.Pod{slow("a"), slow("b")}, func(c *config.Config) {
		c.Upstream.Retry.FirstByte = config.FirstByte{Factor: 1, Floor: 100 * time.Millisecond}
	})
	if resp, b := post(t, s, "/v1/responses", `{"model":"m","request_id":"resp_h","input":"x"}`); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if resp, b := post(t, s, "/v1/responses", `{"model":"m","input":"x","stream":true,"previous_response_id":"resp_h"}`); resp.StatusCode != 200 || strings.Contains(b, "error") {
		t.Errorf("a follow-up slower than the first-byte deadline: %d %s", resp.StatusCode, b)
	}
}

// TestResponsesSeekNotHedged: a follow-up naming a response the gateway
// does not know seeks it on the model's pods in turn; each pod without
// it answers 404 at once, as vLLM does, so the one slower than the
// first-byte deadline is the one holding it: the seek waits for it, on
// either front end, rather than giving it up for pods that can only
// answer 404.
func TestResponsesSeekNotHedged(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			var pods []config.Pod
			for _, name := range []string{"a", "b", "c"} {
				p := &responsesPod{stored: map[string]bool{"resp_on_" + name: true}}
				pods = append(pods, config.Pod{Name: name, Model: "m", Address: fakePod(t, func(c net.Conn, r *http.Request) {
					p.mu.Lock()
					holds := r.ContentLength > 0 && p.stored["resp_on_"+name]
					p.mu.Unlock()
					if holds {
						time.Sleep(400 * time.Millisecond) // its generation
					}
					p.serve(c, r)
				})})
			}
			s := testGateway(t, pods, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval = time.Hour
				c.Upstream.Retry.FirstByte = config.FirstByte{Factor: 1, Floor: 100 * time.Millisecond}
			})
			for _, name := range []string{"a", "b", "c"} {
				body := `{"model":"m","input":"x","stream":true,"previous_response_id":"resp_on_` + name + `"}`
				if resp, b := post(t, s, "/v1/responses", body); resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != name {
					t.Errorf("follow-up of a response on %s: %d from %q: %s", name, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
				}
			}
			if n := metricValue(t, s, `pdlb_upstream_retries_total{reason="hung"}`); n != 0 {
				t.Errorf("%v seeks given up as hung", n)
			}
		})
	}
}

// TestResponsesUsage: a Responses answer's output tokens (its usage,
// whole or in response.completed) count as a completion's, and its
// stream's first token is timed as a completion's.
func TestResponsesUsage(t *testing.T) {
	p := &responsesPod{stored: map[string]bool{}}
	s := testGateway(t, []config.Pod{{Name: "a", Model: "m", Address: fakePod(t, p.serve)}}, nil)
	for i, body := range []string{`{"model":"m","input":"x"}`, `{"model":"m","input":"x","stream":true}`} {
		if resp, b := post(t, s, "/v1/responses", body); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		if n := metricValue(t, s, `pdlb_completion_tokens_total{model="m"}`); n != float64(7*(i+1)) {
			t.Errorf("after %s: pdlb_completion_tokens_total %v, want %d", body, n, 7*(i+1))
		}
	}
	// Its first output_text.delta is its first token: the pod's prefill
	// of it is done then.
	if n := metricValue(t, s, `pdlb_time_to_first_token_seconds_count{model="m"}`); n != 1 {
		t.Errorf("a Responses stream timed %v first tokens, want 1", n)
	}
}

// TestResponsesSeek: a response made through one replica (or before a
// restart) is unknown to another; there its follow-up and its retrieval
// ask the model's pods in turn, each once, until the one holding it
// answers, and the replica remembers it from then on.
func TestResponsesSeek(t *testing.T) {
	var pods []config.Pod
	var fakes []*responsesPod
	for _, name := range []string{"a", "b", "c", "d"} {
		p := &responsesPod{stored: map[string]bool{}}
		fakes = append(fakes, p)
		pods = append(pods, config.Pod{Name: name, Model: "m", Address: fakePod(t, p.serve)})
	}
	asked := func() (n int) {
		for _, p := range fakes {
			p.mu.Lock()
			n += len(p.bodies) + len(p.byID)
			p.mu.Unlock()
		}
		return n
	}
	one := testGateway(t, pods, nil)
	path := filepath.Join(t.TempDir(), "access.log")
	other := testGateway(t, pods, func(c *config.Config) {
		c.Upstream.Retries = 0
		c.AccessLog = path
	})
	resp, b := post(t, one, "/v1/responses", `{"model":"m","input":"x","request_id":"resp_seek"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	home := resp.Header.Get("x-pdlb-pod")
	before := asked()
	resp, b = post(t, other, "/v1/responses", `{"model":"m","input":"x","request_id":"resp_seek2","previous_response_id":"resp_seek"}`)
	if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != home {
		t.Fatalf("follow-up through the other replica: %d on %s (home %s): %s", resp.StatusCode, resp.Header.Get("x-pdlb-pod"), home, b)
	}
	if n := asked() - before; n < 1 || n > len(pods) {
		t.Errorf("the search asked %d times for %d pods", n, len(pods))
	}
	// Remembered now: one request each.
	before = asked()
	if resp, b = send(t, client, other, http.MethodGet, "/v1/responses/resp_seek", ""); resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != home {
		t.Fatalf("retrieval through the other replica: %d %s", resp.StatusCode, b)
	}
	if n := asked() - before; n != 1 {
		t.Errorf("a remembered retrieval asked %d times", n)
	}
	// Unknown everywhere: every pod asked once, vLLM's 404.
	before = asked()
	resp, b = send(t, client, other, http.MethodGet, "/v1/responses/resp_none", "")
	if resp.StatusCode != 404 || !strings.Contains(b, "Response with id 'resp_none' not found.") {
		t.Errorf("unknown everywhere: %d %s", resp.StatusCode, b)
	}
	if n := asked() - before; n != len(pods) {
		t.Errorf("an unknown id asked %d times, want %d", n, len(pods))
	}
	// The one it made and the one it found.
	if n := metricValue(t, other, "pdlb_stored_responses"); n != 2 {
		t.Errorf("pdlb_stored_responses %v, want 2", n)
	}
	// Each line lists the pods the search moved on from, with their 404.
	for _, l := range readAccessLog(t, other, path) {
		r, _ := l["retried"].([]any)
		if len(r) != int(l.num("attempts"))-1 {
			t.Errorf("%v %v: %v attempts, retried %v", l["method"], l["path"], l["attempts"], l["retried"])
		}
		for _, a := range r {
			if a, _ := a.(map[string]any); a["pod"] == l["pod"] || a["reason"] != "404" || !strings.Contains(fmt.Sprint(a["error"]), "not found") {
				t.Errorf("%v %v answered by %v: retried %v, want the other pods' 404s", l["method"], l["path"], l["pod"], r)
			}
		}
	}
}

// TestResponsesSim: through the gateway to simulated vLLM pods that keep
// their responses, a conversation of chained follow-ups, streamed or
// not, each on the pod holding the one before.
func TestResponsesSim(t *testing.T) {
	var pods []config.Pod
	for i := range 3 {
		p, err := sim.Start(sim.Config{Name: fmt.Sprint("sim-", i), Model: "m", Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 4, ResponsesStore: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		pods = append(pods, config.Pod{Name: p.Config().Name, Model: "m", Address: p.Addr()})
	}
	s := testGateway(t, pods, nil)
	prev := ""
	for i := range 8 {
		body := `{"model":"m","input":"turn ` + fmt.Sprint(i) + `","stream":` + fmt.Sprint(i%2 == 1)
		if prev != "" {
			body += `,"previous_response_id":"` + prev + `"`
		}
		resp, b := post(t, s, "/v1/responses", body+"}")
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: %d %s", i, resp.StatusCode, b)
		}
		i := strings.Index(b, `"id":"resp_`)
		if i < 0 {
			t.Fatalf("no id in %s", b)
		}
		prev = b[i+len(`"id":"`) : i+len(`"id":"`)+len("resp_")+32]
	}
	if resp, b := send(t, client, s, http.MethodGet, "/v1/responses/"+prev, ""); resp.StatusCode != 200 || !strings.Contains(b, prev) {
		t.Errorf("retrieval: %d %s", resp.StatusCode, b)
	}
}

// TestResponsesStandInTokens: without a tokenizer, the gateway counts a
// Responses request's prompt as a stand-in sim pod prefills it (the
// instructions, message items as the SDKs send them, an assistant's
// first part), so its prefill charge and keys are the pod's.
func TestResponsesStandInTokens(t *testing.T) {
	p, err := sim.Start(sim.Config{Name: "sim-0", Model: "m", Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	s := testGateway(t, []config.Pod{{Name: "sim-0", Model: "m", Address: p.Addr()}}, nil)
	resp, b := post(t, s, "/v1/responses", `{"model":"m","store":false,"max_output_tokens":1,"instructions":"Answer briefly.","input":[
		{"role":"user","content":"Where is the capital of China?"},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Beijing.","annotations":[]},{"type":"output_text","text":"dropped"}]},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"And of Japan?"},{"type":"input_text","text":"And of Korea?"}]}]}`)
	var a struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
	}
	if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &a) != nil {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if n := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`); n != float64(a.Usage.InputTokens) || n < 20 {
		t.Errorf("the gateway counted %v prompt tokens, the pod prefilled %d", n, a.Usage.InputTokens)
	}
}

// TestResponsesSeekEnds: the search for an unknown stored response asks
// the available pods, each at once, and ends with 503 naming the dead pod
// it could not ask, which may hold it: not the dead pod's 502 (a panic
// pick took it), nor after a retry's growing backoff per pod asked
// (twelve pods took 6.6 s); and a model of prefill/decode pods alone has
// no pod to ask: vLLM's 404, not a 400.
func TestResponsesSeekEnds(t *testing.T) {
	dead := testnet.Refusing(t)
	var pods []config.Pod
	for i := range 12 {
		p := &responsesPod{stored: map[string]bool{}}
		pods = append(pods, config.Pod{Name: fmt.Sprint("p", i), Model: "m", Address: fakePod(t, p.serve)})
	}
	s := testGateway(t, append(pods, config.Pod{Name: "dead", Model: "m", Address: dead}), nil)
	testwait.For(t, "the dead pod found dead", func() bool { return metricValue(t, s, `pdlb_pod_healthy{pod="dead"}`) == 0 })
	unasked := "Response with id 'resp_none' is on none of the pods that answered; 1 of the model's 13 pods (pod `dead`) failed or are down, and may hold it."
	for i := range 3 {
		start := time.Now()
		resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_none", "")
		if resp.StatusCode != 503 || !strings.Contains(b, unasked) {
			t.Errorf("retrieval %d: %d %s", i, resp.StatusCode, b)
		}
		if resp, b = post(t, s, "/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_none"}`); resp.StatusCode != 503 || !strings.Contains(b, unasked) {
			t.Errorf("follow-up %d: %d %s", i, resp.StatusCode, b)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("asking twelve pods that answer at once, twice, took %v", d)
		}
	}
	e := pdEngines[0]
	pre, dec := startSim(t, e, "pre", sim.RolePrefill, nil), startSim(t, e, "dec", sim.RoleDecode, nil)
	pd := testGateway(t, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}, nil)
	if resp, b := send(t, client, pd, http.MethodGet, "/v1/responses/resp_none", ""); resp.StatusCode != 404 || !strings.Contains(b, "Response with id 'resp_none' not found.") {
		t.Errorf("prefill/decode pods alone: %d %s", resp.StatusCode, b)
	}
}

// TestResponsesSeekBudget: a pod's failure in the middle of a search
// takes no place in the retry budget: asking the next pod is the search,
// which asks each pod once whatever failed, so with the budget shut every
// search still asks them all and ends in 503 naming the failed pod (not
// its 502, nor a 404), and the budget refused nothing.
func TestResponsesSeekBudget(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			var pods []config.Pod
			for i := range 3 {
				p := &responsesPod{stored: map[string]bool{}}
				pods = append(pods, config.Pod{Name: fmt.Sprint("p", i), Model: "m", Address: fakePod(t, p.serve)})
			}
			pods = append(pods, config.Pod{Name: "bad", Model: "m", Address: fakePod(t, resetPod)})
			s := testGateway(t, pods, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval, c.Health.EjectAfterFailures = time.Hour, 1000
				c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
				c.Upstream.Retry.Budget = config.RetryBudget{Percent: 1, MinRetries: 0}
			})
			for i := range 8 {
				resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_none", "")
				if resp.StatusCode != 503 || !strings.Contains(b, "pod `bad`") {
					t.Errorf("search %d, the retry budget shut: %d %s", i, resp.StatusCode, b)
				}
			}
			if n := metricValue(t, s, "pdlb_upstream_retry_budget_exhausted_total"); n != 0 {
				t.Errorf("pdlb_upstream_retry_budget_exhausted_total %v: a search's step went to the budget", n)
			}
		})
	}
}

// TestResponsesRetrievalUncounted: a streamed retrieval replays a
// response's events, usage included: its output tokens were counted when
// it was made, not again (14 for one response and its retrieval).
func TestResponsesRetrievalUncounted(t *testing.T) {
	p := &responsesPod{stored: map[string]bool{}}
	addr := fakePod(t, func(c net.Conn, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Query().Get("stream") == "true" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
			io.WriteString(c, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n")
			io.WriteString(c, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":7,\"total_tokens\":12}}}\n\n")
			return
		}
		p.serve(c, r)
	})
	s := testGateway(t, []config.Pod{{Name: "a", Model: "m", Address: addr}}, nil)
	if resp, b := post(t, s, "/v1/responses", `{"model":"m","input":"x","request_id":"resp_r"}`); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_r?stream=true", ""); resp.StatusCode != 200 || !strings.Contains(b, "response.completed") {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if n := metricValue(t, s, `pdlb_completion_tokens_total{model="m"}`); n != 7 {
		t.Errorf("pdlb_completion_tokens_total %v after one response and its retrieval, want 7", n)
	}
}

// TestResponsesRetrievalCut: a streamed retrieval whose pod breaks off
// midway through an event ends with the Responses API's error event,
// numbered after the last whole event, as a response's own stream does.
func TestResponsesRetrievalCut(t *testing.T) {
	p := &responsesPod{stored: map[string]bool{}}
	const delta = "event: response.output_text.delta\ndata: {\"content_index\":0,\"delta\":\"hi\",\"item_id\":\"msg_1\",\"output_index\":0,\"sequence_number\":5,\"type\":\"response.output_text.delta\"}\n\n"
	addr := fakePod(t, func(c net.Conn, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Query().Get("stream") == "true" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"+delta+"event: response.output_text.delta\ndata: {\"cont")
			return
		}
		p.serve(c, r)
	})
	s := testGateway(t, []config.Pod{{Name: "a", Model: "m", Address: addr}}, func(c *config.Config) { c.Upstream.Retries = 0 })
	if resp, b := post(t, s, "/v1/responses", `{"model":"m","input":"x","request_id":"resp_r"}`); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_r?stream=true&starting_after=4", "")
	want := delta + "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"The inference server failed: unexpected EOF\",\"param\":null,\"sequence_number\":6}\n\n"
	if resp.StatusCode != 200 || b != want {
		t.Errorf("%d %q; want 200 %q", resp.StatusCode, b, want)
	}
}

// TestResponsesPodRenamed: a reload that renames (or removes) the pod a
// stored response was remembered on leaves no pod of that name: the
// requests naming it seek it on the pods (503 naming the old pod, for
// good, before).
func TestResponsesPodRenamed(t *testing.T) {
	var pods []config.Pod
	for _, name := range []string{"a", "b"} {
		p := &responsesPod{stored: map[string]bool{}}
		pods = append(pods, config.Pod{Name: name, Model: "m", Address: fakePod(t, p.serve)})
	}
	s := testGateway(t, pods, nil)
	if resp, b := post(t, s, "/v1/responses", `{"model":"m","input":"x","request_id":"resp_rn"}`); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	renamed := []config.Pod{pods[0], pods[1]}
	renamed[0].Name, renamed[1].Name = "a2", "b2"
	if err := s.Gateway.SetPods(renamed); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_rn", ""); resp.StatusCode != 200 {
			t.Errorf("retrieval %d after the rename: %d %s", i, resp.StatusCode, b)
		}
		if resp, b := post(t, s, "/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_rn"}`); resp.StatusCode != 200 {
			t.Errorf("follow-up %d after the rename: %d %s", i, resp.StatusCode, b)
		}
	}
}

// TestResponsesModelMoved: a reload that moves a stored response's pod to
// another model, leaving its old model or taking it away, leaves the
// calls by the response's id (which name no model) to that pod, under
// its new model; one that renames the pod too leaves them to a search,
// which finds it. Never the other pods' 404, nor an unknown model's.
func TestResponsesModelMoved(t *testing.T) {
	var pods []config.Pod
	for _, name := range []string{"a", "b", "c"} {
		p := &responsesPod{stored: map[string]bool{}}
		pods = append(pods, config.Pod{Name: name, Model: map[string]string{"a": "m", "b": "m", "c": "n"}[name], Address: fakePod(t, p.serve)})
	}
	for i, step := range []struct {
		what   string
		reload func(home, other config.Pod) []config.Pod
	}{
		{"its pod moved to another model", func(home, other config.Pod) []config.Pod { return []config.Pod{home, other, pods[2]} }},
		{"its model gone too", func(home, _ config.Pod) []config.Pod { return []config.Pod{home, pods[2]} }},
		{"its pod renamed too", func(home, _ config.Pod) []config.Pod { home.Name = "renamed"; return []config.Pod{home, pods[2]} }},
	} {
		s := testGateway(t, pods, nil)
		id := fmt.Sprint("resp_mv", i)
		resp, b := post(t, s, "/v1/responses", `{"model":"m","input":"x","request_id":"`+id+`"}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		home, other := pods[0], pods[1]
		if resp.Header.Get("x-pdlb-pod") == "b" {
			home, other = other, home
		}
		home.Model = "m2"
		fleet := step.reload(home, other)
		if err := s.Gateway.SetPods(fleet); err != nil {
			t.Fatal(err)
		}
		for _, sub := range []string{"/input_items", ""} {
			resp, b := send(t, client, s, http.MethodGet, "/v1/responses/"+id+sub, "")
			if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != fleet[0].Name || resp.Header.Get("x-pdlb-model") != "m2" {
				t.Errorf("%s, GET %q: %d on %q of %q: %s", step.what, sub, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), resp.Header.Get("x-pdlb-model"), b)
			}
		}
	}
}

// TestResponsesStreamEnds: a Responses API stream's events have their
// "type" last (vLLM writes the fields in the order OpenAI's types declare
// them). One the engine ends with its own error event (named "error"),
// or with response.failed, reaches the client as sent and counts with
// its status, not as a success; one whose pod closed before its
// response.completed was cut: the client gets the events, then the
// Responses API's error event (named "error", its data typed "error",
// numbered after the last event), and it counts as failed; on both front
// ends and both of gnet's relays.
func TestResponsesStreamEnds(t *testing.T) {
	const events = "event: response.created\ndata: {\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null},\"sequence_number\":0,\"type\":\"response.created\"}\n\n" +
		"event: response.output_text.delta\ndata: {\"content_index\":0,\"delta\":\"Hi\",\"item_id\":\"msg_1\",\"output_index\":0,\"sequence_number\":1,\"type\":\"response.output_text.delta\"}\n\n"
	const engineError = "event: error\ndata: {\"code\":\"server_error\",\"message\":\"CUDA error\",\"param\":null,\"sequence_number\":2,\"type\":\"error\"}\n\n"
	const completed = "event: response.completed\ndata: {\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}},\"sequence_number\":2,\"type\":\"response.completed\"}\n\n"
	const responseFailed = "event: response.failed\ndata: {\"response\":{\"id\":\"resp_1\",\"error\":{\"code\":\"server_error\",\"message\":\"CUDA error\"},\"status\":\"failed\"},\"sequence_number\":2,\"type\":\"response.failed\"}\n\n"
	pod := func(stream string) string {
		return fakePod(t, func(c net.Conn, _ *http.Request) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"+stream)
		})
	}
	pods := []config.Pod{{Model: "cut", Address: pod(events)}, {Model: "failed", Address: pod(events + engineError)},
		{Model: "response-failed", Address: pod(events + responseFailed)}, {Model: "whole", Address: pod(events + completed)}}
	check := func(t *testing.T, frontend string, via *http.Client) {
		s := testGateway(t, pods, func(c *config.Config) { c.Frontend = frontend; c.Upstream.Retries = 0 })
		for _, tc := range []struct{ model, want, code string }{
			{"cut", events + "event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"The inference server failed: ", "502"},
			{"failed", events + engineError, "500"},
			{"response-failed", events + responseFailed, "500"},
			{"whole", events + completed, "200"},
		} {
			resp, b := postVia(t, via, s, "/v1/responses", `{"model":"`+tc.model+`","input":"hi","stream":true,"store":false}`)
			if resp.StatusCode != 200 || !strings.HasPrefix(b, tc.want) || tc.model != "cut" && b != tc.want {
				t.Errorf("%s: relayed as %d %q; want 200 %q", tc.model, resp.StatusCode, b, tc.want)
			}
			if tc.model == "cut" && !strings.HasSuffix(b, `,"param":null,"sequence_number":2}`+"\n\n") {
				t.Errorf("cut: the error event %q is not numbered after the last event (1)", strings.TrimPrefix(b, events))
			}
			waitIdle(t, s)
			if n := metricValue(t, s, `pdlb_requests_total{model="`+tc.model+`",code="`+tc.code+`"}`); n != 1 {
				t.Errorf("%s: counted %v times as %s; want 1", tc.model, n, tc.code)
			}
		}
	}
	t.Run("fasthttp", func(t *testing.T) { check(t, "fasthttp", client) })
	t.Run("gnet", func(t *testing.T) {
		bothClients(t, func(t *testing.T, via *http.Client) { check(t, "gnet", via) })
	})
}

// TestResponsesSeekPodFails: a pod that fails during the search for a
// stored response the gateway does not know (a reset, a refused
// connection, a hang, a 5xx) may hold it: when every other pod answers
// 404 the client gets 503 naming that pod, not a 404 that says the
// response does not exist; when another pod holds it, 200 from there.
// Asking the next pod is the search, not a retry: with retries 0 and
// retry_on none, a failure early in it still leaves every pod asked. The
// access log lists each pod the search moved on from, the failed one
// with its failure, and names no pod as the 503's.
func TestResponsesSeekPodFails(t *testing.T) {
	for _, bad := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"reset", func(t *testing.T) string { return fakePod(t, resetPod) }},
		{"refused", func(t *testing.T) string { return testnet.Refusing(t) }},
		{"hung", func(t *testing.T) string { return fakePod(t, hungPod) }},
		{"503", func(t *testing.T) string {
			return fakePod(t, func(c net.Conn, _ *http.Request) { answerJSON(c, 503, `{"error":{"message":"shed"}}`) })
		}},
		// vLLM's answer to an exception in its handler, and a proxy's in
		// front of a pod: neither says whether the pod holds the id.
		{"500", func(t *testing.T) string {
			return fakePod(t, func(c net.Conn, _ *http.Request) {
				answerJSON(c, 500, `{"error":{"message":"EngineDeadError","type":"InternalServerError","code":500}}`)
			})
		}},
		{"502", func(t *testing.T) string {
			return fakePod(t, func(c net.Conn, _ *http.Request) { answerJSON(c, 502, `{"error":{"message":"bad gateway"}}`) })
		}},
	} {
		for _, fe := range []string{"gnet", "fasthttp"} {
			t.Run(bad.name+"/"+fe, func(t *testing.T) {
				var pods []config.Pod
				for i := range 3 {
					name := fmt.Sprint("p", i)
					p := &responsesPod{stored: map[string]bool{"resp_on_" + name: true}}
					pods = append(pods, config.Pod{Name: name, Model: "m", Address: fakePod(t, p.serve)})
				}
				pods = append(pods, config.Pod{Name: "bad", Model: "m", Address: bad.addr(t)})
				path := filepath.Join(t.TempDir(), "access.log")
				s := testGateway(t, pods, func(c *config.Config) {
					c.Frontend = fe
					c.AccessLog = path
					c.Health.Interval = time.Hour
					c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = 200*time.Millisecond, 200*time.Millisecond
					c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
					c.Upstream.Retries, c.Upstream.Retry.On = 0, []string{config.RetryOnNone}
				})
				for i := range 4 {
					for _, r := range []struct{ method, path, body string }{
						{http.MethodGet, "/v1/responses/resp_on_bad", ""},
						{http.MethodPost, "/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_on_bad"}`},
					} {
						resp, b := send(t, client, s, r.method, r.path, r.body)
						if resp.StatusCode != 503 || !strings.Contains(b, "pod `bad`") || !strings.Contains(b, "resp_on_bad") {
							t.Errorf("round %d, %s %s: %d %s", i, r.method, r.path, resp.StatusCode, b)
						}
					}
					if resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_on_p2", ""); resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != "p2" {
						t.Errorf("round %d, a response on p2: %d on %q: %s", i, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
					}
				}
				if n := metricValue(t, s, `pdlb_requests_total{model="m",code="503"}`); n != 8 {
					t.Errorf("pdlb_requests_total 503: %v, want 8", n)
				}
				for _, l := range readAccessLog(t, s, path) {
					if l["status"] != 503.0 {
						continue
					}
					r, _ := l["retried"].([]any)
					if l["pod"] != nil || len(r) == 0 || len(r) != int(l.num("attempts")) {
						t.Errorf("%v %v: pod %v, %v attempts, retried %v", l["method"], l["path"], l["pod"], l["attempts"], r)
					}
					for _, a := range r {
						if a, _ := a.(map[string]any); (a["pod"] == "bad") == (a["reason"] == "404") {
							t.Errorf("%v %v: retried %v: a 404 is another pod's, and bad's a failure", l["method"], l["path"], a)
						}
					}
				}
			})
		}
	}
}

// TestResponsesSeekRelays4xx: a pod's 4xx but 404 during a search is its
// word on the id, relayed: vLLM answers 400 for an id that does not begin
// with "resp" (every pod alike, so one is asked) and for a cancel of a
// response that is not running (its own pod, found after the others'
// 404s).
func TestResponsesSeekRelays4xx(t *testing.T) {
	var mu sync.Mutex
	asked := 0
	var pods []config.Pod
	for _, name := range []string{"p0", "p1", "p2"} {
		pods = append(pods, config.Pod{Name: name, Model: "m", Address: fakePod(t, func(c net.Conn, r *http.Request) {
			mu.Lock()
			asked++
			mu.Unlock()
			id, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/responses/"), "/")
			switch {
			case !strings.HasPrefix(id, "resp"):
				answerJSON(c, 400, `{"error":{"message":"Invalid 'response_id': '`+id+`'. Expected an ID that begins with 'resp'.","type":"invalid_request_error","code":400}}`)
			case id != "resp_on_"+name:
				answerJSON(c, 404, `{"error":{"message":"Response with id '`+id+`' not found.","type":"invalid_request_error","param":"response_id","code":404}}`)
			default:
				answerJSON(c, 400, `{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error","code":400}}`)
			}
		})})
	}
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, pods, func(c *config.Config) { c.Frontend = fe; c.Health.Interval = time.Hour })
			mu.Lock()
			asked = 0
			mu.Unlock()
			resp, b := send(t, client, s, http.MethodGet, "/v1/responses/msg_1", "")
			mu.Lock()
			n := asked
			mu.Unlock()
			if resp.StatusCode != 400 || !strings.Contains(b, "Expected an ID that begins with 'resp'.") || n != 1 {
				t.Errorf("an invalid id: %d after asking %d pods: %s", resp.StatusCode, n, b)
			}
			resp, b = send(t, client, s, http.MethodPost, "/v1/responses/resp_on_p2/cancel", "")
			if resp.StatusCode != 400 || resp.Header.Get("x-pdlb-pod") != "p2" || !strings.Contains(b, "Cannot cancel") {
				t.Errorf("cancel of a finished response: %d on %q: %s", resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
			}
		})
	}
}

// TestResponsesSeekOnePodDown: an unknown stored response on a model whose
// one pod is down is not reported gone: 503 while the pod refuses the
// connection (naming it) and once it is known down, never vLLM's 404.
func TestResponsesSeekOnePodDown(t *testing.T) {
	s := testGateway(t, []config.Pod{{Name: "a", Model: "m", Address: testnet.Refusing(t)}}, func(c *config.Config) { c.Health.Interval = time.Hour })
	for i := range 2 {
		resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_x", "")
		if resp.StatusCode != 503 || strings.Contains(b, "not found") || (i == 0 && !strings.Contains(b, "pod `a`")) {
			t.Errorf("retrieval %d: %d %s, want 503", i, resp.StatusCode, b)
		}
	}
	if resp, b := post(t, s, "/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_x"}`); resp.StatusCode != 503 || strings.Contains(b, "not found") {
		t.Errorf("follow-up: %d %s", resp.StatusCode, b)
	}
}

// TestResponsesStoredCallsBounded: a retrieval, cancel, delete or
// input_items call is a look-up a pod answers at once, so a pod that
// takes the connection and never answers holds it for
// upstream.response_timeout, not for whole_response_timeout (sized for a
// whole generation): the search moves past that pod to the one holding
// the response, and one no other pod holds gets 503 naming it.
func TestResponsesStoredCallsBounded(t *testing.T) {
	calls := []struct{ method, sub string }{
		{http.MethodGet, ""}, {http.MethodPost, "/cancel"}, {http.MethodGet, "/input_items"}, {http.MethodDelete, ""},
	}
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			p := &responsesPod{stored: map[string]bool{}}
			for i := range 2 * len(calls) {
				p.stored[fmt.Sprint("resp_on_p_", i)] = true
			}
			s := testGateway(t, []config.Pod{
				{Name: "p", Model: "m", Address: fakePod(t, p.serve)},
				{Name: "hung", Model: "m", Address: fakePod(t, hungPod)},
			}, func(c *config.Config) {
				c.Frontend = fe
				c.Health.Interval = time.Hour
				c.Upstream.ResponseTimeout, c.Upstream.WholeResponseTimeout = 200*time.Millisecond, time.Hour
				c.Models = []config.Model{{Name: "m", Policy: "round_robin"}}
			})
			// A new id each time: each call is a search, which round
			// robin begins on either pod.
			for i := range 2 * len(calls) {
				c := calls[i%len(calls)]
				resp, b := send(t, client, s, c.method, fmt.Sprint("/v1/responses/resp_on_p_", i, c.sub), "")
				if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != "p" {
					t.Errorf("%s %s of resp_on_p_%d: %d on %q: %s", c.method, c.sub, i, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), b)
				}
			}
			if resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_none", ""); resp.StatusCode != 503 || !strings.Contains(b, "pod `hung`") {
				t.Errorf("a response no pod answered for: %d %s", resp.StatusCode, b)
			}
		})
	}
}

// TestResponsesSeekModels: a call by a stored response id the gateway
// does not know names no model, so with several models its search asks
// the combined pods of each in turn: the response is found on another
// model's pod, an id every pod said it does not hold gets vLLM's 404,
// and one a pod that failed may hold gets 503 naming it, never a 404 at
// once that tells the client its response is gone.
func TestResponsesSeekModels(t *testing.T) {
	for _, fe := range []string{"gnet", "fasthttp"} {
		t.Run(fe, func(t *testing.T) {
			var pods []config.Pod
			for _, name := range []string{"a0", "a1", "b0", "b1"} {
				p := &responsesPod{stored: map[string]bool{"resp_on_" + name: true}}
				pods = append(pods, config.Pod{Name: name, Model: name[:1], Address: fakePod(t, p.serve)})
			}
			pods = append(pods, config.Pod{Name: "bad", Model: "c", Address: testnet.Refusing(t)})
			s := testGateway(t, pods, func(c *config.Config) { c.Frontend = fe; c.Health.Interval = time.Hour })
			for _, name := range []string{"b1", "a1", "b0"} {
				resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_on_"+name, "")
				if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != name || resp.Header.Get("x-pdlb-model") != name[:1] {
					t.Errorf("resp_on_%s: %d on %q of %q: %s", name, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), resp.Header.Get("x-pdlb-model"), b)
				}
			}
			unasked := "Response with id 'resp_none' is on none of the pods that answered; 1 of the 5 pods of the models (pod `bad`) failed or are down, and may hold it."
			if resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_none", ""); resp.StatusCode != 503 || !strings.Contains(b, unasked) {
				t.Errorf("resp_none, pod bad refusing: %d %s", resp.StatusCode, b)
			}
			if err := s.Gateway.SetPods(pods[:4]); err != nil {
				t.Fatal(err)
			}
			if resp, b := send(t, client, s, http.MethodGet, "/v1/responses/resp_none", ""); resp.StatusCode != 404 || !strings.Contains(b, "Response with id 'resp_none' not found.") {
				t.Errorf("resp_none, every pod asked: %d %s", resp.StatusCode, b)
			}
		})
	}
}
