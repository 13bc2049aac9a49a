package chat

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestParseRequestRefusals: bodies vLLM answers with a 400 before
// rendering, the field each error names, and its message.
func TestParseRequestRefusals(t *testing.T) {
	c := AcquireConversation()
	defer ReleaseConversation(c)
	f := func(body, param, msg string) {
		t.Helper()
		err := c.ParseRequest([]byte(body))
		var re *RequestError
		if !errors.As(err, &re) {
			t.Fatalf("%s: error %v, want a *RequestError", body, err)
		}
		if re.Param != param || !strings.Contains(re.Message, msg) {
			t.Errorf("%s:\n got %q %q\nwant %q containing %q", body, re.Param, re.Message, param, msg)
		}
		var parsed struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Param   string `json:"param"`
				Code    int    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(re.AppendBody(nil), &parsed); err != nil {
			t.Fatalf("AppendBody: %v", err)
		}
		if parsed.Error.Code != 400 || parsed.Error.Type != "BadRequestError" || parsed.Error.Message != re.Message || parsed.Error.Param != param {
			t.Errorf("%s: body %+v", body, parsed.Error)
		}
	}
	f(`[]`, "body", "valid dictionary")
	f(`{"messages":[{"role":"user","content":"hi"}]`, "body", "JSON decode error")
	f(`{"messages":[{"role":"user","content":"hi"}]} x`, "body", "JSON decode error")
	f(`{"model":"m"}`, "messages", "messages: Field required")
	f(`{"messages":[{"role":"robot","content":"hi"}],"x":tru}`, "body", "JSON decode error")
	f(`{"messages":{}}`, "messages", "valid list")
	f(`{"messages":[]}`, "messages", "at least 1 item")
	f(`{"messages":["hi"]}`, "messages[0]", "valid dictionary")
	f(`{"messages":[{"content":"hi"}]}`, "messages[0].role", "Field required")
	f(`{"messages":[{"role":7,"content":"hi"}]}`, "messages[0].role", "valid string")
	f(`{"messages":[{"role":"user","content":null}]}`, "messages[0].content", "valid string or a list")
	f(`{"messages":[{"role":"robot","content":null}]}`, "messages[0].content", "valid string or a list")
	f(`{"messages":[{"role":"user","content":5}]}`, "messages[0].content", "valid string or a list")
	f(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"bogus"}]}]}`, "messages[0].content[1].type",
		"Unsupported chat content part type: 'bogus'. Supported types: audio_embeds, audio_url, image_embeds, image_pil, image_url, input_audio, input_image, input_text, output_text, prompt_embeds, refusal, text, thinking, tool_reference, video_url.")
	f(`{"messages":[{"role":"user","content":[{"text":"a"}]}]}`, "messages[0].content[0].type", "Missing 'type' field in multimodal part.")
	f(`{"messages":[{"role":"user","content":[{"type":3,"text":"a"}]}]}`, "messages[0].content[0].type", "Invalid 'type' field in multimodal part.")
	f(`{"messages":[{"role":"user","content":[{"type":"text","text":3}]}]}`, "messages[0].content[0].text", "valid string")
	f(`{"messages":[{"role":"user","content":[7]}]}`, "messages[0].content[0]", "valid dictionary")
	f(`{"messages":[{"role":"assistant","tool_calls":[{"id":"x","type":"function"}]}]}`, "messages[0].tool_calls[0].function", "Field required")
	f(`{"messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}]}`, "messages[0].tool_calls[0].id", "Field required")
	f(`{"messages":[{"role":"assistant","tool_calls":[{"id":"x","type":"custom","function":{"name":"f","arguments":"{}"}}]}]}`, "messages[0].tool_calls[0].type", "'function'")
	f(`{"messages":[{"role":"assistant","tool_calls":[{"id":"x","type":"function","function":{"arguments":"{}"}}]}]}`, "messages[0].tool_calls[0].function.name", "Field required")
	f(`{"messages":[{"role":"assistant","tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":{}}}]}]}`, "messages[0].tool_calls[0].function.arguments", "valid string")
	f(`{"messages":[{"role":"assistant","tool_calls":{}}]}`, "messages[0].tool_calls", "valid list")
	f(`{"messages":[{"role":"user","content":"a"}],"tools":[]}`, "tools", "`tools` must not be an empty array.")
	f(`{"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function"}]}`, "tools[0].function", "Field required")
	f(`{"messages":[{"role":"user","content":"a"}],"tools":[{"function":{"description":"d"}}]}`, "tools[0].function.name", "Field required")
	f(`{"messages":[{"role":"user","content":"a"}],"tools":[{"type":"custom","function":{"name":"n"}}]}`, "tools[0].type", "'function'")
	f(`{"messages":[{"role":"user","content":"a"}],"tools":{}}`, "tools", "valid list")
	f("{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", "body", "JSON decode error")
	f(`{"messages":[{"role":"user","content":"a"}],"chat_template_kwargs":[1]}`, "chat_template_kwargs", "valid dictionary")
	f(`{"messages":[{"role":"user","content":"a"}],"reasoning_effort":"extreme"}`, "reasoning_effort", "Input should be 'none'")
	f(`{"messages":[{"role":"user","content":"a"}],"chat_template":1}`, "chat_template", "valid string")
	f(`{"messages":[{"role":"user","content":"a"}],"add_generation_prompt":"maybe"}`, "add_generation_prompt", "valid boolean")
	f(`{"messages":[{"role":"user","content":"a"}],"add_generation_prompt":2}`, "add_generation_prompt", "valid boolean")
	f(`{"messages":[{"role":"user","content":"a"}],"add_generation_prompt":[true]}`, "add_generation_prompt", "valid boolean")
	f(`{"messages":[{"role":"user","content":"a"}],"continue_final_message":true,"add_generation_prompt":true}`, "continue_final_message",
		"Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	f(`{"messages":[{"role":"user","content":"a"}],"continue_final_message":true}`, "continue_final_message",
		"continue_final_message and add_generation_prompt are not compatible.")
}

