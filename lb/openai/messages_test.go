package openai

import (
	"strings"
	"testing"

	"pdlb/engines"
)

// TestParseMessagesPrompt: a Messages request renders the stand-in prompt
// of the chat vLLM makes of it: the system field and system-role
// messages joined as one system turn, Claude Code's billing header
// dropped, text blocks as a chat's text parts; a message with other
// blocks renders as its blocks' JSON, unchanged when a cache_control mark
// moves off it; what the engine refuses renders nothing.
func TestParseMessagesPrompt(t *testing.T) {
	r, c := NewRequest(), NewRequest()
	same := func(messages, chat string) {
		t.Helper()
		sameAsChat(t, r, c, KindMessages, messages, chat)
	}
	same(`{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"Hi"}]}`, `{"messages":[{"role":"user","content":"Hi"}]}`)
	same(`{"system":"Be brief.","messages":[{"role":"user","content":"H\u0069"}]}`, `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`)
	same(`{"system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"You are"},{"type":"text","text":"","cache_control":{"type":"ephemeral"}},{"type":"text","text":" Claude."}],
		"messages":[{"role":"system","content":[{"type":"text","text":" More."}]},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b","cache_control":{"type":"ephemeral"}}]},
		{"role":"assistant","content":[{"type":"text","text":"c"}]}]}`,
		`{"messages":[{"role":"system","content":"You are Claude. More."},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":"c"}]}`)
	if r.MaxTokens != -1 {
		t.Errorf("max_tokens %d, want none", r.MaxTokens)
	}
	if err := r.Parse(KindMessages, []byte(`{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"Hi"}]}`)); err != nil || r.MaxTokens != 9 || !r.Stream || string(r.Model) != "m" {
		t.Errorf("max_tokens %d, stream %v, model %q (%v)", r.MaxTokens, r.Stream, r.Model, err)
	}
	// A tool call and its result key alike at every turn that resends
	// them, whichever carries the cache_control mark.
	turn := func(mark string) string {
		return `{"max_tokens":9,"messages":[{"role":"user","content":"q"},
			{"role":"assistant","content":[{"type":"text","text":"let me see"},{"type":"tool_use","id":"t1","name":"ls","input":{"path":"."}` + mark + `}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"a.go"` + mark + `}]}]}]}`
	}
	if err := r.Parse(KindMessages, []byte(turn(`,"cache_control":{"type":"ephemeral"}`))); err != nil {
		t.Fatal(err)
	}
	marked := string(r.Prompt)
	if err := r.Parse(KindMessages, []byte(turn(""))); err != nil {
		t.Fatal(err)
	}
	if marked != string(r.Prompt) || strings.Contains(marked, "cache_control") || !strings.Contains(marked, `"tool_use_id":"t1"`) {
		t.Errorf("with marks %q\nwithout %q", marked, r.Prompt)
	}
	// Newer Claude Code's ctx and msg roles are the user's, as vLLM reads
	// them; a user message without text is left out, an assistant's kept.
	same(`{"messages":[{"role":"ctx","content":"a"},{"role":"user","content":[{"type":"text","text":""}]},{"role":"msg","content":[{"type":"text","text":"b"}]},{"role":"assistant","content":[]}]}`,
		`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"assistant"}]}`)
	// Images, a tool result's screenshot too, are the request's media,
	// not prompt text; keys render alike whatever the space around them.
	img := `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + strings.Repeat("QUJD", 1000) + `"}}`
	if err := r.Parse(KindMessages, []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"see"},`+img+`,{"type":"tool_result","tool_use_id":"t","content":[`+img+`,{"type":"text","text":"ok"}]}]}]}`)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(r.Prompt), "QUJD") || r.MediaBytes < 8000 || !r.Unindexed() || !strings.Contains(string(r.Prompt), `"content":[{"type":"text","text":"ok"}]`) {
		t.Errorf("images: prompt %q, %d media bytes, unindexed %v", r.Prompt, r.MediaBytes, r.Unindexed())
	}
	// An image's bytes are stepped over, never copied into the prompt.
	var fresh Request
	big := `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + strings.Repeat("QUJD", 1<<18) + `"}}`
	if err := fresh.Parse(KindMessages, []byte(`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[`+big+`]}]}]}`)); err != nil || cap(fresh.Prompt) > 4096 {
		t.Errorf("a 1 MiB image grew the prompt buffer to %d bytes (%v)", cap(fresh.Prompt), err)
	}
	spaced := string(r.Prompt)
	if err := r.Parse(KindMessages, []byte(`{"messages":[{"role":"user","content":[{"type" : "text","text":"see"} , `+img+`,{ "type":"tool_result" ,"tool_use_id" :"t","content":[`+img+`,{"type":"text","text":"ok"}]}]}]}`)); err != nil || string(r.Prompt) != spaced {
		t.Errorf("spaced keys rendered %q, want %q (%v)", r.Prompt, spaced, err)
	}
	for _, refused := range []string{`{"model":"m"}`, `{"messages":[]}`, `{"messages":"hi"}`, `{"messages":[{"content":"no role"}]}`,
		`{"messages":[{"role":"tool","content":"x"}]}`, `{"messages":[3]}`, `{"messages":[{"role":"user","content":5}]}`, `{"system":5,"messages":[{"role":"user","content":"x"}]}`} {
		if err := r.Parse(KindMessages, []byte(refused)); err != nil || len(r.Prompt) != 0 {
			t.Errorf("%s: %v, prompt %q, want none", refused, err, r.Prompt)
		}
	}
}

// TestMessagesCacheSalt: a Messages request's cache_salt seeds its keys
// as a chat's does (newer vLLM releases salt the chat they make of it),
// and vLLM's 400 for a salt it refuses is the gateway's.
func TestMessagesCacheSalt(t *testing.T) {
	r := NewRequest()
	seed := func(kind Kind, body string) uint64 {
		t.Helper()
		if err := r.Parse(kind, []byte(body)); err != nil {
			t.Fatal(err)
		}
		return r.KeySeed(1)
	}
	plain := seed(KindMessages, `{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"Hi"}]}`)
	salted := seed(KindMessages, `{"model":"m","max_tokens":9,"cache_salt":"tenant-a","messages":[{"role":"user","content":"Hi"}]}`)
	chat := seed(KindChat, `{"model":"m","cache_salt":"tenant-a","messages":[{"role":"user","content":"Hi"}]}`)
	if plain == salted || salted != chat {
		t.Errorf("seeds: plain %x, salted %x, the salted chat's %x", plain, salted, chat)
	}
	if err := r.Parse(KindMessages, []byte(`{"model":"m","max_tokens":9,"cache_salt":"","messages":[]}`)); err != nil {
		t.Fatal(err)
	}
	r.Engine = engines.VLLM
	if e := r.EngineRefusal(); e == nil || e.Status != 400 || e.Param != "cache_salt" {
		t.Errorf("an empty salt: %+v", e)
	}
}
