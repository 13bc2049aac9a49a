package lb_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestMessagesConversation: Anthropic's Messages API through the gateway
// to vLLM sim pods: a conversation resent whole at each turn, as Claude
// Code sends it (a billing header with a hash of its own in the system
// blocks, the cache_control mark on the newest turn), stays on the pod
// its first turn went to, where its earlier turns are cached; the
// gateway counts the prompt the pod prefilled; a stream's events reach
// the client through message_stop, its first text times the TTFT and its
// usage counts the output.
func TestMessagesConversation(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 4, 1000)...), nil)
	system := strings.Repeat("You are a careful coding agent. ", 40)
	var msgs []string
	var home string
	prompted := 0.0
	for turn := range 8 {
		for i, m := range msgs {
			msgs[i] = strings.Replace(m, `,"cache_control":{"type":"ephemeral"}`, "", 1)
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":"step %d: read file %d","cache_control":{"type":"ephemeral"}}]}`, turn, turn))
		body := fmt.Sprintf(`{"model":"m","max_tokens":4,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1; cch=%05d;"},{"type":"text","text":%q}],"messages":[%s]}`,
			turn*7919, system, strings.Join(msgs, ","))
		resp, b := post(t, s, "/v1/messages", body)
		var a struct {
			Content []struct{ Text string }
			Usage   struct {
				InputTokens int `json:"input_tokens"`
			}
		}
		if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &a) != nil || len(a.Content) != 1 {
			t.Fatalf("turn %d: %d %s", turn, resp.StatusCode, b)
		}
		if pod := resp.Header.Get("x-pdlb-pod"); home == "" {
			home = pod
		} else if pod != home {
			t.Errorf("turn %d went to %s, the conversation's pod is %s", turn, pod, home)
		}
		prompted += float64(a.Usage.InputTokens)
		if n := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`); n != prompted {
			t.Errorf("turn %d: the gateway counted %v prompt tokens, the pod prefilled %v", turn, n, prompted)
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":[{"type":"text","text":%q}]}`, a.Content[0].Text))
	}
	before := metricValue(t, s, `pdlb_completion_tokens_total{model="m"}`)
	resp, b := post(t, s, "/v1/messages", `{"model":"m","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || !strings.HasPrefix(b, "event: message_start\n") || !strings.HasSuffix(b, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	if n := metricValue(t, s, `pdlb_completion_tokens_total{model="m"}`) - before; n != 4 {
		t.Errorf("the stream's output counted %v tokens, want 4", n)
	}
	if n := metricValue(t, s, `pdlb_time_to_first_token_seconds_count{model="m"}`); n != 1 {
		t.Errorf("%v first tokens timed, want the stream's", n)
	}
}