// TestParseRequestAccepts: what ParseRequest keeps of bodies vLLM accepts.
func TestParseRequestAccepts(t *testing.T) {
	c := AcquireConversation()
	defer ReleaseConversation(c)
	f := func(body string, want string) {
		t.Helper()
		if err := c.ParseRequest([]byte(body)); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		var b strings.Builder
		for i := range c.msgs {
			m := &c.msgs[i]
			b.WriteString(c.roleName(m))
			switch m.contentKind {
			case contentString:
				b.WriteString("=" + c.str(m.content))
			case contentParts:
				for _, p := range c.parts[m.partLo:m.partHi] {
					switch {
					case p.media:
						b.WriteString("[media]")
					case p.hasText:
						b.WriteString("[" + c.str(p.text) + "]")
					default:
						b.WriteString("[]")
					}
				}
			}
			if !m.toolCalls.empty() {
				b.WriteString(" calls")
			}
			if m.hasReason {
				b.WriteString(" reason=" + c.str(m.reasoning))
			}
			b.WriteString(";")
		}
		if !c.addGenerationPrompt {
			b.WriteString(" nogen")
		}
		if c.continueFinalMessage {
			b.WriteString(" continue")
		}
		if c.hasTools {
			b.WriteString(" tools")
		}
		if c.hasKwargs {
			b.WriteString(" kwargs=" + c.str(c.kwargs))
		}
		if got := b.String(); got != want {
			t.Errorf("%s:\n got %s\nwant %s", body, got, want)
		}
	}
	f(`{"model":"m","messages":[{"role":"user","content":"a\"b\\c\u00e9\ud83d\ude42\n"}],"stream":true}`, "user=a\"b\\cé🙂\n;")
	f(` { "messages" : [ { "content" : "x" , "role" : "system" } ] } `, "system=x;")
	f(`{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b","content":"c"}]}`, "user=c;")
	f(`{"messages":[{"role":"user","content":[{"text":"t","type":"text"},"s",{"type":"refusal","refusal":"r"},{"type":"thinking","thinking":"th"},{"type":"text","text":null},{"type":"image_url","image_url":{"url":"u"}}]}]}`,
		"user[t][s][r][th][][media];")
	f(`{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[]},{"role":"assistant","reasoning_content":"r","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`,
		"user=q;assistant;assistant calls reason=r;")
	f(`{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"add_generation_prompt":false,"continue_final_message":true,"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false}}`,
		"user=a;assistant=b; nogen continue tools kwargs={\"enable_thinking\":false}")
	// vLLM's custom message type: any role, content and tool_call_id
	// optional.
	f(`{"messages":[{"role":"robot","content":"hi"},{"role":"user"},{"role":"tool","content":"r"}]}`, "robot=hi;user;tool=r;")
	f(`{"messages":[{"role":"user","content":"a"}],"add_generation_prompt":"No","continue_final_message":1}`, "user=a; nogen continue")
	// Any number equal to 0 or 1 is a bool to pydantic's lax mode.
	f(`{"messages":[{"role":"user","content":"a"}],"add_generation_prompt":-0.0,"continue_final_message":1e0}`, "user=a; nogen continue")
	f(`{"messages":[{"role":"user","content":"a"}],"add_generation_prompt":0.00,"continue_final_message":10E-1}`, "user=a; nogen continue")
	f(`{"messages":[{"role":"developer","content":"d"},{"role":"function","name":"f","content":null},{"role":"tool","tool_call_id":"1","content":"r"}],"add_generation_prompt":null}`,
		"developer=d;function;tool=r;")
}

