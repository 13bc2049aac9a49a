package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/internal/testwait"
)

// The tests below drive prefill and decode pods the way a gateway does,
// with each engine's bodies written out by hand, and compare the answers
// with a combined pod's.

// pdTrio is a prefill, a decode and a combined pod of one engine, model and
// seed.
type pdTrio struct{ pre, dec, comb *Pod }

func startTrio(t *testing.T, engine engines.Kind, mutate func(*Config)) pdTrio {
	t.Helper()
	pod := func(role string) *Pod {
		cfg := Config{Engine: engine, Model: "m", Seed: 11, Speedup: fast, Role: role}
		if mutate != nil {
			mutate(&cfg)
		}
		return testPod(t, cfg)
	}
	return pdTrio{pre: pod(RolePrefill), dec: pod(RoleDecode), comb: pod(RoleCombined)}
}

// clone deep-copies a JSON body.
func clone(t *testing.T, body map[string]any) map[string]any {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// postJSON posts body and decodes a 200 answer.
func postJSON(t *testing.T, c *http.Client, url string, body any) map[string]any {
	t.Helper()
	status, b := post(t, c, url, body)
	return decodeJSON(t, status, b)
}

func decodeJSON(t *testing.T, status int, body []byte) map[string]any {
	t.Helper()
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return m
}

// answer is what a client compares: the text and the finish reason.
type answer struct{ text, finish string }

// finalAnswer posts body to url, streaming or not as body says, and returns
// the answer.
func finalAnswer(t *testing.T, c *http.Client, url string, body map[string]any) answer {
	t.Helper()
	if s, _ := body["stream"].(bool); s {
		resp, events := stream(t, c, context.Background(), url, body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream status %d", resp.StatusCode)
		}
		text, finish := streamedText(parseChunks(t, events))
		return answer{text, finish}
	}
	return jsonAnswer(t, postJSON(t, c, url, body))
}

func jsonAnswer(t *testing.T, m map[string]any) answer {
	t.Helper()
	choice := m["choices"].([]any)[0].(map[string]any)
	a := answer{finish: choice["finish_reason"].(string)}
	if msg, ok := choice["message"].(map[string]any); ok {
		a.text = msg["content"].(string)
	} else {
		a.text = choice["text"].(string)
	}
	return a
}

// A protocol drives one request through a prefill and a decode pod, the
// way a gateway would, and returns the decode pod's answer.
type protocol func(t *testing.T, c *http.Client, p pdTrio, path string, body map[string]any) answer

// vllmPD: the prefill leg with kv_transfer_params (do_remote_decode),
// stream off, one token; then the decode leg with what it returned.
func vllmPD(t *testing.T, c *http.Client, p pdTrio, path string, body map[string]any) answer {
	pre := clone(t, body)
	pre["kv_transfer_params"] = map[string]any{
		"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil,
	}
	pre["stream"] = false
	pre["max_tokens"] = 1
	if _, ok := pre["max_completion_tokens"]; ok {
		pre["max_completion_tokens"] = 1
	}
	delete(pre, "stream_options")
	resp := postJSON(t, c, "http://"+p.pre.Addr()+path, pre)
	params, ok := resp["kv_transfer_params"].(map[string]any)
	if !ok || params["do_remote_prefill"] != true || params["remote_port"] == nil || params["remote_request_id"] == nil {
		t.Fatalf("prefill kv_transfer_params: %v", resp["kv_transfer_params"])
	}
	dec := clone(t, body)
	dec["kv_transfer_params"] = params
	return finalAnswer(t, c, "http://"+p.dec.Addr()+path, dec)
}

// sglangPD: one body with the bootstrap fields to both pods at once.
func sglangPD(t *testing.T, c *http.Client, p pdTrio, path string, body map[string]any) answer {
	host, port, _ := net.SplitHostPort(p.pre.KVXferAddr())
	portN, _ := strconv.Atoi(port)
	b := clone(t, body)
	b["bootstrap_host"], b["bootstrap_port"], b["bootstrap_room"] = host, portN, rand.Int64()
	var wg sync.WaitGroup
	var preStatus int
	var preBody []byte
	wg.Go(func() { preStatus, preBody = postNoFatal(c, "http://"+p.pre.Addr()+path, b) })
	a := finalAnswer(t, c, "http://"+p.dec.Addr()+path, b)
	wg.Wait()
	if preStatus != http.StatusOK {
		t.Fatalf("prefill leg: %d %s", preStatus, preBody)
	}
	return a
}

// postNoFatal is post for goroutines other than the test's.
func postNoFatal(c *http.Client, url string, body any) (int, []byte) {
	b, _ := json.Marshal(body)
	resp, err := c.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// trtCtxFirstPD: the context leg, then the generation leg with the
// returned disaggregated_params and prompt_token_ids.
func trtCtxFirstPD(t *testing.T, c *http.Client, p pdTrio, path string, body map[string]any) answer {
	id := rand.Int64()
	ctx := clone(t, body)
	ctx["disaggregated_params"] = map[string]any{"request_type": "context_only", "disagg_request_id": id}
	ctx["stream"] = false
	delete(ctx, "stream_options")
	resp := postJSON(t, c, "http://"+p.pre.Addr()+path, ctx)
	choice := resp["choices"].([]any)[0].(map[string]any)
	dp, ok := choice["disaggregated_params"].(map[string]any)
	if !ok || dp["request_type"] != "context_only" || dp["encoded_opaque_state"] == nil || dp["ctx_request_id"] == nil ||
		dp["disagg_request_id"] != float64(id) || len(dp["first_gen_tokens"].([]any)) == 0 {
		t.Fatalf("context disaggregated_params: %v", choice["disaggregated_params"])
	}
	if f := choice["finish_reason"]; f != "length" {
		t.Fatalf("context finish_reason %v", f)
	}
	dp["request_type"] = "generation_only"
	gen := clone(t, body)
	gen["disaggregated_params"] = dp
	if strings.Contains(path, "chat") {
		gen["prompt_token_ids"] = resp["prompt_token_ids"]
	} else {
		gen["prompt"] = resp["prompt_token_ids"]
	}
	return finalAnswer(t, c, "http://"+p.dec.Addr()+path, gen)
}

// trtGenFirstPD: the context pod's /server_info, then both legs at once
// with a shared disagg_request_id and schedule_style 1.
func trtGenFirstPD(t *testing.T, c *http.Client, p pdTrio, path string, body map[string]any) answer {
	var info struct {
		Params struct {
			Endpoint string `json:"ctx_info_endpoint"`
			DPRank   *int   `json:"ctx_dp_rank"`
		} `json:"disaggregated_params"`
	}
	status, raw := get(t, c, "http://"+p.pre.Addr()+"/server_info")
	if err := json.Unmarshal(raw, &info); status != http.StatusOK || err != nil || info.Params.Endpoint == "" || info.Params.DPRank == nil {
		t.Fatalf("/server_info: %d %s %v", status, raw, err)
	}
	id := rand.Int64()
	ctx := clone(t, body)
	ctx["disaggregated_params"] = map[string]any{"request_type": "context_only", "disagg_request_id": id, "schedule_style": 1}
	gen := clone(t, body)
	gen["disaggregated_params"] = map[string]any{
		"request_type": "generation_only", "disagg_request_id": id, "ctx_request_id": id, "schedule_style": 1,
		"ctx_info_endpoint": info.Params.Endpoint, "ctx_dp_rank": *info.Params.DPRank,
	}
	var wg sync.WaitGroup
	var ctxStatus int
	var ctxBody []byte
	wg.Go(func() { ctxStatus, ctxBody = postNoFatal(c, "http://"+p.pre.Addr()+path, ctx) })
	a := finalAnswer(t, c, "http://"+p.dec.Addr()+path, gen)
	wg.Wait()
	if ctxStatus != http.StatusOK {
		t.Fatalf("context leg: %d %s", ctxStatus, ctxBody)
	}
	return a
}

func TestPDOutputMatchesCombined(t *testing.T) {
	cases := []struct {
		name   string
		engine engines.Kind
		drive  protocol
	}{
		{"vllm", engines.VLLM, vllmPD},
		{"sglang", engines.SGLang, sglangPD},
		{"trtllm-context-first", engines.TRTLLM, trtCtxFirstPD},
		{"trtllm-generation-first", engines.TRTLLM, trtGenFirstPD},
	}
	prompt := strings.Repeat("the prefill pod computes this prompt once ", 12)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := startTrio(t, tc.engine, nil)
			c := testClient(t)
			legs := int64(0)
			for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
				for _, streaming := range []bool{false, true} {
					body := map[string]any{"model": "m", "max_tokens": 17, "stream": streaming}
					if strings.Contains(path, "chat") {
						body = chatBody(prompt, body)
						if streaming {
							body["stream_options"] = map[string]any{"include_usage": true}
						}
					} else {
						body["prompt"] = prompt
					}
					want := finalAnswer(t, c, "http://"+p.comb.Addr()+path, body)
					got := tc.drive(t, c, p, path, body)
					if got != want || want.finish != "length" || len(want.text) != 17*4 {
						t.Fatalf("%s stream=%v: PD answer %+v, combined %+v", path, streaming, got, want)
					}
					legs++
					testwait.For(t, "prefill pod frees the KV on pickup", func() bool {
						s := p.pre.Stats()
						return s.HeldKVBlocks == 0 && s.UsedBlocks == 0
					})
					if s := p.dec.Stats(); s.KVPulls != legs || s.KVPullFailures != 0 {
						t.Fatalf("decode pod stats %+v after %d legs", s, legs)
					}
				}
			}
			if s := p.pre.Stats(); s.GeneratedTokens != legs || s.Finished != legs || s.KVExpired != 0 {
				t.Fatalf("prefill pod made %d tokens in %d requests (%+v); want one per leg", s.GeneratedTokens, s.Finished, s)
			}
		})
	}
}

