package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/engines"
	"pdlb/lb/config"
	"pdlb/lb/pool"
	"pdlb/lb/upstream"
)

// TestPlanOutputAcrossRoles: a pod the planner moved to prefill and back
// adds to the model's output only what it generated as a decode pod. The
// first tokens it generated as a prefill pod are the decode pods' output
// already; credited when it came back, they landed in one window as a
// burst of decode demand.
func TestPlanOutputAcrossRoles(t *testing.T) {
	st := &modelPlan{generated: map[string]float64{}}
	read := func(role string, tokens float64) {
		t.Helper()
		st.countOutput("pod", role, &pool.Scraped{Load: engines.Load{GeneratedTokens: tokens}}, 60)
	}
	read(config.RoleDecode, 1000)
	read(config.RoleDecode, 1500) // +500 as a decode pod
	read(config.RolePrefill, 1600)
	read(config.RolePrefill, 9600) // 8000 first tokens as a prefill pod
	read(config.RoleDecode, 9700)  // +100 as a decode pod again
	if st.output != 600 {
		t.Fatalf("output %v tokens, want 600 (500 + 100 generated as a decode pod)", st.output)
	}
}

// TestPlanOutputAfterRestart: a pod whose token counter went backwards
// restarted, and what it generated since counts, as Prometheus's rate
// counts a reset, rather than being lost with the window.
func TestPlanOutputAfterRestart(t *testing.T) {
	st := &modelPlan{generated: map[string]float64{}}
	for _, tokens := range []float64{1000, 1500, 200, 300} {
		st.countOutput("pod", config.RoleDecode, &pool.Scraped{Load: engines.Load{GeneratedTokens: tokens}}, 60)
	}
	if st.output != 800 {
		t.Fatalf("output %v tokens, want 800 (500, then 200 since the restart, then 100)", st.output)
	}
}

// TestPlanOutputOfPodsThatLeft: a pod that left the model leaves no token
// baseline behind, so baselines do not pile up as pods come and go, and
// one back under the same name is not credited what it generated away
// (serving another model, say).
func TestPlanOutputOfPodsThatLeft(t *testing.T) {
	st := &modelPlan{generated: map[string]float64{}}
	read := func(name string, tokens float64) {
		t.Helper()
		st.countOutput(name, config.RoleDecode, &pool.Scraped{Load: engines.Load{GeneratedTokens: tokens}}, 60)
	}
	stay := &pool.Pod{Config: config.Pod{Name: "stay"}}
	read("stay", 100)
	read("away", 1000)
	read("stay", 200)
	read("away", 1500)
	st.forgetGone([]*pool.Pod{stay}) // "away" left
	if len(st.generated) != 1 {
		t.Fatalf("baselines of %v, want only the pod that stayed", st.generated)
	}
	read("away", 9500) // back, 8000 tokens on
	read("away", 9600)
	if st.output != 700 {
		t.Fatalf("output %v tokens, want 700 (100 + 500 + 100 since it came back)", st.output)
	}
}

// TestPlanForgetsRemovedModels: a model a reload removed, or left with
// fewer than two prefill and decode pods, is planned no more, and
// /admin/plan and the pdlb_plan_* series stop showing its last split as
// the pool's.
func TestPlanForgetsRemovedModels(t *testing.T) {
	cfg := config.Default()
	cfg.Plan.Enabled = true
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}, {Name: "n", Policy: "least_request"}, {Name: "o", Policy: "least_request"}}
	cfg.Pods = []config.Pod{
		{Name: "m-pre", Model: "m", Address: "127.0.0.1:10001", Role: config.RolePrefill, Roleset: "a"},
		{Name: "m-dec", Model: "m", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "a"},
		{Name: "n-pre", Model: "n", Address: "127.0.0.1:10003", Role: config.RolePrefill, Roleset: "a"},
		{Name: "n-dec", Model: "n", Address: "127.0.0.1:10004", Role: config.RoleDecode, Roleset: "a"},
		{Name: "o-pre", Model: "o", Address: "127.0.0.1:10005", Role: config.RolePrefill, Roleset: "a"},
		{Name: "o-dec", Model: "o", Address: "127.0.0.1:10006", Role: config.RoleDecode, Roleset: "a"},
	}
	g := started(t, cfg)
	planned := func() []string {
		t.Helper()
		rec := httptest.NewRecorder()
		g.servePlan(rec, httptest.NewRequest(http.MethodGet, "/admin/plan", nil))
		var out struct{ Models []struct{ Model string } }
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, m := range out.Models {
			names = append(names, m.Model)
		}
		var b strings.Builder
		g.plan.writeMetrics(&b)
		for _, m := range []string{"m", "n", "o"} {
			if in := strings.Contains(b.String(), `model="`+m+`"`); in != slices.Contains(names, m) {
				t.Fatalf("model %s in /admin/plan %v, in the metrics %v:\n%s", m, !in, in, b.String())
			}
		}
		return names
	}
	if got := planned(); !slices.Equal(got, []string{"m", "n", "o"}) {
		t.Fatalf("planned %v at start, want [m n o]", got)
	}
	// n leaves; o keeps one pod, too few to split.
	cfg.Models = []config.Model{cfg.Models[0], cfg.Models[2]}
	cfg.Pods = []config.Pod{cfg.Pods[0], cfg.Pods[1], cfg.Pods[4]}
	if err := g.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	g.plan.tick(context.Background(), time.Now().Add(time.Minute))
	if got := planned(); !slices.Equal(got, []string{"m"}) {
		t.Fatalf("planned %v after n left and o kept one pod, want [m]", got)
	}
}