// TestCompileRefusal: a template the engine cannot parse is refused at
// load with a *CompileError that says so.
func TestCompileRefusal(t *testing.T) {
	f := func(src string) {
		t.Helper()
		_, err := Compile(src, nil)
		var ce *CompileError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "cannot render this chat template") {
			t.Errorf("Compile(%q) = %v, want a *CompileError", src, err)
		}
	}
	f(`{% for m in messages %}{{ m.content }}`)
	f(`{{ messages[0].content `)
	f(`{{ x | }}`)
	f(`{% endfor %}`)
	f(`{% frobnicate %}`)
	// Parsed, but the engine lacks the filter or test: refused at load,
	// even in a branch plain chats never take.
	f(`{% if tools %}{{ tools | pprint }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}`)
	f(`{% for m in messages %}{% if loop.index is divisibleby(2) %}{{ m.content }}{% endif %}{% endfor %}`)
	if _, err := Compile(`{{ '<|im_start|>' | trim }}{% if x is not none and 'a is b' %}{% endif %}`, nil); err != nil {
		t.Errorf("literals taken for filters or tests: %v", err)
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\":1.5}"}}]},{"role":"tool","tool_call_id":"1","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":true}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":"\ud83d\ude42\u0000"}],"continue_final_message":true,"add_generation_prompt":false,"reasoning_effort":"none"}`))
	f.Add([]byte(`{"messages":[{"role":"assistant","content":"x"}],"chat_template":"{{ messages[0].content }}"}`))
	tmpl, err := Compile(`{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}`, nil)
	if err != nil {
		f.Fatal(err)
	}
	tmpl.TrustRequestTemplate = true
	f.Fuzz(func(t *testing.T, body []byte) {
		c := AcquireConversation()
		defer ReleaseConversation(c)
		err := c.ParseRequest(body)
		var re *RequestError
		if err != nil && !errors.As(err, &re) {
			t.Fatalf("error %T %v, want a *RequestError", err, err)
		}
		if err == nil && !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if err != nil {
			return
		}
		fast, ferr := tmpl.Render(nil, c, nil)
		eff, err := tmpl.effective(c)
		if err != nil {
			if ferr == nil {
				t.Fatalf("Render passed a chat_template that does not compile: %v", err)
			}
			return
		}
		slow, serr := eff.renderJinja(c, nil)
		if (ferr == nil) != (serr == nil) || ferr == nil && string(fast) != slow {
			t.Fatalf("fast %q %v, Jinja %q %v", fast, ferr, slow, serr)
		}
	})
}