// expiredKV prefills prompt on p's prefill pod for a remote decode that
// never comes, and returns its kv_transfer_params once the pod let the
// held KV expire (p's KVTimeout).
func expiredKV(t *testing.T, p pdTrio, c *http.Client, prompt string) any {
	t.Helper()
	pre := chatBody(prompt, map[string]any{
		"max_tokens": 1, "kv_transfer_params": map[string]any{"do_remote_decode": true},
	})
	resp := postJSON(t, c, "http://"+p.pre.Addr()+"/v1/chat/completions", pre)
	testwait.For(t, "the held KV expires", func() bool { return p.pre.Stats().KVExpired == 1 })
	return resp["kv_transfer_params"]
}

func TestPDHeldKVExpires(t *testing.T) {
	p := startTrio(t, engines.VLLM, func(c *Config) { c.KVTimeout = 50 * time.Millisecond })
	c := testClient(t)
	kv := expiredKV(t, p, c, "nobody comes for this KV")
	testwait.For(t, "the expired KV's blocks freed", func() bool {
		s := p.pre.Stats()
		return s.HeldKVBlocks == 0 && s.UsedBlocks == 0
	})
	// A decode leg after the timeout finds nothing and says so.
	dec := chatBody("nobody comes for this KV", map[string]any{"kv_transfer_params": kv})
	status, body := post(t, c, "http://"+p.dec.Addr()+"/v1/chat/completions", dec)
	if status != http.StatusInternalServerError || !strings.Contains(string(body), "not held") {
		t.Fatalf("late decode leg: %d %s", status, body)
	}
	// The answer may reach the client before the pod lets the request go.
	testwait.For(t, "the decode pod to let the failed request go", func() bool {
		s := p.dec.Stats()
		return s.Running+s.Waiting == 0 && s.UsedBlocks == 0
	})
	if s := p.dec.Stats(); s.KVPullFailures != 1 {
		t.Fatalf("decode pod after a failed pull: %+v", s)
	}
	_, metrics := get(t, c, "http://"+p.dec.Addr()+"/metrics")
	if !strings.Contains(string(metrics), `vllm:nixl_num_failed_transfers_total{model_name="m",engine="0"} 1`) {
		t.Fatalf("metrics lack the failed transfer:\n%s", metrics)
	}
}