// TestPlanModelMissingARole: a PD model left with pods of one role (its
// prefill pods crashed, say) holds with a reason that says so, and claims
// no split: requests that find no prefill pod fail before they are
// counted, so the planner has no demand to split, and a target of 0
// prefill instances is one no planner would set.
func TestPlanModelMissingARole(t *testing.T) {
	cfg := config.Default()
	cfg.Plan.Enabled = true
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
	cfg.Pods = []config.Pod{
		{Name: "d1", Model: "m", Address: "127.0.0.1:10001", Role: config.RoleDecode, Roleset: "a"},
		{Name: "d2", Model: "m", Address: "127.0.0.1:10002", Role: config.RoleDecode, Roleset: "a"},
		{Name: "d3", Model: "m", Address: "127.0.0.1:10003", Role: config.RoleDecode, Roleset: "a"},
	}
	g := started(t, cfg)
	for i := 1; i <= 2; i++ {
		g.plan.tick(context.Background(), time.Now().Add(time.Duration(i)*time.Minute))
		rec := httptest.NewRecorder()
		g.servePlan(rec, httptest.NewRequest(http.MethodGet, "/admin/plan", nil))
		var out struct {
			Models []struct{ Current, Target, Reason string }
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		if len(out.Models) != 1 {
			t.Fatalf("tick %d: planned %+v, want model m", i, out.Models)
		}
		v := out.Models[0]
		if v.Current != "0P3D" || v.Target != "none" || !strings.Contains(v.Reason, "no prefill pods") {
			t.Fatalf("tick %d: current %s, target %s, reason %q; want 0P3D, none and a reason naming the missing prefill pods", i, v.Current, v.Target, v.Reason)
		}
		var b strings.Builder
		g.plan.writeMetrics(&b)
		if strings.Contains(b.String(), "pdlb_plan_target_instances{") {
			t.Fatalf("tick %d: a target series for a model without a split:\n%s", i, b.String())
		}
	}
}

// started is a gateway New made of cfg, logging nowhere, closed with t.
func started(t *testing.T, cfg config.Config) *Gateway {
	t.Helper()
	g, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

// postN posts body to path through g's handler n times, each answered
// 200.
func postN(t *testing.T, g *Gateway, n int, path, body string) {
	t.Helper()
	for range n {
		ctx := new(fasthttp.RequestCtx)
		ctx.Request.Header.SetMethod(fasthttp.MethodPost)
		ctx.Request.SetRequestURI(path)
		ctx.Request.SetBodyString(body)
		g.Handler(ctx)
		if ctx.Response.StatusCode() != 200 {
			t.Fatalf("%s: %d %s", path, ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
}

// TestPlanCountsResponses: a Responses request is the model's demand as
// a completion is: counted as it arrives and when answered, with its
// prompt's tokens, so the planner's mean prompt length holds.
func TestPlanCountsResponses(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"resp_1","object":"response","status":"completed","output":[],"usage":{"input_tokens":9,"output_tokens":3}}`)
	}))
	t.Cleanup(srv.Close)
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
	cfg.Pods = []config.Pod{{Name: "p0", Model: "m", Address: strings.TrimPrefix(srv.URL, "http://")}}
	g, m := testGateway(t, cfg, upstream.Dialer(nil), nil)
	postN(t, g, 4, "/v1/responses", `{"model":"m","input":"a prompt of some words","store":false}`)
	if c := g.planCounts(m); c.Requests != 4 || c.Finished != 4 || c.PromptTokens <= 0 {
		t.Errorf("after 4 Responses requests the planner counts %+v, want 4 requests, 4 finished and their prompt tokens", c)
	}
}

// TestPlanCountsCompletionsOnly: the planner averages output over the
// finished requests; answers of the other APIs (a /tokenize) have none and
// must not dilute it.
func TestPlanCountsCompletionsOnly(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"count":2,"max_model_len":4096,"tokens":[1,2]}`)
	}))
	t.Cleanup(srv.Close)
	cfg := config.Default()
	cfg.Models = []config.Model{{Name: "m", Policy: "least_request"}}
	cfg.Pods = []config.Pod{{Name: "p0", Model: "m", Address: strings.TrimPrefix(srv.URL, "http://")}}
	g, m := testGateway(t, cfg, upstream.Dialer(nil), nil)
	postN(t, g, 10, "/tokenize", `{"model":"m","prompt":"hi"}`)
	if c := g.planCounts(m); c.Finished != 0 {
		t.Errorf("after 10 /tokenize the planner counts %v finished requests, want 0", c.Finished)
	}
}