// TestInexact: JSON the template dumps is written as Python writes it
// (tojson is rewritten, tojson.go); what the engine still cannot match
// (an int beyond int64, media parts, a tojson after another filter with a
// float or an indent) is refused with ErrInexact instead of rendered wrong.
func TestInexact(t *testing.T) {
	compile := func(src string) *Template {
		t.Helper()
		tmpl, err := Compile(src, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tmpl
	}
	plain := compile(`{% for m in messages %}{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}`)
	indented := compile(`{% for t in tools %}{{ t | tojson(indent=4) }}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}`)
	calls := compile(`{% for m in messages %}{{ m.tool_calls | tojson }}{% endfor %}`)
	chained := compile(`{{ tools | list | tojson }}`)
	chainedIndent := compile(`{{ tools | list | tojson(indent=2) }}`)
	c := AcquireConversation()
	defer ReleaseConversation(c)
	f := func(tmpl *Template, body, want string, wantErr error) {
		t.Helper()
		if err := c.ParseRequest([]byte(body)); err != nil {
			t.Fatal(err)
		}
		got, err := tmpl.Render(nil, c, nil)
		if !errors.Is(err, wantErr) || err == nil && string(got) != want {
			t.Errorf("%s: got %q %v, want %q %v", body, got, err, want, wantErr)
		}
	}
	tool := func(params string) string {
		return `{"messages":[{"role":"user","content":"q"}],"tools":[{"type":"function","function":{"name":"f","parameters":` + params + `}}]}`
	}
	dumped := func(params string) string {
		return `[{"type": "function", "function": {"name": "f", "description": null, "parameters": ` + params + `}}]`
	}
	f(plain, tool(`{"b":1,"a":0.5,"c":1e-7}`), "q"+dumped(`{"b": 1, "a": 0.5, "c": 1e-07}`), nil)
	f(plain, tool(`{"e":1e16,"s":1.5e300,"m":-273.15}`), "q"+dumped(`{"e": 1e+16, "s": 1.5e+300, "m": -273.15}`), nil)
	// The engine prints 1.0 as "1" outside tojson: refused wherever it is.
	f(plain, tool(`{"default":1.0}`), "", ErrInexact)
	f(plain, tool(`{"max":1e6}`), "", ErrInexact)
	f(plain, tool(`{"z":-0.0}`), "", ErrInexact)
	f(plain, tool(`{"d":"a\u2028b\u0001é"}`), "q"+dumped(`{"d": "a`+"\u2028"+`b\u0001é"}`), nil)
	f(plain, tool(`{"n":123456789012345678901}`), "", ErrInexact)
	f(plain, `{"messages":[{"role":"assistant","content":"x","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"t\": 2.5, \"z\": [1]}"}}]}]}`, `x{"t": 2.5, "z": [1]}`, nil)
	f(plain, `{"messages":[{"role":"assistant","content":"x","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"t\": 2.0}"}}]}]}`, "", ErrInexact)
	f(plain, `{"messages":[{"role":"assistant","content":"x","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"not json"}}]}]}`, `x{}`, nil)
	f(plain, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`, "", ErrInexact)
	f(indented, tool(`{"a":[1,{}]}`), "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"f\",\n        \"description\": null,\n        \"parameters\": {\n            \"a\": [\n                1,\n                {}\n            ]\n        }\n    }\n}q", nil)
	f(calls, `{"messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","x":1,"arguments":"{\"b\": 1, \"a\": [true, null]}"},"id":"c1","index":0}]}]}`,
		`[{"id": "c1", "function": {"arguments": {"b": 1, "a": [true, null]}, "name": "f"}, "type": "function"}]`, nil)
	f(chained, tool(`{"a":0.5}`), dumped(`{"a": 0.5}`), nil)
	f(chained, tool(`{"a":"a\u2028b"}`), "", ErrInexact)
	f(chainedIndent, tool(`{}`), "", ErrInexact)
}

// TestRequestTemplateTrust: a request's own chat_template (or one in its
// chat_template_kwargs) gets vLLM's 400 unless the server trusts request
// templates; trusted, it renders instead of the model's.
func TestRequestTemplateTrust(t *testing.T) {
	tmpl, err := Compile(`{% for m in messages %}{{ m.content }}{% endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := AcquireConversation()
	defer ReleaseConversation(c)
	f := func(trust bool, body, want string) {
		t.Helper()
		if err := c.ParseRequest([]byte(body)); err != nil {
			t.Fatal(err)
		}
		tmpl.TrustRequestTemplate = trust
		got, err := tmpl.Render(nil, c, nil)
		if err != nil {
			got = []byte(err.Error())
		}
		if string(got) != want {
			t.Errorf("trust %v %s:\n got %q\nwant %q", trust, body, got, want)
		}
		// A request's own template has no fast path: RenderFast leaves
		// it, compiled or not, to Render.
		if fast, err := tmpl.RenderFast(nil, c, nil); c.hasChatTemplate && (err != ErrJinja || len(fast) > 0) {
			t.Errorf("trust %v %s: RenderFast %q %v, want ErrJinja", trust, body, fast, err)
		}
	}
	refused := "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template."
	f(false, `{"messages":[{"role":"user","content":"a"}],"chat_template":"[{{ messages[0].content }}]"}`, refused)
	f(false, `{"messages":[{"role":"user","content":"a"}],"chat_template_kwargs":{"chat_template":"x"}}`, refused)
	f(false, `{"messages":[{"role":"user","content":"a"}],"chat_template_kwargs":{"chat_template":null}}`, "a")
	f(true, `{"messages":[{"role":"user","content":"a"}],"chat_template":"[{{ messages[0].content }}]"}`, "[a]")
	f(true, `{"messages":[{"role":"user","content":"a"}],"chat_template":"{{ x | pprint }}"}`,
		`chat: the template engine cannot render this chat template: filter "pprint" is not implemented`)
}

