package lb_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/engines/sim"
	"pdlb/internal/lbtest"
	"pdlb/internal/testlog"
	"pdlb/internal/testwait"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/discovery/spec"
)

// TestPDEnginesDoNotMix: a model whose prefill and decode pods run
// different engines is refused at start, with the model, the pods and
// their engines named. Served, its prefill pod's exchange reaches a decode
// pod that reads none of it: the decode pod computes the prompt again and
// the prefill pod holds the KV it made for a pickup that never comes.
func TestPDEnginesDoNotMix(t *testing.T) {
	pre := startSim(t, pdEngines[0], "pre", sim.RolePrefill, nil)
	dec := startSim(t, pdEngines[1], "dec", sim.RoleDecode, nil)
	cfg := config.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", ""
	cfg.Pods = []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}
	s, err := lb.Start(cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		defer s.Shutdown(context.Background())
		resp, _ := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", false, 8))
		t.Fatalf("a vllm prefill pod and an sglang decode pod of one model were served: %d via %q→%q, the decode pod pulled the KV %d times, the prefill pod holds %d blocks",
			resp.StatusCode, resp.Header.Get("x-pdlb-prefill-pod"), resp.Header.Get("x-pdlb-decode-pod"), dec.Stats().KVPulls, pre.Stats().HeldKVBlocks)
	}
	for _, want := range []string{`model "m"`, `pod "pre"`, "vllm", `pod "dec"`, "sglang"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not name %s", err, want)
		}
	}
}

// TestDiscoveredPDPodOfAnotherEngineLeftOut: a decode pod discovery finds
// running another engine than the model's prefill pod is left out, with a
// log line naming it, and the rest of what discovery found is served.
func TestDiscoveredPDPodOfAnotherEngineLeftOut(t *testing.T) {
	pre := startSim(t, pdEngines[0], "pre", sim.RolePrefill, nil)
	dec := startSim(t, pdEngines[0], "dec", sim.RoleDecode, nil)
	odd := startSim(t, pdEngines[1], "odd", sim.RoleDecode, nil)
	found := func(p *sim.Pod) spec.DNS {
		host, port, _ := net.SplitHostPort(p.Addr())
		n, _ := strconv.Atoi(port)
		return spec.DNS{Name: host, Port: n, Model: "m", Engine: string(p.Config().Engine), Role: spec.RoleDecode,
			Roleset: "rs0", Interval: 50 * time.Millisecond}
	}
	var logs testlog.Buffer
	s := lbtest.StartGatewayLog(t, []config.Pod{pdPod(pre, pre.Addr(), "rs0")}, func(c *config.Config) {
		c.Discovery.DNS = []spec.DNS{found(dec), found(odd)}
	}, slog.New(slog.NewTextHandler(&logs, nil)))
	testwait.For(t, "discovery to add the decode pod", func() bool {
		return strings.Contains(get(t, "http://"+s.AdminAddr()+"/admin/pods"), dec.Addr())
	})
	// Each name is resolved on its own: the odd pod's refusal may come
	// after the decode pod joined.
	testwait.For(t, "a log line naming the sglang pod left out", func() bool {
		l := logs.String()
		return strings.Contains(l, "discovered pod left out") && strings.Contains(l, odd.Addr()) && strings.Contains(l, "sglang")
	})
	if pods := get(t, "http://"+s.AdminAddr()+"/admin/pods"); strings.Contains(pods, odd.Addr()) {
		t.Fatalf("the sglang decode pod joined the vllm prefill pod's model:\n%s", pods)
	}
	resp, b := post(t, s, "/v1/chat/completions", pdBody("/v1/chat/completions", false, 8))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-decode-pod") != dec.Addr() {
		t.Fatalf("%d via %q: %s", resp.StatusCode, resp.Header.Get("x-pdlb-decode-pod"), b)
	}
}

