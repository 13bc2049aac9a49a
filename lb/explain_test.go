package lb_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"pdlb/engines/sim"
	"pdlb/lb"
	"pdlb/lb/config"
)

// explained is the part of an explanation the tests read.
type explained struct {
	Model         string  `json:"model"`
	Policy        string  `json:"policy"`
	Pod           string  `json:"pod"`
	PredictedTTFT float64 `json:"predicted_ttft_s"`
	Candidates    []struct {
		Pod           string   `json:"pod"`
		Score         *float64 `json:"score"`
		CachedTokens  *int     `json:"cached_tokens"`
		InFlight      *int     `json:"in_flight"`
		PredictedTTFT *float64 `json:"predicted_ttft_s"`
		Chosen        string   `json:"chosen"`
		Skipped       string   `json:"skipped"`
	} `json:"candidates"`
}

// check fails t unless e explains a pick among every pod of names.
func (e explained) check(t *testing.T, names ...string) {
	t.Helper()
	if e.Model != "m" || e.Policy != "least_request" || len(e.Candidates) != len(names) {
		t.Fatalf("explanation %+v", e)
	}
	chosen := 0
	for _, c := range e.Candidates {
		if c.Score == nil || c.CachedTokens == nil || c.InFlight == nil || c.PredictedTTFT == nil {
			t.Errorf("candidate %s lacks a score, cached depth, load or prediction: %+v", c.Pod, c)
		}
		switch {
		case c.Chosen == "pod" && c.Pod == e.Pod:
			chosen++
		case c.Skipped == "":
			t.Errorf("candidate %s neither chosen nor skipped", c.Pod)
		}
	}
	if chosen != 1 {
		t.Errorf("%d candidates chosen as %s", chosen, e.Pod)
	}
}

const adminToken = "s3cret-admin"

func explainGateway(t *testing.T) *lb.Server {
	sims := testFleet(t, "m", 2, 100)
	return testGateway(t, podsOf("m", sims...), func(c *config.Config) {
		c.Access.AdminToken = adminToken
		c.Models = []config.Model{{Name: "m", Policy: "least_request"}}
	})
}

func TestExplainHeader(t *testing.T) {
	s := explainGateway(t)
	resp, _ := postHeaders(t, s, chatBody, map[string]string{"x-pdlb-debug": "explain", "x-pdlb-admin-token": adminToken})
	var e explained
	if err := json.Unmarshal([]byte(resp.Header.Get("x-pdlb-explain")), &e); err != nil {
		t.Fatalf("x-pdlb-explain %q: %v", resp.Header.Get("x-pdlb-explain"), err)
	}
	e.check(t, "m-0", "m-1")
	if e.Pod != resp.Header.Get("x-pdlb-pod") {
		t.Errorf("explained pod %s, answered by %s", e.Pod, resp.Header.Get("x-pdlb-pod"))
	}

	for _, h := range []map[string]string{
		{"x-pdlb-debug": "explain"},
		{"x-pdlb-debug": "explain", "x-pdlb-admin-token": "wrong"},
	} {
		if resp, _ := postHeaders(t, s, chatBody, h); resp.Header.Get("x-pdlb-explain") != "" {
			t.Errorf("explained to %v", h)
		}
	}
}

func TestExplainStreamComment(t *testing.T) {
	s := explainGateway(t)
	body := strings.Replace(chatBody, `"max_tokens":8`, `"max_tokens":8,"stream":true`, 1)
	_, out := postHeaders(t, s, body, map[string]string{"x-pdlb-debug": "explain", "x-pdlb-admin-token": adminToken})
	first, _, _ := strings.Cut(out, "\n\n")
	js, ok := strings.CutPrefix(first, ": x-pdlb-explain ")
	if !ok {
		t.Fatalf("stream starts %q, want the explanation's SSE comment", first)
	}
	var e explained
	if err := json.Unmarshal([]byte(js), &e); err != nil {
		t.Fatal(err)
	}
	e.check(t, "m-0", "m-1")
	if !strings.Contains(out, "data: [DONE]") {
		t.Errorf("stream after the comment: %q", out)
	}
}