func TestPDHeldKVBlocksVisible(t *testing.T) {
	p := startTrio(t, engines.VLLM, nil)
	c := testClient(t)
	prompt := strings.Repeat("held blocks ", 100)
	pre := chatBody(prompt, map[string]any{"max_tokens": 1, "kv_transfer_params": map[string]any{"do_remote_decode": true}})
	resp := postJSON(t, c, "http://"+p.pre.Addr()+"/v1/chat/completions", pre)
	want := p.pre.Config().Physics.Blocks(len(chatTokens(prompt)))
	testwait.For(t, "the prefill pod shows its held blocks", func() bool { return p.pre.Stats().HeldKVBlocks == want })
	if s := p.pre.Stats(); s.UsedBlocks != want || s.Running != 0 {
		t.Fatalf("prefill pod %+v, want %d held blocks", s, want)
	}
	dec := chatBody(prompt, map[string]any{"max_tokens": 3, "kv_transfer_params": resp["kv_transfer_params"]})
	postJSON(t, c, "http://"+p.dec.Addr()+"/v1/chat/completions", dec)
	testwait.For(t, "pickup frees them", func() bool { return p.pre.Stats().HeldKVBlocks == 0 })
	_, metrics := get(t, c, "http://"+p.dec.Addr()+"/metrics")
	if !strings.Contains(string(metrics), `vllm:nixl_xfer_time_seconds_count{model_name="m",engine="0"} 1`) {
		t.Fatalf("metrics lack the transfer:\n%s", metrics)
	}
}