// TestPDLocalPrefillByEngine: conditional disaggregation sends a prompt
// the decode pod lacks little of to the decode pod whole, which vLLM and
// TensorRT-LLM decode pods serve by prefilling it themselves. SGLang's
// decode pods refuse a request without bootstrap_room, so on an SGLang
// model local_prefill_max_tokens is ignored, with a log line at start
// saying so, and every request goes through the exchange.
func TestPDLocalPrefillByEngine(t *testing.T) {
	for _, e := range pdEngines {
		t.Run(e.name, func(t *testing.T) {
			pre := startSim(t, e, "pre", sim.RolePrefill, nil)
			dec := startSim(t, e, "dec", sim.RoleDecode, nil)
			var logs testlog.Buffer
			s := lbtest.StartGatewayLog(t, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}, func(c *config.Config) {
				c.PD.LocalPrefillMaxTokens = 1 << 20
				if e.style != "" {
					c.PD.TRTScheduleStyle = e.style
				}
			}, slog.New(slog.NewTextHandler(&logs, nil)))
			const path = "/v1/chat/completions"
			body := pdBody(path, false, 8)
			resp, b := post(t, s, path, body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			kind, prefillPod, pulls := "local", "", int64(0)
			if e.engine == engines.SGLang {
				kind, prefillPod, pulls = "pair", "pre", 1
			}
			if got := resp.Header.Get("x-pdlb-prefill-pod"); got != prefillPod || resp.Header.Get("x-pdlb-decode-pod") != "dec" {
				t.Fatalf("prefill pod %q, decode pod %q: want %q, %q", got, resp.Header.Get("x-pdlb-decode-pod"), prefillPod, "dec")
			}
			if n := metricValue(t, s, `pdlb_pd_routed_total{model="m",kind="`+kind+`"}`); n != 1 {
				t.Fatalf("pdlb_pd_routed_total %s = %v, want 1", kind, n)
			}
			if got := dec.Stats().KVPulls; got != pulls {
				t.Fatalf("the decode pod pulled KV %d times, want %d", got, pulls)
			}
			warned := strings.Contains(logs.String(), "local_prefill_max_tokens")
			if warned != (e.engine == engines.SGLang) {
				t.Fatalf("log names local_prefill_max_tokens: %v, want it for sglang only:\n%s", warned, logs.String())
			}
		})
	}
}

// TestPDBatch: a completion batch (several prompts, as text or as token
// ids) goes through SGLang's exchange with a bootstrap room for each
// prompt, as SGLang's router sends it: both pods run every prompt, the
// decode pod pulls each prompt's KV, and the answer and its usage are a
// combined pod's. Other engines' exchanges hand one prompt's KV over
// (vLLM's prefill answer carries the first prompt's kv_transfer_params
// only, and trtllm-serve's disaggregated server refuses batches): there a
// batch goes whole to a combined pod of the model, else to a decode pod
// that prefills it itself.
func TestPDBatch(t *testing.T) {
	bodies := []string{
		`{"model":"m","prompt":["the first prompt of the batch","and its second prompt"],"max_tokens":6}`,
		`{"model":"m","prompt":[[5,17,42,99,3,12,77],[8,8,1,64,30]],"max_tokens":5,"stream":true}`,
	}
	type usage struct {
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	for _, e := range pdEngines {
		t.Run(e.name, func(t *testing.T) {
			pre, dec, comb := startTrio(t, e)
			const path = "/v1/completions"
			f := func(pods []config.Pod, pod, kind string) {
				t.Helper()
				s := pdGateway(t, e, pods, nil)
				for _, body := range bodies {
					want := askDirect(t, comb.Addr(), path, body)
					resp, b := post(t, s, path, body)
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("%d %s", resp.StatusCode, b)
					}
					if got := parseAnswer(t, resp, b); got != want {
						t.Fatalf("answer %+v, a combined pod's %+v", got, want)
					}
					prefillPod := ""
					if kind == "pair" {
						prefillPod = "pre"
					}
					if got := resp.Header.Get("x-pdlb-pod"); got != pod || resp.Header.Get("x-pdlb-prefill-pod") != prefillPod {
						t.Fatalf("served by %q (prefill pod %q), want %q (prefill pod %q)", got, resp.Header.Get("x-pdlb-prefill-pod"), pod, prefillPod)
					}
					if !strings.Contains(body, `"stream":true`) {
						var got, direct usage
						r, err := client.Post("http://"+comb.Addr()+path, "application/json", strings.NewReader(body))
						if err != nil {
							t.Fatal(err)
						}
						wb, _ := io.ReadAll(r.Body)
						r.Body.Close()
						if json.Unmarshal([]byte(b), &got) != nil || json.Unmarshal(wb, &direct) != nil || got.Usage == nil || direct.Usage == nil || *got.Usage != *direct.Usage {
							t.Fatalf("usage %s, a combined pod's %s", b, wb)
						}
					}
				}
				if n := metricValue(t, s, `pdlb_pd_routed_total{model="m",kind="`+kind+`"}`); n != float64(len(bodies)) {
					t.Fatalf("pdlb_pd_routed_total %s = %v, want %d", kind, n, len(bodies))
				}
				ledgerSettles(t, s)
			}
			pair := []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}
			if e.engine != engines.SGLang {
				f(append(pair, pdPod(comb, comb.Addr(), "")), "comb", "combined")
				f(pair, "dec", "local")
				if st := pre.Stats(); st.HeldKVBlocks != 0 || dec.Stats().KVPulls != 0 {
					t.Fatalf("a batch went through an exchange: the prefill pod holds %d blocks, the decode pod pulled %d times", st.HeldKVBlocks, dec.Stats().KVPulls)
				}
				return
			}
			f(append(pair, pdPod(comb, comb.Addr(), "")), "dec", "pair")
			f(pair, "dec", "pair")
			if st, want := dec.Stats(), int64(2*2*len(bodies)); st.KVPulls != want || st.KVPullFailures != 0 {
				t.Fatalf("the decode pod pulled %d times (%d failed), want %d: one per prompt", st.KVPulls, st.KVPullFailures, want)
			}
			testwait.For(t, "the prefill pod to free each prompt's KV", func() bool { return pre.Stats().HeldKVBlocks == 0 })
		})
	}
}

