package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestMessagesGolden converts the Anthropic requests of
// testdata/messages_golden.json (made by messages_golden.py, which
// restates vLLM's conversion in Python and renders with Python's Jinja2)
// and renders them, each with the placement of system-role messages it
// names: the prompt vLLM renders, byte for byte, or exact false where
// vLLM's releases convert otherwise.
func TestMessagesGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/messages_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Model   string          `json:"model"`
		Name    string          `json:"name"`
		Request json.RawMessage `json:"request"`
		Inline  string          `json:"inline"`
		Exact   bool            `json:"exact"`
		Want    *string         `json:"want"`
		Error   string          `json:"error"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	template := templates(t)
	for _, gc := range cases {
		t.Run(gc.Model+"/"+gc.Name+"/"+gc.Inline, func(t *testing.T) {
			inline, ok := ParseInlineSystem(gc.Inline)
			if !ok {
				t.Fatalf("inline %q", gc.Inline)
			}
			converted, exact, err := AppendMessages(nil, gc.Request, inline)
			if err != nil || exact != gc.Exact {
				t.Fatalf("AppendMessages: exact %v, error %v; want exact %v\n%s", exact, err, gc.Exact, converted)
			}
			c := AcquireConversation()
			defer ReleaseConversation(c)
			if err := c.ParseRequest(converted); err != nil {
				t.Fatalf("ParseRequest: %v\n%s", err, converted)
			}
			if !gc.Exact {
				return // the simulator's conversion: parsed as a chat, not compared
			}
			got, err := template(t, gc.Model, "").Render(nil, c, nil)
			if gc.Want == nil {
				if err == nil || !strings.Contains(err.Error(), gc.Error) {
					t.Fatalf("Render error %v, want %q", err, gc.Error)
				}
				return
			}
			if err != nil {
				t.Fatalf("Render: %v\n%s", err, converted)
			}
			if string(got) != *gc.Want {
				t.Errorf("Render:\n got %q\nwant %q\nchat %s", got, *gc.Want, converted)
			}
		})
	}
}

// TestMessagesRefused: what vLLM's Messages request model refuses is a
// *RequestError naming the field.
func TestMessagesRefused(t *testing.T) {
	for _, c := range []struct{ body, param string }{
		{`[]`, "body"},
		{`{"messages":[{"role":"user","content":"a"}]`, "body"},
		{`{"model":"m"}`, "messages"},
		{`{"messages":{}}`, "messages"},
		{`{"messages":[{"content":"a"}]}`, "messages[0].role"},
		{`{"messages":[{"role":"tool","content":"a"}]}`, "messages[0].role"},
		{`{"messages":[{"role":"user"}]}`, "messages[0].content"},
		{`{"messages":[{"role":"user","content":1}]}`, "messages[0].content"},
		{`{"messages":[{"role":"user","content":[{"text":"a"}]}]}`, "messages[0].content[0].type"},
		{`{"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, "messages[0].content[0].type"},
		{`{"messages":[{"role":"user","content":["a"]}]}`, "messages[0].content[0]"},
		{`{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, "messages[0].content[0].text"},
		{`{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"x","input":[]}]}]}`, "messages[0].content[0].input"},
		{`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":["a"]}]}]}`, "messages[0].content[0].content[0]"},
		{`{"system":1,"messages":[]}`, "system"},
		{`{"system":[{"type":"nope"}],"messages":[]}`, "system[0].type"},
		{`{"messages":[],"tools":[{"input_schema":{}}]}`, "tools[0].name"},
		{`{"messages":[],"tools":[{"name":"x"}]}`, "tools[0].input_schema"},
		{`{"messages":[],"tools":[{"name":"x","input_schema":{},"defer_loading":"maybe"}]}`, "tools[0].defer_loading"},
		{`{"messages":[],"output_config":{"effort":"none"}}`, "output_config.effort"},
		{`{"messages":[],"chat_template_kwargs":[]}`, "chat_template_kwargs"},
		// The first error in the order vLLM's model declares its fields:
		// messages, output_config, system, tools.
		{`{"messages":[{"role":"tool","content":"x"}],"system":5}`, "messages[0].role"},
		{`{"system":5}`, "messages"},
		{`{"tools":5,"system":5,"messages":[],"output_config":{"effort":"none"}}`, "output_config.effort"},
		{`{"tools":5,"system":5,"messages":[]}`, "system"},
	} {
		_, _, err := AppendMessages(nil, []byte(c.body), InlineUnknown)
		var re *RequestError
		if !errors.As(err, &re) || re.Param != c.param {
			t.Errorf("%s: %v, want a *RequestError for %s", c.body, err, c.param)
		}
	}
}

