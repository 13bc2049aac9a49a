package chat

import (
	"errors"
	"testing"
)

// TestParseResponses: a Responses request renders as the chat request
// vLLM makes of it (construct_input_messages), and what vLLM renders
// otherwise is ErrInexact, not a guess.
func TestParseResponses(t *testing.T) {
	plain, err := Compile(`{% for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	templates := map[string]*Template{"plain": plain, "qwen3": loadTemplate(t, "qwen3")}
	defer func() {
		for _, tmpl := range templates {
			tmpl.learners.Wait()
		}
	}()
	same := func(responses, chat string) {
		t.Helper()
		for name, tmpl := range templates {
			r, c := AcquireConversation(), AcquireConversation()
			if err := r.ParseResponses([]byte(responses)); err != nil {
				t.Fatalf("%s: ParseResponses(%s): %v", name, responses, err)
			}
			if err := c.ParseRequest([]byte(chat)); err != nil {
				t.Fatalf("%s: ParseRequest(%s): %v", name, chat, err)
			}
			got, err := tmpl.Render(nil, r, nil)
			if err != nil {
				t.Fatalf("%s: %s: %v", name, responses, err)
			}
			want, err := tmpl.Render(nil, c, nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("%s: %s rendered\n%q\nwant (as %s)\n%q", name, responses, got, chat, want)
			}
			ReleaseConversation(r)
			ReleaseConversation(c)
		}
	}
	same(`{"model":"m","input":"Hi"}`, `{"messages":[{"role":"user","content":"Hi"}]}`)
	same(`{"input":"Hi","instructions":"Be brief."}`, `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`)
	// Empty instructions make no system message (vLLM tests them as a
	// Python truth value); the last of repeated keys wins.
	same(`{"instructions":"","input":"Hi"}`, `{"messages":[{"role":"user","content":"Hi"}]}`)
	same(`{"instructions":"a","instructions":null,"input":"Hi"}`, `{"messages":[{"role":"user","content":"Hi"}]}`)
	// A list of message items, as a client resending its history sends
	// it: a user's parts are kept as the chat API reads them, an
	// assistant's content is its first part's text, and nothing else of
	// it (its name, tool calls, reasoning) reaches the template.
	same(`{"instructions":"S","input":[
		{"role":"user","content":"one"},
		{"type":"message","role":"assistant","id":"msg_1","status":"completed","content":[{"type":"output_text","text":"two","annotations":[]},{"type":"output_text","text":"dropped"}]},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"three"},{"type":"input_text","text":"four"}]},
		{"role":"developer","content":"five"},
		{"role":"assistant","content":"six"},
		{"role":"assistant","content":[]},
		{"role":"assistant","content":"seven","name":"bot","reasoning_content":"hmm","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}],"store":false,"stream":true}`,
		`{"messages":[{"role":"system","content":"S"},{"role":"user","content":"one"},{"role":"assistant","content":"two"},
		{"role":"user","content":[{"type":"input_text","text":"three"},{"type":"input_text","text":"four"}]},
		{"role":"developer","content":"five"},{"role":"assistant","content":"six"},{"role":"assistant","content":""},{"role":"assistant","content":"seven"}]}`)

	inexact := func(body string) {
		t.Helper()
		c := AcquireConversation()
		defer ReleaseConversation(c)
		if err := c.ParseResponses([]byte(body)); !errors.Is(err, ErrInexact) {
			t.Errorf("%s: %v, want ErrInexact", body, err)
		}
	}
	inexact(`{"input":"Hi","previous_response_id":"resp_1"}`)
	inexact(`{"input":"Hi","previous_response":{"id":"resp_1","output":[]}}`)
	inexact(`{"input":"Hi","tools":[{"type":"function","name":"f"}]}`)
	inexact(`{"input":"Hi","reasoning":{"effort":"low"}}`)
	inexact(`{"model":"m"}`)
	inexact(`{"input":[]}`)
	inexact(`{"input":3}`)
	inexact(`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}`)
	inexact(`{"input":[{"role":"user","content":"q"},{"type":"function_call_output","call_id":"c","output":"42"}]}`)
	inexact(`{"input":[{"type":"reasoning","id":"rs_1","summary":[]}]}`)
	inexact(`{"input":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"output_text","text":"draft"}],"status":"incomplete"}]}`)
	inexact(`{"input":[{"role":"tool","content":"q"}]}`)
	inexact(`{"input":[{"role":"assistant","content":[{"type":"refusal","refusal":"no"}]}]}`)
	inexact(`{"input":[{"role":"user","content":[{"type":"bogus"}]}]}`)
	inexact(`{"input":["Hi"]}`)

	c := AcquireConversation()
	defer ReleaseConversation(c)
	var re *RequestError
	if err := c.ParseResponses([]byte(`[1]`)); !errors.As(err, &re) {
		t.Errorf("a body that is no object: %v, want a *RequestError", err)
	}
	if err := c.ParseResponses([]byte(`{"input":"Hi",}`)); !errors.As(err, &re) {
		t.Errorf("a body that is no JSON: %v, want a *RequestError", err)
	}
}

// TestEmptyTextPart: vLLM drops a content part whose text is empty before
// it joins a string-format template's texts ("a", "", "b" is "a\nb"); an
// "openai"-format template gets the empty part as it came.
func TestEmptyTextPart(t *testing.T) {
	str, err := Compile(`{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := Compile(`{% for m in messages %}<{{ m.role }}>{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer str.learners.Wait()
	defer parts.learners.Wait()
	render := func(tmpl *Template, body string) string {
		t.Helper()
		c := AcquireConversation()
		defer ReleaseConversation(c)
		if err := c.ParseRequest([]byte(body)); err != nil {
			t.Fatal(err)
		}
		out, err := tmpl.Render(nil, c, nil)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":""},"b"]}]}`
	if got, want := render(str, body), render(str, `{"messages":[{"role":"user","content":"a\nb"}]}`); got != want {
		t.Errorf("string format: %q, want %q", got, want)
	}
	if got := render(parts, body); got != "<user>[a][][b]" {
		t.Errorf("openai format: %q, want the empty part kept", got)
	}
	// A tool result reaches an "openai"-format template joined, its
	// parts wrapped first: the empty one kept.
	tool := `{"messages":[{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"a"},{"type":"text","text":""},"b"]}]}`
	both, err := Compile(`{% for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}{% endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer both.learners.Wait()
	if got := render(both, tool); got != "<tool>a\n\nb" {
		t.Errorf("openai format, tool result: %q, want the empty part joined", got)
	}
}