// TestPDChoicesGoWhole: no engine's exchange carries n > 1 (each runs a
// prompt's n samples as requests of their own, and its exchange hands one
// request's KV over), so such a request goes whole to a combined pod;
// without one, to a decode pod that prefills it itself, and on SGLang,
// whose decode pods refuse a request without a room, it is refused with
// a 400 naming n. n = 1 goes through the exchange.
func TestPDChoicesGoWhole(t *testing.T) {
	for _, e := range pdEngines {
		t.Run(e.name, func(t *testing.T) {
			pre, dec, comb := startTrio(t, e)
			pair := []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}
			withComb := pdGateway(t, e, append(pair, pdPod(comb, comb.Addr(), "")), nil)
			without := pdGateway(t, e, pair, nil)
			for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
				body := strings.Replace(pdBody(path, false, 6), `"max_tokens"`, `"n":3,"max_tokens"`, 1)
				resp, b := post(t, withComb, path, body)
				if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-pod") != "comb" || resp.Header.Get("x-pdlb-prefill-pod") != "" {
					t.Fatalf("%s n=3: %d from %q (prefill pod %q), want the combined pod's answer: %s",
						path, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), resp.Header.Get("x-pdlb-prefill-pod"), b)
				}
				resp, b = post(t, without, path, body)
				switch {
				case e.engine.DecodeServesPlain():
					if resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-pod") != "dec" || resp.Header.Get("x-pdlb-prefill-pod") != "" ||
						strings.Count(b, `"index":`) < 3 {
						t.Fatalf("%s n=3 without a combined pod: %d from %q (prefill pod %q), want the decode pod's three choices: %s",
							path, resp.StatusCode, resp.Header.Get("x-pdlb-pod"), resp.Header.Get("x-pdlb-prefill-pod"), b)
					}
				case resp.StatusCode != http.StatusBadRequest || !strings.Contains(b, `"param":"n"`) || !strings.Contains(b, "is 3,"):
					t.Fatalf("%s n=3 without a combined pod: %d %s, want a 400 naming n and its value", path, resp.StatusCode, b)
				}
				one := strings.Replace(body, `"n":3`, `"n":1`, 1)
				if resp, b := post(t, without, path, one); resp.StatusCode != http.StatusOK || resp.Header.Get("x-pdlb-prefill-pod") != "pre" {
					t.Fatalf("%s n=1: %d via prefill pod %q: %s", path, resp.StatusCode, resp.Header.Get("x-pdlb-prefill-pod"), b)
				}
			}
			if got := dec.Stats().KVPulls; got != 2 {
				t.Fatalf("the decode pod pulled KV %d times, want 2: the n=1 requests only", got)
			}
		})
	}
}