// TestMessagesConversion: the chat request made, as ParseRequest reads it
// and as it is written (arguments as a string, the schema typed, the
// sim's conversion of an inline system message and an image).
func TestMessagesConversion(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"messages":[{"role":"user","content":"a\"b"}],"max_tokens":3}`,
			`{"messages":[{"role":"user","content":"a\"b"}]}`},
		{`{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a": [1, "\u00e9\n"]}}]}]}`,
			`{"messages":[{"role":"assistant","tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":"{\"a\": [1, \"\\u00e9\\n\"]}"}}]}]}`},
		{`{"messages":[],"tools":[{"name":"f","input_schema":{ }},{"name":"g","input_schema":{"p":{} }}]}`,
			`{"messages":[],"tools":[{"type":"function","function":{"name":"f","description":null,"parameters":{"type":"object"}}},` +
				`{"type":"function","function":{"name":"g","description":null,"parameters":{"p":{},"type":"object"}}}]}`},
		{`{"system":"S","messages":[{"role":"system","content":"L"},{"role":"user","content":"a"},{"role":"system","content":[{"type":"text","text":"N"}]}]}`,
			`{"messages":[{"role":"system","content":"S\n\nL"},{"role":"user","content":"a"},{"role":"system","content":"N"}]}`},
		{`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"https://x/y.png"}},{"type":"text","text":"?"}]}]}`,
			`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"text","text":"?"}]}]}`},
		// Content before role, and a repeated role, whose last value wins.
		{`{"messages":[{"content":[{"type":"text","text":"a"}],"role":"msg"}]}`,
			`{"messages":[{"role":"user","content":"a"}]}`},
		{`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"}],"role":"assistant"}]}`,
			`{"messages":[{"role":"assistant","content":"Tool result: r"}]}`},
		{`{"messages":[{"role":"user","content":"a"}],"output_config":{"effort":"max"},"thinking":{"type":"disabled"},"chat_template_kwargs":{"k":1}}`,
			`{"messages":[{"role":"user","content":"a"}],"reasoning_effort":"none","chat_template_kwargs":{"k":1}}`},
	} {
		got, _, err := AppendMessages(nil, []byte(c.body), InlineUnknown)
		if err != nil || string(got) != c.want {
			t.Errorf("%s:\n got %s %v\nwant %s", c.body, got, err, c.want)
		}
	}
}

// BenchmarkAppendMessages: the conversion alone, of the golden's
// Claude-Code-shaped tool loop.
func BenchmarkAppendMessages(b *testing.B) {
	raw, err := os.ReadFile("testdata/messages_golden.json")
	if err != nil {
		b.Fatal(err)
	}
	var cases []struct {
		Name    string          `json:"name"`
		Request json.RawMessage `json:"request"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		b.Fatal(err)
	}
	var body bytes.Buffer // compact, as clients send it
	for _, c := range cases {
		if c.Name == "claude-code-tool-loop" {
			if err := json.Compact(&body, c.Request); err != nil {
				b.Fatal(err)
			}
			break
		}
	}
	var out []byte
	b.SetBytes(int64(body.Len()))
	b.ReportAllocs()
	for b.Loop() {
		if out, _, err = AppendMessages(out[:0], body.Bytes(), InlineUnknown); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzAppendMessages: any body converts without a panic, and what a
// body that is JSON converts to is a JSON chat request.
func FuzzAppendMessages(f *testing.F) {
	raw, err := os.ReadFile("testdata/messages_golden.json")
	if err != nil {
		f.Fatal(err)
	}
	var cases []struct {
		Request json.RawMessage `json:"request"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		f.Fatal(err)
	}
	for _, c := range cases {
		f.Add([]byte(c.Request))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, _, err := AppendMessages(nil, body, InlineUnknown)
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("%q: %T %v", body, err, err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("%q converts to %q, no JSON", body, out)
		}
	})
}

