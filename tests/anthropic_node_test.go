package tests

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"pdlb/engines"
	"pdlb/lb/config"
	"pdlb/lb/limits"
)

// TestAnthropicNodeClient runs tests/anthropic-node/test.mjs, the official
// @anthropic-ai/sdk client against a live gateway with API keys, as
// Claude Code reaches it with ANTHROPIC_BASE_URL: a tool loop whole and
// streamed, count_tokens, and the gateway's and the engine's errors
// surfacing as the client's error classes, typed as Anthropic types them,
// and a rate-limited key's standing in Anthropic's headers.
func TestAnthropicNodeClient(t *testing.T) {
	const dir = "anthropic-node"
	node := lookTool(t, "node", "the official Anthropic client test needs Node.js")
	npm := lookTool(t, "npm", "the official Anthropic client test installs its package with npm")
	installClient(t, npm, dir, "@anthropic-ai/sdk")
	pods := []config.Pod{
		podConfig(startPod(t, "m-0", "m", engines.VLLM, 100)),
		podConfig(startPod(t, "m-1", "m", engines.VLLM, 100)),
		{Name: "down-0", Model: "down", Address: closedAddr(t)},
	}
	s := startGateway(t, pods, func(c *config.Config) {
		c.Access.APIKeys = []limits.APIKey{
			{Name: "claude-code", SHA256: limits.HashKey("sk-good")},
			// Whose rate-limit headers the client reads.
			{Name: "rated", SHA256: limits.HashKey("sk-rated"), RequestsPerMinute: 2, TokensPerMinute: 2000},
		}
	})
	base := "http://" + s.Addr()
	waitStatus(t, client, base+"/v1/messages", "sk-good", `{"model":"down","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, 503)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PDLB_ANTHROPIC_URL="+base, "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	t.Logf("node test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("node test.mjs: %v", err)
	}
	if !strings.Contains(string(out), "# fail 0") {
		t.Fatal("node test.mjs reported failures")
	}
}