func TestExplainAdminEndpoint(t *testing.T) {
	s := explainGateway(t)
	get := func(token, model string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.AdminAddr()+"/admin/explain?model="+model, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(bufio.NewReader(resp.Body))
		return resp.StatusCode, string(b)
	}
	if code, _ := get("", "m"); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d", code)
	}
	// Nobody read before: nothing recorded. The read arms recording.
	var view struct {
		Decisions []explained `json:"decisions"`
	}
	code, out := get(adminToken, "m")
	if err := json.Unmarshal([]byte(out), &view); code != http.StatusOK || err != nil || len(view.Decisions) != 0 {
		t.Fatalf("first read: %d %v %s", code, err, out)
	}
	for range 3 {
		post(t, s, "/v1/chat/completions", chatBody)
	}
	if _, out = get(adminToken, "m"); json.Unmarshal([]byte(out), &view) != nil || len(view.Decisions) != 3 {
		t.Fatalf("after 3 requests: %s", out)
	}
	for _, e := range view.Decisions {
		e.check(t, "m-0", "m-1")
	}
	// A model the fleet does not serve has no decisions to wait for.
	if code, out := get(adminToken, "nope"); code != http.StatusNotFound || !strings.Contains(out, "nope") {
		t.Errorf("an unknown model: %d %q, want 404 naming it", code, out)
	}
}

func TestExplainPDOpenToAll(t *testing.T) {
	e := pdEngines[0]
	pre := startSim(t, e, "pre", sim.RolePrefill, nil)
	dec := startSim(t, e, "dec", sim.RoleDecode, nil)
	s := pdGateway(t, e, []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}, func(c *config.Config) {
		c.Tracing.Explain = true // no token needed
	})
	resp, _ := postHeaders(t, s, chatBody, map[string]string{"x-pdlb-debug": "explain"})
	var x struct {
		Policy, Kind string
		Candidates   []struct{ Pod, Chosen string }
	}
	if err := json.Unmarshal([]byte(resp.Header.Get("x-pdlb-explain")), &x); err != nil {
		t.Fatalf("x-pdlb-explain %q: %v", resp.Header.Get("x-pdlb-explain"), err)
	}
	if x.Policy != "pd" || x.Kind != "pair" || len(x.Candidates) != 2 || x.Candidates[0].Chosen != "prefill" || x.Candidates[1].Chosen != "decode" {
		t.Fatalf("PD explanation %s", resp.Header.Get("x-pdlb-explain"))
	}
}

// The access log has the predicted TTFT beside the measured one.
func TestAccessLogPredictedTTFT(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), func(c *config.Config) { c.AccessLog = path })
	body := strings.Replace(chatBody, `"max_tokens":8`, `"max_tokens":8,"stream":true`, 1)
	postHeaders(t, s, body, nil)
	lines := readAccessLog(t, s, path)
	if len(lines) != 1 || lines[0].num("predicted_ttft_ms") <= 0 || lines[0].num("ttft_ms") <= 0 {
		t.Fatalf("access log %v, want ttft_ms and predicted_ttft_ms", lines)
	}
}

// TestMetricsListener: metrics serves GET /metrics to anyone, and nothing
// else, while the admin listener beside it keeps requiring admin_token.
func TestMetricsListener(t *testing.T) {
	sims := testFleet(t, "m", 1, 100)
	s := testGateway(t, podsOf("m", sims...), func(c *config.Config) {
		c.Access.AdminToken = adminToken
		c.Metrics = "127.0.0.1:0"
	})
	status := func(url string) int {
		t.Helper()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	m := "http://" + s.MetricsAddr()
	if b := get(t, m+"/metrics"); !strings.Contains(b, "pdlb_requests_in_flight") {
		t.Fatalf("metrics listener's /metrics:\n%.300s", b)
	}
	for _, path := range []string{"/debug/pprof/", "/admin/pods", "/admin/explain?model=m", "/"} {
		if code := status(m + path); code != http.StatusNotFound {
			t.Errorf("metrics listener %s: %d, want 404", path, code)
		}
	}
	if code := status("http://" + s.AdminAddr() + "/metrics"); code != http.StatusUnauthorized {
		t.Errorf("admin listener's /metrics without the token: %d, want 401", code)
	}
}