// TestMessagesRepeatedKeys: a repeated key's last value is the one vLLM
// reads (json.loads keeps it): an earlier invalid value is no error, an
// earlier inexact one leaves the conversion exact, and an earlier role's
// conversion is undone.
func TestMessagesRepeatedKeys(t *testing.T) {
	for _, c := range []struct {
		body, want string
		exact      bool
	}{
		{`{"system":5,"system":"ok","messages":[{"role":"user","content":"x"}]}`,
			`{"messages":[{"role":"system","content":"ok"},{"role":"user","content":"x"}]}`, true},
		{`{"messages":[{"role":"user","content":[{"type":"text","text":1}],"content":"ok"}]}`,
			`{"messages":[{"role":"user","content":"ok"}]}`, true},
		{`{"tools":[{"name":"f"}],"tools":null,"messages":[{"role":"user","content":"x"}]}`,
			`{"messages":[{"role":"user","content":"x"}]}`, true},
		{`{"messages":[{"role":"system","content":"s"}],"messages":[{"role":"user","content":"x"}]}`,
			`{"messages":[{"role":"user","content":"x"}]}`, true},
		{`{"tools":[],"tools":[{"name":"f","input_schema":{}}],"messages":[]}`,
			`{"messages":[],"tools":[{"type":"function","function":{"name":"f","description":null,"parameters":{"type":"object"}}}]}`, true},
		{`{"messages":[{"role":"user","content":"a"},{"role":"user","content":"x","role":"system"}]}`,
			`{"messages":[{"role":"user","content":"a"},{"role":"system","content":"x"}]}`, false},
		{`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}}],"content":"ok"}]}`,
			`{"messages":[{"role":"user","content":"ok"}]}`, true},
		{`{"messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r"}]}],"role":"user"}]}`,
			`{"messages":[{"role":"tool","tool_call_id":"t","content":"r"}]}`, true},
	} {
		got, exact, err := AppendMessages(nil, []byte(c.body), InlineUnknown)
		if err != nil || string(got) != c.want || exact != c.exact {
			t.Errorf("%s:\n got %s exact %v %v\nwant %s exact %v", c.body, got, exact, err, c.want, c.exact)
		}
	}
}

// TestMessagesSplitSurrogates: text blocks vLLM joins with nothing
// between stay two lone surrogates in Python where the escapes of a pair
// meet; read here they would be one character, so the request is not
// exact. A pair within one block, or blocks joined by a separator, are.
func TestMessagesSplitSurrogates(t *testing.T) {
	for _, c := range []struct {
		body  string
		exact bool
	}{
		{`{"system":[{"type":"text","text":"a\ud83d"},{"type":"text","text":"\ude42b"}],"messages":[]}`, false},
		{`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"a\uD83D"},{"type":"thinking","thinking":"\uDE42"}]}]}`, false},
		{`{"system":[{"type":"text","text":"a\\ud83d"},{"type":"text","text":"\ude42b"}],"messages":[]}`, true},
		{`{"system":[{"type":"text","text":"a\ud83d\ude42"},{"type":"text","text":"b"}],"messages":[]}`, true},
		{`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"\ud83d"},{"type":"text","text":"\ude42"}]}]}]}`, true},
	} {
		if _, exact, err := AppendMessages(nil, []byte(c.body), InlineUnknown); err != nil || exact != c.exact {
			t.Errorf("%s: exact %v %v, want %v", c.body, exact, err, c.exact)
		}
	}
}

// TestCountTokensRequest: a count_tokens request has no output_config or
// thinking in vLLM's model: they are neither refused nor converted.
func TestCountTokensRequest(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"a"}],"output_config":{"effort":"bad"},"thinking":{"type":"disabled"}}`)
	got, exact, err := AppendCountTokens(nil, body, InlineUnknown)
	if want := `{"messages":[{"role":"user","content":"a"}]}`; err != nil || !exact || string(got) != want {
		t.Errorf("count_tokens: %s exact %v %v, want %s", got, exact, err, want)
	}
	if _, _, err := AppendMessages(nil, body, InlineUnknown); err == nil {
		t.Error("messages: the bad effort was not refused")
	}
}