// TestRepeatedNullKeys: a repeated tools or chat_template_kwargs key's
// last value counts, as json.loads keeps it (vLLM's parse): a null after
// a value leaves none, and a value after a null is that value.
func TestRepeatedNullKeys(t *testing.T) {
	tmpl := loadTemplate(t, "qwen3")
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	const tools = `"tools":[{"type":"function","function":{"name":"read","parameters":{"type":"object"}}}]`
	const kwargs = `"chat_template_kwargs":{"enable_thinking":false}`
	render := func(body string) string {
		t.Helper()
		c := AcquireConversation()
		defer ReleaseConversation(c)
		if err := c.ParseRequest([]byte(body)); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		out, err := tmpl.Render(nil, c, nil)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		return string(out)
	}
	for _, c := range [][2]string{
		{`{` + msgs + `,` + tools + `,"tools":null}`, `{` + msgs + `}`},
		{`{"tools":null,` + msgs + `,` + tools + `}`, `{` + msgs + `,` + tools + `}`},
		{`{` + msgs + `,` + kwargs + `,"chat_template_kwargs":null}`, `{` + msgs + `}`},
		{`{"chat_template_kwargs":null,` + msgs + `,` + kwargs + `}`, `{` + msgs + `,` + kwargs + `}`},
	} {
		if got, want := render(c[0]), render(c[1]); got != want {
			t.Errorf("%s rendered\n%q\nwant, as %s,\n%q", c[0], got, c[1], want)
		}
	}
}