func TestSGLangAbortFreesDecodeSlot(t *testing.T) {
	p := startTrio(t, engines.SGLang, nil)
	c := testClient(t)
	host, port, _ := net.SplitHostPort(p.pre.KVXferAddr())
	portN, _ := strconv.Atoi(port)
	// The decode leg alone: its room never gets KV.
	body := chatBody("a room nobody fills", map[string]any{
		"bootstrap_host": host, "bootstrap_port": portN, "bootstrap_room": 12345, "rid": "req-abort-1",
	})
	type result struct {
		status int
		body   []byte
	}
	res := make(chan result, 1)
	go func() {
		s, b := postNoFatal(c, "http://"+p.dec.Addr()+"/v1/chat/completions", body)
		res <- result{s, b}
	}()
	testwait.For(t, "the decode leg takes a slot and waits", func() bool { return p.dec.Stats().Waiting == 1 })
	if s := p.dec.Stats(); s.UsedBlocks == 0 {
		t.Fatalf("a waiting decode leg reserves no KV: %+v", s)
	}
	if status, b := post(t, c, "http://"+p.dec.Addr()+"/abort_request", map[string]any{"rid": "req-abort-1"}); status != http.StatusOK {
		t.Fatalf("abort: %d %s", status, b)
	}
	r := <-res
	if a := jsonAnswer(t, decodeJSON(t, r.status, r.body)); a.finish != "abort" {
		t.Fatalf("aborted decode leg answered %+v", a)
	}
	testwait.For(t, "the slot is free", func() bool {
		s := p.dec.Stats()
		return s.Running+s.Waiting == 0 && s.UsedBlocks == 0 && s.Aborted == 1
	})
}

