package lb_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"pdlb/engines/sim"
	"pdlb/lb"
	"pdlb/lb/config"
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
