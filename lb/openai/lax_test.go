package openai

import (
	"slices"
	"testing"

	"pdlb/engines/tokenize"
)

// TestParseLax: values vLLM, SGLang and TensorRT-LLM take for an integer
// or boolean field (pydantic v2, lax mode: "8", 8.0, true for an int;
// "true", 1, "on" for a bool) are taken, and read as the engines read
// them, rather than refused with a 400 no pod would have sent.
func TestParseLax(t *testing.T) {
	type want struct {
		stream, usage, special bool
		maxTokens, choices     int
		ids                    []uint32
	}
	f := func(kind Kind, fields string, w want) {
		t.Helper()
		r := NewRequest()
		prompt := `"prompt":"x"`
		if kind == KindChat {
			prompt = `"messages":[{"role":"user","content":"x"}]`
		}
		body := `{"model":"m",` + fields + `,` + prompt + `}`
		if w.ids != nil {
			body = `{"model":"m",` + fields + `}`
		}
		if err := r.Parse(kind, []byte(body)); err != nil {
			t.Errorf("Parse(%s): %v; want it taken", body, err)
			return
		}
		if w.choices == 0 {
			w.choices = 1
		}
		if w.maxTokens == 0 {
			w.maxTokens = -1
		}
		if r.Stream != w.stream || r.IncludeUsage != w.usage || r.SpecialTokens != w.special || r.MaxTokens != w.maxTokens ||
			r.Choices != w.choices || w.ids != nil && !slices.Equal(r.PromptIDs, w.ids) {
			t.Errorf("Parse(%s): stream %v usage %v special tokens %v max_tokens %d n %d ids %v; want %+v",
				body, r.Stream, r.IncludeUsage, r.SpecialTokens, r.MaxTokens, r.Choices, r.PromptIDs, w)
		}
	}
	for _, v := range []string{`"true"`, `"True"`, `"on"`, `"yes"`, `"t"`, `"1"`, `1`, `1.0`} {
		f(KindChat, `"stream":`+v, want{stream: true})
		f(KindCompletion, `"add_special_tokens":`+v, want{special: true})
		f(KindChat, `"stream":true,"stream_options":{"include_usage":`+v+`}`, want{stream: true, usage: true})
	}
	for _, v := range []string{`"false"`, `"OFF"`, `"no"`, `"n"`, `"0"`, `0`, `-0.0`} {
		f(KindChat, `"stream":`+v, want{})
	}
	for v, n := range map[string]int{`"8"`: 8, `" 8\n"`: 8, `"+8"`: 8, `"08"`: 8, `"8.00"`: 8, `8.0`: 8, `80e-1`: 8,
		`"1_000"`: 1000, `1e3`: 1000, `true`: 1, `"\u0038"`: 8} {
		f(KindChat, `"max_tokens":`+v, want{maxTokens: n})
		f(KindChat, `"max_completion_tokens":`+v+`,"max_tokens":5`, want{maxTokens: n})
		if n > 0 {
			f(KindCompletion, `"n":`+v, want{choices: n})
		}
	}
	f(KindCompletion, `"prompt":[1.0,"2",true,3e0]`, want{ids: []uint32{1, 2, 1, 3}})
	f(KindCompletion, `"prompt":[["7"],[false,2.0]]`, want{ids: []uint32{7, 0, 2}})

	// truncate_prompt_tokens, too, is an integer to the engines that read it.
	for v, keep := range map[string]int{`"2"`: 2, `2.0`: 2, `" 2 "`: 2, `"-1"`: 0, `-1.0`: 0} {
		r := NewRequest()
		body := `{"model":"m","prompt":"aaaabbbbcccc","truncate_prompt_tokens":` + v + `}`
		if err := r.Parse(KindCompletion, []byte(body)); err != nil || r.TruncationError() != nil {
			t.Errorf("Parse(%s): %v, %v; want it taken", body, err, r.TruncationError())
		} else if got, want := len(tokensOf(r)), len(tokenize.Append(nil, []byte("aaaabbbbcccc"))); keep > 0 && got != keep || keep == 0 && got != want {
			t.Errorf("Parse(%s): keeps %d tokens, want %d (0: all)", body, got, keep)
		}
	}
}