func TestPDDecodeKilledMidStream(t *testing.T) {
	p := startTrio(t, engines.VLLM, func(c *Config) { c.Speedup = 1 })
	c := testClient(t)
	prompt := "a long answer the decode pod never finishes"
	pre := chatBody(prompt, map[string]any{"max_tokens": 1, "kv_transfer_params": map[string]any{"do_remote_decode": true}})
	resp := postJSON(t, c, "http://"+p.pre.Addr()+"/v1/chat/completions", pre)
	dec := chatBody(prompt, map[string]any{"max_tokens": 2000, "stream": true, "kv_transfer_params": resp["kv_transfer_params"]})
	b, _ := json.Marshal(dec)
	hresp, err := c.Post("http://"+p.dec.Addr()+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer hresp.Body.Close()
	rd := bufio.NewReader(hresp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	if err := p.dec.Kill(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(rd)
	if err == nil || bytes.Contains(rest, []byte("[DONE]")) {
		t.Fatalf("after Kill: read %d more bytes, err %v; want a broken connection", len(rest), err)
	}
}

func TestPDRoles(t *testing.T) {
	p := startTrio(t, engines.VLLM, nil)
	c := testClient(t)
	url := func(pod *Pod) string { return "http://" + pod.Addr() + "/v1/chat/completions" }
	plain := chatBody("plain request", map[string]any{"max_tokens": 5})
	want := jsonAnswer(t, postJSON(t, c, url(p.comb), plain))
	// Prefill and decode pods serve plain requests as combined pods do.
	for _, pod := range []*Pod{p.pre, p.dec} {
		if got := jsonAnswer(t, postJSON(t, c, url(pod), plain)); got != want {
			t.Fatalf("%s answered %+v, combined %+v", pod.Config().Role, got, want)
		}
	}
	f := func(pod *Pod, params map[string]any, want string) {
		t.Helper()
		status, body := post(t, c, url(pod), chatBody("leg", map[string]any{"kv_transfer_params": params}))
		if status != http.StatusBadRequest || !strings.Contains(string(body), want) {
			t.Fatalf("%s: %d %s, want 400 with %q", pod.Config().Role, status, body, want)
		}
	}
	f(p.dec, map[string]any{"do_remote_decode": true}, "role is decode")
	f(p.pre, map[string]any{"do_remote_prefill": true, "remote_host": "127.0.0.1", "remote_port": 1, "remote_request_id": "x"}, "role is prefill")
	f(p.dec, map[string]any{"do_remote_prefill": true}, "needs remote_host")
	// A combined pod ignores PD fields, as an engine without a connector.
	status, body := post(t, c, url(p.comb), chatBody("leg", map[string]any{"max_tokens": 1, "kv_transfer_params": map[string]any{"do_remote_decode": true}}))
	if m := decodeJSON(t, status, body); m["kv_transfer_params"] != nil {
		t.Fatalf("combined pod answered a prefill leg: %s", body)
	}
	if p.comb.KVXferAddr() != "" || p.dec.KVXferAddr() != "" || p.pre.KVXferAddr() == "" {
		t.Fatal("only prefill pods serve KV")
	}
}

// A prefill or decode pod of each engine takes a request that carries
// none of the exchange's fields as its engine does: vLLM's NixlConnector
// computes it locally (no kv_transfer_params, no remote prefill), and a
// TensorRT-LLM server runs it whole (trtllm-serve's conditional
// disaggregation sends such requests to generation servers); SGLang's
// scheduler in either disaggregation mode aborts it with a 400, the status
// of a whole answer and the code of an error event in a stream.
func TestPDRolesPlainRequests(t *testing.T) {
	for _, engine := range engines.Kinds {
		t.Run(string(engine), func(t *testing.T) {
			p := startTrio(t, engine, nil)
			c := testClient(t)
			url := func(pod *Pod) string { return "http://" + pod.Addr() + "/v1/chat/completions" }
			plain := chatBody("plain request", map[string]any{"max_tokens": 5})
			want := jsonAnswer(t, postJSON(t, c, url(p.comb), plain))
			for _, pod := range []*Pod{p.pre, p.dec} {
				role := pod.Config().Role
				if engine != engines.SGLang {
					if got := jsonAnswer(t, postJSON(t, c, url(pod), plain)); got != want {
						t.Fatalf("%s answered %+v, combined %+v", role, got, want)
					}
					continue
				}
				const refusal = "Disaggregated request received without bootstrap room id"
				if status, body := post(t, c, url(pod), plain); status != http.StatusBadRequest || !strings.Contains(string(body), refusal) {
					t.Fatalf("%s: %d %s, want 400 with %q", role, status, body, refusal)
				}
				streamed := clone(t, plain)
				streamed["stream"] = true
				resp, events := stream(t, c, context.Background(), url(pod), streamed)
				var e struct{ Error struct{ Code int } }
				if resp.StatusCode != http.StatusOK || len(events) != 2 || json.Unmarshal(events[0].data, &e) != nil ||
					e.Error.Code != http.StatusBadRequest || !strings.Contains(string(events[0].data), refusal) {
					t.Fatalf("%s, streamed: %d, %d events, first %s", role, resp.StatusCode, len(events), events[0].data)
				}
			}
		})
	}
}

func TestPDServerInfo(t *testing.T) {
	c := testClient(t)
	sg := startTrio(t, engines.SGLang, nil)
	var info struct {
		Mode string `json:"disaggregation_mode"`
		Port int    `json:"disaggregation_bootstrap_port"`
	}
	_, raw := get(t, c, "http://"+sg.pre.Addr()+"/get_server_info")
	if err := json.Unmarshal(raw, &info); err != nil || info.Mode != "prefill" || fmt.Sprint(info.Port) != strings.Split(sg.pre.KVXferAddr(), ":")[1] {
		t.Fatalf("sglang prefill /get_server_info: %s", raw)
	}
	trt := startTrio(t, engines.TRTLLM, nil)
	if _, raw := get(t, c, "http://"+trt.dec.Addr()+"/server_info"); string(raw) != `{"disaggregated_params":{}}` {
		t.Fatalf("trtllm gen /server_info: %s", raw)
	}
}

// TestSGLangDecodeDefaultsBootstrapPort: a decode leg with bootstrap_port
// null (or absent) reaches the prefill pod at the decode pod's own
// bootstrap port, as SGLang's Scheduler.handle_generate_request fills in
// --disaggregation-bootstrap-port.
func TestSGLangDecodeDefaultsBootstrapPort(t *testing.T) {
	pre := testPod(t, Config{Engine: engines.SGLang, Model: "m", Seed: 11, Speedup: fast, Role: RolePrefill, KVTimeout: 3 * time.Second})
	host, port, _ := net.SplitHostPort(pre.KVXferAddr())
	portN, _ := strconv.Atoi(port)
	dec := testPod(t, Config{Engine: engines.SGLang, Model: "m", Seed: 11, Speedup: fast, Role: RoleDecode, BootstrapPort: portN})
	c := testClient(t)
	b := chatBody("port from the decode pod", map[string]any{"max_tokens": 4,
		"bootstrap_host": host, "bootstrap_port": nil, "bootstrap_room": rand.Int64()})
	var wg sync.WaitGroup
	var preStatus int
	var preBody []byte
	wg.Go(func() { preStatus, preBody = postNoFatal(c, "http://"+pre.Addr()+"/v1/chat/completions", b) })
	status, body := postNoFatal(c, "http://"+dec.Addr()+"/v1/chat/completions", b)
	wg.Wait()
	if preStatus != http.StatusOK || status != http.StatusOK {
		t.Fatalf("prefill leg %d %s; decode leg %d %s", preStatus, preBody, status, body)
	}
	if a := jsonAnswer(t, decodeJSON(t, status, body)); a.finish != "length" {
		t.Fatalf("decode leg answered %+v", a)
	}
}

// TestSGLangStreamedPrefillLeg: SGLang's prefill leg carries the client's
// "stream", and a streamed one is answered as any streamed request: an
// event stream of its one token, finish_reason "length" (the prefill
// scheduler finishes it once the decode pod took the KV), [DONE]. One
// whose KV no decode pod takes fails after it was accepted, as SGLang
// fails a stream it started: 200, an error event, [DONE].
func TestSGLangStreamedPrefillLeg(t *testing.T) {
	p := startTrio(t, engines.SGLang, nil)
	c := testClient(t)
	host, port, _ := net.SplitHostPort(p.pre.KVXferAddr())
	portN, _ := strconv.Atoi(port)
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		body := map[string]any{"model": "m", "max_tokens": 9, "stream": true}
		if strings.Contains(path, "chat") {
			body = chatBody("a streamed prefill leg", body)
		} else {
			body["prompt"] = "a streamed prefill leg"
		}
		want := finalAnswer(t, c, "http://"+p.comb.Addr()+path, body)
		b := clone(t, body)
		b["bootstrap_host"], b["bootstrap_port"], b["bootstrap_room"] = host, portN, rand.Int64()
		var wg sync.WaitGroup
		var decStatus int
		var decBody []byte
		wg.Go(func() { decStatus, decBody = postNoFatal(c, "http://"+p.dec.Addr()+path, b) })
		resp, events := stream(t, c, context.Background(), "http://"+p.pre.Addr()+path, b)
		wg.Wait()
		if decStatus != http.StatusOK {
			t.Fatalf("%s decode leg: %d %s", path, decStatus, decBody)
		}
		text, finish := streamedText(parseChunks(t, events))
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") ||
			text != want.text[:4] || finish != "length" {
			t.Fatalf("%s prefill leg: %d %s, text %q finish %q; want the combined answer's first token %q",
				path, resp.StatusCode, resp.Header.Get("Content-Type"), text, finish, want.text[:4])
		}
	}

	lone := testPod(t, Config{Engine: engines.SGLang, Model: "m", Speedup: fast, Role: RolePrefill, KVTimeout: 50 * time.Millisecond})
	host, port, _ = net.SplitHostPort(lone.KVXferAddr())
	portN, _ = strconv.Atoi(port)
	b := chatBody("no decode pod takes this", map[string]any{"stream": true,
		"bootstrap_host": host, "bootstrap_port": portN, "bootstrap_room": rand.Int64()})
	resp, events := stream(t, c, context.Background(), "http://"+lone.Addr()+"/v1/chat/completions", b)
	var e struct {
		Error struct {
			Object, Message, Type string
			Code                  int
		}
	}
	if resp.StatusCode != http.StatusOK || len(events) != 2 || string(events[1].data) != "[DONE]" ||
		json.Unmarshal(events[0].data, &e) != nil || e.Error.Code != 500 || e.Error.Type != "INTERNAL_SERVER_ERROR" || e.Error.Object != "error" {
		t.Fatalf("a prefill leg nobody picked up: %d, %d events, first %s", resp.StatusCode, len(events), events[0].data)
	}
}

// TestSGLangDecodeWithoutBootstrapHost: SGLang takes a decode leg without
// bootstrap_host; its KV receiver then looks for the prefill pod at
// "None:<port>" (Python's rendering of the missing host), the handshake
// fails and the scheduler aborts the request with a 500: the status of a
// whole answer, an error event in a stream it started.
func TestSGLangDecodeWithoutBootstrapHost(t *testing.T) {
	dec := testPod(t, Config{Engine: engines.SGLang, Model: "m", Seed: 11, Speedup: fast, Role: RoleDecode})
	c := testClient(t)
	url := "http://" + dec.Addr() + "/v1/chat/completions"
	b := chatBody("no host to fetch the KV from", map[string]any{"max_tokens": 4, "bootstrap_room": rand.Int64()})
	if status, body := post(t, c, url, b); status != http.StatusInternalServerError || !strings.Contains(string(body), "None:8998") {
		t.Fatalf("decode leg without bootstrap_host: %d %s, want a 500 for the failed handshake", status, body)
	}
	b["stream"] = true
	resp, events := stream(t, c, context.Background(), url, b)
	var e struct{ Error struct{ Code int } }
	if resp.StatusCode != http.StatusOK || len(events) != 2 || string(events[1].data) != "[DONE]" ||
		json.Unmarshal(events[0].data, &e) != nil || e.Error.Code != 500 {
		t.Fatalf("streamed decode leg without bootstrap_host: %d, %d events, first %s", resp.StatusCode, len(events), events[0].data)
	}
	testwait.For(t, "the decode pod to let the failed requests go", func() bool {
		s := dec.Stats()
		return s.Running+s.Waiting == 0 && s.UsedBlocks == 0
	})
}

// TestSGLangBatchLegs: SGLang runs each prompt of a completion batch as a
// request of its own with its own bootstrap room: bootstrap_host, _port
// and _room as lists of one per prompt (what SGLang's router sends), or
// one room, which the engine numbers on for the batch's next prompts
// (GenerateReqInput._normalize_bootstrap_params). Both pods run each
// prompt's leg, the decode pod pulls each prompt's KV, and the answer is
// a combined pod's. A list shorter than the batch fails the request (the
// engine's IndexError); a prompt whose room is null is refused as a
// request without one.
func TestSGLangBatchLegs(t *testing.T) {
	p := startTrio(t, engines.SGLang, nil)
	c := testClient(t)
	host, port, _ := net.SplitHostPort(p.pre.KVXferAddr())
	portN, _ := strconv.Atoi(port)
	const path = "/v1/completions"
	body := map[string]any{"model": "m", "max_tokens": 6, "prompt": []string{"the first prompt of the batch", "and its second prompt, a little longer"}}
	type answer struct {
		Choices []struct {
			Index        int
			Text         string
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	read := func(status int, b []byte) answer {
		t.Helper()
		var a answer
		if err := json.Unmarshal(b, &a); status != http.StatusOK || err != nil {
			t.Fatalf("%d %s %v", status, b, err)
		}
		return a
	}
	want := read(post(t, c, "http://"+p.comb.Addr()+path, body))
	room := rand.Int64N(1 << 62)
	pulls := int64(0)
	for _, fields := range []map[string]any{
		{"bootstrap_host": []any{host, host}, "bootstrap_port": []any{portN, portN}, "bootstrap_room": []any{room, room + 7}},
		{"bootstrap_host": host, "bootstrap_port": portN, "bootstrap_room": room + 100},
	} {
		b := clone(t, body)
		maps.Copy(b, fields)
		var wg sync.WaitGroup
		var preStatus int
		var preBody []byte
		wg.Go(func() { preStatus, preBody = postNoFatal(c, "http://"+p.pre.Addr()+path, b) })
		got := read(post(t, c, "http://"+p.dec.Addr()+path, b))
		wg.Wait()
		if pre := read(preStatus, preBody); len(pre.Choices) != 2 || pre.Usage.CompletionTokens != 2 {
			t.Fatalf("%v: the prefill leg answered %+v, want a token for each prompt", fields["bootstrap_room"], pre)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%v: the decode leg answered %+v, a combined pod %+v", fields["bootstrap_room"], got, want)
		}
		pulls += 2
		if s := p.dec.Stats(); s.KVPulls != pulls || s.KVPullFailures != 0 {
			t.Fatalf("%v: decode pod %+v, want %d pulls, one per prompt", fields["bootstrap_room"], s, pulls)
		}
		testwait.For(t, "the prefill pod to free each prompt's KV", func() bool {
			s := p.pre.Stats()
			return s.HeldKVBlocks == 0 && s.UsedBlocks == 0
		})
	}

	b := clone(t, body)
	b["bootstrap_host"], b["bootstrap_port"], b["bootstrap_room"] = host, portN, []any{room + 200}
	if status, got := post(t, c, "http://"+p.dec.Addr()+path, b); status != http.StatusInternalServerError || !strings.Contains(string(got), "list index out of range") {
		t.Fatalf("a room list shorter than the batch: %d %s, want the engine's 500", status, got)
	}
	b["bootstrap_room"] = []any{room + 300, nil}
	if status, got := post(t, c, "http://"+p.dec.Addr()+path, b); status != http.StatusBadRequest || !strings.Contains(string(got), "without bootstrap room id") {
		t.Fatalf("a prompt without its room: %d %s, want a 400", status, got)
	}
	testwait.For(t, "the decode pod to let the refused batches go", func() bool {
		s := p.dec.Stats()
		return s.Running+s.Waiting == 0 && s.UsedBlocks == 0
	})
}
