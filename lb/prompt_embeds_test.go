package lb_test

import (
	"testing"

	"pdlb/lb/config"
)

// TestPromptEmbedsCompletion: a completion whose prompt is given as
// prompt_embeds alone is vLLM's to serve (with --enable-prompt-embeds)
// or refuse; the gateway routes it without the index, whose keys the
// embeddings do not give.
func TestPromptEmbedsCompletion(t *testing.T) {
	s := testGateway(t, []config.Pod{{Name: "p", Model: "m", Address: slowPod(t, 0)}}, nil)
	f := func(body string, status int) {
		t.Helper()
		if resp, b := post(t, s, "/v1/completions", body); resp.StatusCode != status {
			t.Errorf("%s: %d %s, want %d", body, resp.StatusCode, b, status)
		}
	}
	f(`{"model":"m","prompt_embeds":"UEsDBAAACAgAAAAAAAAAAAAAAAAAAAAAAAA="}`, 200)
	f(`{"model":"m","prompt_embeds":["UEsDBA==","UEsDBQ=="],"prompt":null}`, 200)
	f(`{"model":"m","prompt":"","prompt_embeds":"UEsDBA=="}`, 200)
	// Neither: the gateway's own 400, as without prompt_embeds.
	f(`{"model":"m","prompt_embeds":null}`, 400)
	f(`{"model":"m","prompt_embeds":[]}`, 400)
}
