package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/bytedance/sonic"

	"pdlb/engines"
	"pdlb/engines/tokenize"
	"pdlb/radix"
)

// turn renders one chat turn the way the gateway must, through the shared
// template, so the expectations below do not restate the template.
func turn(role, content string) string {
	return string(tokenize.AppendTurn(nil, []byte(role), []byte(content)))
}

func TestParseFields(t *testing.T) {
	type want struct {
		model         string
		stream        bool
		maxTokens     int
		maxCompletion bool
		hasSO, usage  bool
		hasUsage      bool // include_usage present
		prompt        string
		ids           []uint32 // nil: text prompt
		messages      int
		media         int
		salt          string
	}
	f := func(kind Kind, body string, w want) {
		t.Helper()
		r := NewRequest()
		if err := r.Parse(kind, []byte(body)); err != nil {
			t.Fatalf("Parse(%s): %v", body, err)
		}
		got := want{string(r.Model), r.Stream, r.MaxTokens, r.MaxCompletionTokens,
			r.HasStreamOptions, r.IncludeUsage, r.HasIncludeUsage, string(r.Prompt), nil, r.Messages, r.MediaBytes, string(r.CacheSalt)}
		if r.TokenIDs {
			got.ids = append([]uint32{}, r.PromptIDs...)
		}
		if (got.ids == nil) != (w.ids == nil) || !slices.Equal(got.ids, w.ids) || got.model != w.model || got.stream != w.stream ||
			got.maxTokens != w.maxTokens || got.maxCompletion != w.maxCompletion ||
			got.hasSO != w.hasSO || got.usage != w.usage || got.hasUsage != w.hasUsage || got.prompt != w.prompt ||
			got.messages != w.messages || got.media != w.media || got.salt != w.salt {
			t.Fatalf("Parse(%s)\n got %+v\nwant %+v", body, got, w)
		}
		wantTokens := tokenize.Count([]byte(w.prompt))
		if w.ids != nil {
			wantTokens = len(w.ids)
		}
		if n := r.PromptTokens(); n != wantTokens {
			t.Fatalf("PromptTokens() = %d, want %d", n, wantTokens)
		}
		if ids := tokensOf(r); len(ids) != wantTokens {
			t.Fatalf("AppendTokens gave %d ids, want %d", len(ids), wantTokens)
		}
	}
	gen := tokenize.GenerationPrompt

	// chat: content as a string, null, or parts; roles; ordering; escapes
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("user", "hi") + gen, messages: 1})
	f(KindChat, ` { "messages" : [ { "content" : "hi" , "role" : "user" } ] , "model" : "m" } `,
		want{model: "m", maxTokens: -1, prompt: turn("user", "hi") + gen, messages: 1})
	f(KindChat, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"a\nb\t\"c\" \u00e9 \ud83d\ude00 \/"}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("system", "be brief") + turn("user", "a\nb\t\"c\" é 😀 /") + gen, messages: 2})
	f(KindChat, `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"x"}]},{"role":"tool","content":"42","tool_call_id":"x"}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("assistant", "") + turn("tool", "42") + gen, messages: 2})
	f(KindChat, `{"model":"m","messages":[{"role":"assistant"}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("assistant", "") + gen, messages: 1})
	parts := `[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:x"}},{"text":"at\nthis","type":"text"}]`
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":`+parts+`}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("user", "look\nat\nthis") + gen, messages: 1,
			media: len(`{"type":"image_url","image_url":{"url":"data:x"}}`)})
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":[]}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("user", "") + gen, messages: 1})
	f(KindChat, `{"model":"m","messages":[{"role":"us\u0065r","content":[{"type":"t\u0065xt","text":"x"}]}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("user", "x") + gen, messages: 1})
	// parts as vLLM reads them: bare strings, the other text types, text
	// null or absent skipped, media without a type
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":["a",{"type":"input_text","text":"b"},{"type":"text","text":null},{"type":"output_text"},{"type":"refusal","refusal":"c","text":"x"},{"thinking":"d","type":"thinking"}]}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("user", "a\nb\nc\nd") + gen, messages: 1})
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":[{"image_url":{"url":"u"}},"a"]}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("user", "a") + gen, messages: 1, media: len(`{"image_url":{"url":"u"}}`)})
	// repeated keys: the last value wins, as in Python's json
	f(KindChat, `{"model":"a","model":"b","messages":[{"role":"user","content":"x","content":"y"}],"messages":[{"role":"user","content":"z"}]}`,
		want{model: "b", maxTokens: -1, prompt: turn("user", "z") + gen, messages: 1})
	// no model, null or "": the pod's own, which the gateway decides
	for _, model := range []string{``, `"model":null,`, `"model":"",`, `"model":"a","model":null,`} {
		f(KindChat, `{`+model+`"messages":[{"role":"user","content":"x"}]}`,
			want{maxTokens: -1, prompt: turn("user", "x") + gen, messages: 1})
	}
	// "prompt" is not read on the chat path, nor "messages" on the completion path
	f(KindChat, `{"model":"m","prompt":5,"messages":[{"role":"user","content":"x"}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("user", "x") + gen, messages: 1})

	// scalar fields
	f(KindChat, `{"model":"m\u002fx","stream":true,"max_tokens":128,"stream_options":{"include_usage":true,"continuous_usage_stats":false},"messages":[{"role":"user","content":""}]}`,
		want{model: "m/x", stream: true, maxTokens: 128, hasSO: true, usage: true, hasUsage: true, prompt: turn("user", "") + gen, messages: 1})
	f(KindChat, `{"model":"m","stream":null,"max_tokens":null,"stream_options":null,"messages":[{"role":"user","content":""}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("user", "") + gen, messages: 1})
	f(KindChat, `{"model":"m","stream":false,"max_completion_tokens":0,"max_tokens":7,"stream_options":{},"messages":[{"role":"user","content":""}]}`,
		want{model: "m", maxTokens: 0, maxCompletion: true, hasSO: true, prompt: turn("user", "") + gen, messages: 1})
	f(KindChat, `{"model":"m","max_tokens":2147483647,"stream_options":{"include_usage":null},"messages":[{"role":"user","content":""}]}`,
		want{model: "m", maxTokens: math.MaxInt32, hasSO: true, hasUsage: true, prompt: turn("user", "") + gen, messages: 1})
	// cache_salt: a string of up to 128 characters, null for none
	f(KindChat, `{"model":"m","cache_salt":"s\u00e9l-1","messages":[{"role":"user","content":"x"}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("user", "x") + gen, messages: 1, salt: "sél-1"})
	f(KindChat, `{"model":"m","cache_salt":null,"messages":[{"role":"user","content":"x"}]}`,
		want{model: "m", maxTokens: -1, prompt: turn("user", "x") + gen, messages: 1})
	f(KindCompletion, `{"model":"m","cache_salt":"`+strings.Repeat("é", 128)+`","prompt":"x"}`,
		want{model: "m", maxTokens: -1, prompt: "x", salt: strings.Repeat("é", 128)})
	// unknown fields of every shape are skipped
	f(KindChat, `{"tools":[{"type":"function","function":{"name":"f","parameters":{"a":[1,2,{"b":"]}\"["}]}}}],"temperature":0.5e-3,"n":1,"stop":null,"logit_bias":{},"model":"m","messages":[{"name":"x","role":"user","content":"q"}],"user":"u\"}"}`,
		want{model: "m", maxTokens: -1, prompt: turn("user", "q") + gen, messages: 1})

	// completion: every prompt shape
	f(KindCompletion, `{"model":"m","prompt":"once upon a time"}`,
		want{model: "m", maxTokens: -1, prompt: "once upon a time"})
	f(KindCompletion, `{"model":"m","prompt":""}`,
		want{model: "m", maxTokens: -1})
	f(KindCompletion, `{"model":"m","prompt":["ab","c\nd"],"max_tokens":3}`,
		want{model: "m", maxTokens: 3, prompt: "abc\nd"})
	// max_completion_tokens is chat's: vLLM's and SGLang's completion
	// requests have no such field and ignore it, whatever its value
	f(KindCompletion, `{"model":"m","prompt":"x","max_completion_tokens":3,"max_tokens":5}`,
		want{model: "m", maxTokens: 5, prompt: "x"})
	f(KindCompletion, `{"model":"m","prompt":"x","max_completion_tokens":[1]}`,
		want{model: "m", maxTokens: -1, prompt: "x"})
	f(KindCompletion, `{"model":"m","prompt":[1, 2 ,4294967295,0]}`,
		want{model: "m", maxTokens: -1, ids: []uint32{1, 2, math.MaxUint32, 0}})
	f(KindCompletion, `{"model":"m","prompt":["1",2,"3"]}`,
		want{model: "m", maxTokens: -1, ids: []uint32{1, 2, 3}})
	f(KindCompletion, `{"model":"m","prompt":[[1,2],[],[3]]}`,
		want{model: "m", maxTokens: -1, ids: []uint32{1, 2, 3}})
	f(KindCompletion, `{"model":"m","messages":7,"prompt":"x"}`,
		want{model: "m", maxTokens: -1, prompt: "x"})
}

func TestParseErrors(t *testing.T) {
	f := func(kind Kind, body, wantMsg, wantParam, wantCode string) {
		t.Helper()
		var r Request
		err := r.Parse(kind, []byte(body))
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("Parse(%s) = %v, want an *Error", body, err)
		}
		if e.Status != 400 || e.Type != TypeInvalidRequest || e.Message != wantMsg || e.Param != wantParam || e.Code != wantCode {
			t.Fatalf("Parse(%s) = %+v\nwant message %q param %q code %q", body, *e, wantMsg, wantParam, wantCode)
		}
	}
	const chat = `"messages":[{"role":"user","content":"x"}]`
	bad := "We could not parse the JSON body of your request."

	// not JSON, or not an object
	f(KindChat, ``, bad, "", "")
	f(KindChat, `{"model":"m",`, bad, "", "")
	f(KindChat, `{"model":"m"} x`, bad, "", "")
	f(KindChat, `{"model":"m\x"}`, bad, "", "")
	f(KindChat, `{'model':'m'}`, bad, "", "")
	f(KindChat, `[1]`, "The request body must be a JSON object.", "", "")
	f(KindChat, ` "x"`, "The request body must be a JSON object.", "", "")

	// model
	f(KindChat, `{"model":5,`+chat+`}`, `"model" must be a string, got 5`, "model", CodeInvalidType)
	f(KindChat, `{"model":["m"],`+chat+`}`, `"model" must be a string, got ["m"]`, "model", CodeInvalidType)

	// scalars
	f(KindChat, `{"model":"m","stream":"maybe",`+chat+`}`, `"stream" must be a boolean, got "maybe"`, "stream", CodeInvalidType)
	f(KindChat, `{"model":"m","stream":" true",`+chat+`}`, `"stream" must be a boolean, got " true"`, "stream", CodeInvalidType)
	f(KindChat, `{"model":"m","stream":2,`+chat+`}`, `"stream" must be a boolean, got 2`, "stream", CodeInvalidType)
	f(KindChat, `{"model":"m","n":0,`+chat+`}`, `"n" must be at least 1`, "n", CodeInvalidValue)
	f(KindChat, `{"model":"m","n":"2.5",`+chat+`}`, `"n" must be a non-negative integer, got "2.5"`, "n", CodeInvalidType)
	f(KindChat, `{"model":"m","n":"0x2",`+chat+`}`, `"n" must be a non-negative integer, got "0x2"`, "n", CodeInvalidType)
	f(KindChat, `{"model":"m","max_tokens":"abc",`+chat+`}`, `"max_tokens" must be a non-negative integer, got "abc"`, "max_tokens", CodeInvalidType)
	f(KindChat, `{"model":"m","max_tokens":-1,`+chat+`}`, `"max_tokens" must be a non-negative integer, got -1`, "max_tokens", CodeInvalidType)
	f(KindChat, `{"model":"m","max_tokens":1.5,`+chat+`}`, `"max_tokens" must be a non-negative integer, got 1.5`, "max_tokens", CodeInvalidType)
	f(KindChat, `{"model":"m","max_tokens":"1e3",`+chat+`}`, `"max_tokens" must be a non-negative integer, got "1e3"`, "max_tokens", CodeInvalidType)
	f(KindChat, `{"model":"m","max_tokens":"-1",`+chat+`}`, `"max_tokens" must be a non-negative integer, got "-1"`, "max_tokens", CodeInvalidType)
	f(KindChat, `{"model":"m","max_tokens":1e400,`+chat+`}`, `"max_tokens" must be a non-negative integer, got 1e400`, "max_tokens", CodeInvalidType)
	f(KindChat, `{"model":"m","max_tokens":2147483648,`+chat+`}`, `"max_tokens" must be a non-negative integer, got 2147483648`, "max_tokens", CodeInvalidType)
	f(KindChat, `{"model":"m","max_completion_tokens":[1],`+chat+`}`, `"max_completion_tokens" must be a non-negative integer, got [1]`, "max_completion_tokens", CodeInvalidType)
	f(KindChat, `{"model":"m","stream_options":true,`+chat+`}`, `"stream_options" must be an object, got true`, "stream_options", CodeInvalidType)
	f(KindChat, `{"model":"m","stream_options":{"include_usage":0.5},`+chat+`}`, `"stream_options.include_usage" must be a boolean, got 0.5`, "stream_options.include_usage", CodeInvalidType)

	// messages
	f(KindChat, `{"model":"m"}`, `"messages" is required`, "messages", CodeMissingParam)
	f(KindChat, `{"model":"m","messages":null}`, `"messages" is required`, "messages", CodeMissingParam)
	f(KindChat, `{"model":"m","messages":{}}`, `"messages" must be a list, got {}`, "messages", CodeInvalidType)
	f(KindChat, `{"model":"m","messages":[]}`, `"messages" must not be empty`, "messages", CodeInvalidValue)
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":"x"},"hi"]}`, `"messages[1]" must be an object, got "hi"`, "messages[1]", CodeInvalidType)
	f(KindChat, `{"model":"m","messages":[{"content":"x"}]}`, `"messages[0].role" is required`, "messages[0].role", CodeMissingParam)
	f(KindChat, `{"model":"m","messages":[{"role":null,"content":"x"}]}`, `"messages[0].role" is required`, "messages[0].role", CodeMissingParam)
	f(KindChat, `{"model":"m","messages":[{"role":1,"content":"x"}]}`, `"messages[0].role" must be a string, got 1`, "messages[0].role", CodeInvalidType)
	f(KindChat, `{"model":"m","messages":[{"role":"a","content":"x"},{"role":"b","content":"y"},{"role":"user","content":5}]}`,
		`"messages[2].content" must be a string or a list of parts, got 5`, "messages[2].content", CodeInvalidType)
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":{"text":"x"}}]}`,
		`"messages[0].content" must be a string or a list of parts, got {"text":"x"}`, "messages[0].content", CodeInvalidType)
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":[5]}]}`,
		`"messages[0].content[0]" must be a string or an object, got 5`, "messages[0].content[0]", CodeInvalidType)
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"},{"text":"y"}]}]}`,
		`"messages[0].content[1].type" is required`, "messages[0].content[1].type", CodeMissingParam)
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":3}]}]}`,
		`"messages[0].content[0].type" must be a string, got 3`, "messages[0].content[0].type", CodeInvalidType)
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"refusal","refusal":1}]}]}`,
		`"messages[0].content[0].refusal" must be a string, got 1`, "messages[0].content[0].refusal", CodeInvalidType)
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":["a"]}]}]}`,
		`"messages[0].content[0].text" must be a string, got ["a"]`, "messages[0].content[0].text", CodeInvalidType)

	// prompt
	f(KindCompletion, `{"model":"m"}`, `"prompt" is required`, "prompt", CodeMissingParam)
	f(KindCompletion, `{"model":"m","prompt":null}`, `"prompt" is required`, "prompt", CodeMissingParam)
	f(KindCompletion, `{"model":"m","prompt":{}}`,
		`"prompt" must be a string, a list of strings, a list of token ids or a list of lists of token ids, got {}`, "prompt", CodeInvalidType)
	f(KindCompletion, `{"model":"m","prompt":[]}`, `"prompt" must not be an empty list`, "prompt", CodeInvalidValue)
	f(KindCompletion, `{"model":"m","prompt":["a",1]}`, `"prompt[0]" must be a token id (an integer from 0 to 4294967295), got "a"`, "prompt[0]", CodeInvalidType)
	f(KindCompletion, `{"model":"m","prompt":[1,"a"]}`,
		`"prompt[1]" must be a token id (an integer from 0 to 4294967295), got "a"`, "prompt[1]", CodeInvalidType)
	f(KindCompletion, `{"model":"m","prompt":[1,-2]}`,
		`"prompt[1]" must be a token id (an integer from 0 to 4294967295), got -2`, "prompt[1]", CodeInvalidType)
	f(KindCompletion, `{"model":"m","prompt":[4294967296]}`,
		`"prompt[0]" must be a token id (an integer from 0 to 4294967295), got 4294967296`, "prompt[0]", CodeInvalidType)
	f(KindCompletion, `{"model":"m","prompt":[[1],2]}`, `"prompt[1]" must be a list of token ids, got 2`, "prompt[1]", CodeInvalidType)
	f(KindCompletion, `{"model":"m","prompt":[[1],[2,1.5]]}`,
		`"prompt[1][1]" must be a token id (an integer from 0 to 4294967295), got 1.5`, "prompt[1][1]", CodeInvalidType)
	f(KindCompletion, `{"model":"m","prompt":[null]}`,
		`"prompt[0]" must be a token id (an integer from 0 to 4294967295), got null`, "prompt[0]", CodeInvalidType)
	// long values are cut in the message
	long := strings.Repeat("x", 100)
	f(KindCompletion, `{"model":"m","prompt":{"a":"`+long+`"}}`,
		`"prompt" must be a string, a list of strings, a list of token ids or a list of lists of token ids, got {"a":"`+long[:34]+`...`, "prompt", CodeInvalidType)
}

// TestParseGrammar checks that Parse's single walk accepts a body exactly
// when sonic.Valid does (the validator it replaced; invalid escapes, which
// Parse alone refuses, are TestParseErrors' business), for values that step
// over every rule of the grammar, wherever they sit: an unknown field, a
// message's unknown field, a content part's unknown field, and nested to
// sonic's depth limit and one past it.
func TestParseGrammar(t *testing.T) {
	f := func(body string) {
		t.Helper()
		var r Request
		err := r.Parse(KindChat, []byte(body))
		malformed := err != nil && err.Error() == InvalidJSON().Error()
		if valid := sonic.Valid([]byte(body)); malformed == valid {
			t.Fatalf("Parse(%.200q) = %v, sonic.Valid: %v", body, err, valid)
		}
	}
	values := []string{
		`0`, `-0`, `12`, `-1.5e+3`, `1E-2`, `0.0e0`, `1e5`, `01`, `-`, `1.`, `.5`, `1e`, `1E+`, `+1`, `--1`, `0x1`, `1.e3`,
		`true`, `false`, `null`, `tru`, `nul`, `True`, `truex`, `nullnull`,
		`""`, `"a\"b"`, `"\u00e9\n"`, `"a`, `"\"`, `"\\"`,
		`[]`, `{}`, `[ ]`, `{ }`, `[1,2]`, `[1,]`, `[,1]`, `[1 2]`, `[1,,2]`, `[`, `]`, `[}`, `{]`,
		`{"a":1}`, `{"a":1,}`, `{,"a":1}`, `{"a" 1}`, `{"a":}`, `{"a"}`, `{1:2}`, `{"a":1 "b":2}`, `{"a":[{"b":{}}],"c":[[],[[]]]}`,
		" \t\n\r[ 1 , { \"a\" : 2 } ]\n",
	}
	for _, v := range values {
		f(`{"model":"m","x":` + v + `,"messages":[{"role":"user","content":"hi"}]}`)
		f(`{"model":"m","messages":[{"role":"user","x":` + v + `,"content":"hi"}]}`)
		f(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","x":` + v + `,"text":"hi"}]}]}`)
		f(`{"model":"m","messages":[{"role":"user","content":"hi"}],"x":` + v + `}`)
	}
	for _, body := range []string{``, ` `, `{`, `}`, `{}x`, `{} `, `{},`, "\ufeff{}", `{"model":"m","messages":[{"role":"user","content":"hi"}]}}`} {
		f(body)
	}
	// The body's object counts one, so 4,095 lists fit and 4,096 do not;
	// an object's members count one more than the object.
	for _, d := range []int{maxDepth - 3, maxDepth - 2, maxDepth - 1, maxDepth, maxDepth + 1} {
		for _, inner := range []string{``, `1`, `{}`, `{"a":1}`, `[{"a":1}]`, `{"a":[]}`} {
			f(`{"model":"m","x":` + strings.Repeat("[", d) + inner + strings.Repeat("]", d) + `,"messages":[{"role":"user","content":"hi"}]}`)
		}
		f(`{"model":"m","x":` + strings.Repeat(`{"a":`, d) + `1` + strings.Repeat("}", d) + `,"messages":[{"role":"user","content":"hi"}]}`)
		f(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi","x":` + strings.Repeat("[", d) + strings.Repeat("]", d) + `}]}]}`)
	}
}

// TestParseReusesRequest checks that a parse leaves nothing behind for the
// next one on the same Request.
func TestParseReusesRequest(t *testing.T) {
	r := NewRequest()
	if err := r.Parse(KindCompletion, []byte(`{"model":"long-model","prompt":[1,2,3],"stream":true,"max_tokens":9,"stream_options":{"include_usage":true},"cache_salt":"s","truncate_prompt_tokens":2,"truncation_side":"right"}`)); err != nil {
		t.Fatal(err)
	}
	if err := r.Parse(KindChat, []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`)); err != nil {
		t.Fatal(err)
	}
	if string(r.Model) != "m" || r.Stream || r.MaxTokens != -1 || r.HasStreamOptions || r.IncludeUsage || r.HasIncludeUsage ||
		r.TokenIDs || len(r.PromptIDs) != 0 || string(r.Prompt) != turn("user", "")+tokenize.GenerationPrompt ||
		r.Kind != KindChat || r.MediaBytes != len(`{"type":"image_url"}`) || len(r.CacheSalt) != 0 ||
		r.PromptTokens() != tokenize.Count(r.Prompt) {
		t.Fatalf("stale state after reuse: %+v", r)
	}
}

// TestTruncationError: Parse takes any truncate_prompt_tokens and
// truncation_side, keeping the whole prompt for a value vLLM refuses;
// TruncationError is vLLM's 400 for it where the engine reads the fields,
// none where it ignores them (SGLang).
func TestTruncationError(t *testing.T) {
	f := func(kind Kind, body, wantMsg, wantParam, wantCode string) {
		t.Helper()
		var r Request
		if err := r.Parse(kind, []byte(body)); err != nil {
			t.Fatalf("Parse(%s) = %v", body, err)
		}
		for _, k := range engines.Kinds {
			r.Engine = k
			e := r.TruncationError()
			if keep, right := r.Truncation(); keep != 0 || right {
				t.Fatalf("%s: %s keeps %d tokens (right: %v) of a prompt it refuses or ignores the cut of", body, k, keep, right)
			}
			if !k.ReadsTruncation() {
				if e != nil {
					t.Fatalf("%s: %s, which ignores the field, refuses it: %v", body, k, e)
				}
				continue
			}
			if e == nil || e.Status != 400 || e.Type != TypeInvalidRequest || e.Message != wantMsg || e.Param != wantParam || e.Code != wantCode {
				t.Fatalf("%s: %s answers %+v\nwant message %q param %q code %q", body, k, e, wantMsg, wantParam, wantCode)
			}
		}
	}
	const chat = `"messages":[{"role":"user","content":"x"}]`
	badTrunc := `"truncate_prompt_tokens" must be an integer from -1 to 2147483647, got `
	f(KindChat, `{"model":"m","truncate_prompt_tokens":-2,`+chat+`}`, badTrunc+`-2`, "truncate_prompt_tokens", CodeInvalidType)
	f(KindChat, `{"model":"m","truncate_prompt_tokens":"5.5",`+chat+`}`, badTrunc+`"5.5"`, "truncate_prompt_tokens", CodeInvalidType)
	f(KindCompletion, `{"model":"m","truncate_prompt_tokens":1.5,"prompt":"x"}`, badTrunc+`1.5`, "truncate_prompt_tokens", CodeInvalidType)
	f(KindCompletion, `{"model":"m","truncate_prompt_tokens":2147483648,"prompt":"x"}`, badTrunc+`2147483648`, "truncate_prompt_tokens", CodeInvalidType)
	f(KindCompletion, `{"model":"m","truncate_prompt_tokens":[8],"prompt":"x"}`, badTrunc+`[8]`, "truncate_prompt_tokens", CodeInvalidType)
	f(KindChat, `{"model":"m","truncation_side":"middle",`+chat+`}`, `"truncation_side" must be "left" or "right", got "middle"`, "truncation_side", CodeInvalidValue)
	f(KindChat, `{"model":"m","truncation_side":"Left",`+chat+`}`, `"truncation_side" must be "left" or "right", got "Left"`, "truncation_side", CodeInvalidValue)
	f(KindCompletion, `{"model":"m","truncation_side":1,"prompt":"x"}`, `"truncation_side" must be "left" or "right", got 1`, "truncation_side", CodeInvalidType)
	// Both bad: the count is named first.
	f(KindCompletion, `{"model":"m","truncation_side":1,"prompt":"x","truncate_prompt_tokens":-2}`, badTrunc+`-2`, "truncate_prompt_tokens", CodeInvalidType)
}

// TestCacheSaltError: Parse takes any cache_salt; CacheSaltError is the
// 400 of the engine that serves the request, nil where it takes the salt.
func TestCacheSaltError(t *testing.T) {
	const chat = `"messages":[{"role":"user","content":"x"}]`
	kind, prompt := KindChat, chat
	f := func(salt string, engine engines.Kind, wantMsg, wantCode string) {
		t.Helper()
		var r Request
		body := `{"model":"m","cache_salt":` + salt + `,` + prompt + `}`
		if salt == "" {
			body = `{"model":"m",` + prompt + `}`
		}
		if err := r.Parse(kind, []byte(body)); err != nil {
			t.Fatalf("Parse(%s) = %v", body, err)
		}
		r.Engine = engine
		e := r.CacheSaltError()
		if wantMsg == "" {
			if e != nil {
				t.Errorf("%s: %s refuses cache_salt %s: %v", engine, body, salt, e)
			}
			return
		}
		if e == nil || e.Status != 400 || e.Type != TypeInvalidRequest || e.Message != wantMsg || e.Param != "cache_salt" || e.Code != wantCode {
			t.Errorf("%s: cache_salt %s answers %+v\nwant message %q code %q", engine, salt, e, wantMsg, wantCode)
		}
	}
	badSalt := `"cache_salt" must be at most 128 characters and must not contain '@', '/', '\\' or NUL`
	notString := `"cache_salt" must be a non-empty string, got `
	for _, vllm := range []engines.Kind{"", engines.VLLM} {
		f(`"tenant-1"`, vllm, "", "")
		f(`null`, vllm, "", "")
		f(`"`+strings.Repeat("é", 128)+`"`, vllm, "", "")
		f(`5`, vllm, notString+`5`, CodeInvalidType)
		f(`["s"]`, vllm, notString+`["s"]`, CodeInvalidType)
		f(`""`, vllm, `"cache_salt" must not be empty`, CodeInvalidValue)
		f(`"`+strings.Repeat("a", 129)+`"`, vllm, badSalt, CodeInvalidValue)
		f(`"a/b"`, vllm, badSalt, CodeInvalidValue)
		f(`"a@b"`, vllm, badSalt, CodeInvalidValue)
		f(`"a\\b"`, vllm, badSalt, CodeInvalidValue)
		f(`"a\u0000"`, vllm, badSalt, CodeInvalidValue)
	}
	f(`"a/b@c"`, engines.TRTLLM, "", "")
	f(`"`+strings.Repeat("a", 129)+`"`, engines.TRTLLM, "", "")
	f(`" \t\u001f\u3000 "`, engines.TRTLLM, `"cache_salt" must not be blank`, CodeInvalidValue)
	f(`""`, engines.TRTLLM, `"cache_salt" must not be blank`, CodeInvalidValue)
	f(`["s"]`, engines.TRTLLM, notString+`["s"]`, CodeInvalidType)
	f(`""`, engines.SGLang, "", "")
	f(`"a/b\u0000"`, engines.SGLang, "", "")
	f(`null`, engines.TRTLLM, "", "")
	f(`[]`, engines.SGLang, "", "")
	f(`null`, engines.SGLang, "", "")
	f(`5`, engines.SGLang, `"cache_salt" must be a string or a list of strings, got 5`, CodeInvalidType)
	f(`["s",{"a":1}]`, engines.SGLang, `"cache_salt" must be a string or a list of strings, got ["s",{"a":1}]`, CodeInvalidType)
	// SGLang's protocol takes a list of strings, and its server then fails
	// on any but an empty one (a 500).
	f(`["s1","s2"]`, engines.SGLang, `"cache_salt" must be a string: SGLang's server fails a list of salts`, CodeInvalidValue)
	long := `[` + strings.Repeat(`"s",`, 100) + `5]`
	f(long, engines.TRTLLM, notString+long[:gotLimit]+"...", CodeInvalidType)

	// TensorRT-LLM's completion request has no cache_salt, and refuses
	// fields it does not know, null ones too.
	kind, prompt = KindCompletion, `"prompt":"x"`
	noField := `"cache_salt" is not a field of TensorRT-LLM's completion request`
	f(`"tenant-1"`, engines.TRTLLM, noField, CodeInvalidValue)
	f(`null`, engines.TRTLLM, noField, CodeInvalidValue)
	f(``, engines.TRTLLM, "", "")
	f(`"tenant-1"`, engines.VLLM, "", "")
	f(`"tenant-1"`, engines.SGLang, "", "")

	// A Responses request's salt is checked as a chat's, as vLLM checks
	// it and runs the request.
	kind, prompt = KindResponses, `"input":"x"`
	f(`"tenant-1"`, engines.TRTLLM, "", "")
	f(`""`, engines.VLLM, `"cache_salt" must not be empty`, CodeInvalidValue)
	f(`5`, engines.VLLM, notString+`5`, CodeInvalidType)
}

func TestParseAllocs(t *testing.T) {
	bodies := map[string][]byte{"chat": chatBody(1 << 10), "chat32k": chatBody(32 << 10),
		"ids": []byte(`{"model":"m","prompt":[[1,2,3],[4,5]],"stream":true,"cache_salt":"tenant-\u0031","truncate_prompt_tokens":2,"truncation_side":"righ\u0074"}`),
		"lax": []byte(`{"model":"m","prompt":[1.0,"2",true],"stream":"On","max_tokens":" 1_0.00 ","n":2e0,"truncate_prompt_tokens":"\u0032"}`)}
	for name, body := range bodies {
		kind := KindChat
		if name == "ids" || name == "lax" {
			kind = KindCompletion
		}
		r := NewRequest()
		if err := r.Parse(kind, body); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { _ = r.Parse(kind, body) }); n != 0 {
			t.Errorf("%s: Parse allocates %.1f times per call once warm, want 0", name, n)
		}
	}
}

func TestKindFromPath(t *testing.T) {
	f := func(path string, want Kind, wantOK bool) {
		t.Helper()
		if k, ok := KindFromPath([]byte(path)); k != want || ok != wantOK {
			t.Fatalf("KindFromPath(%q) = %v, %v; want %v, %v", path, k, ok, want, wantOK)
		}
	}
	f("/v1/chat/completions", KindChat, true)
	f("/v1/completions", KindCompletion, true)
	f("/v1/embeddings", KindOther, true)
	f("/tokenize", KindTokenizer, true)
	f("/detokenize", KindTokenizer, true)
	f("/v2/rerank", KindOther, true)
	f("/v1/models", 0, false)
	f("/v1/completions/", 0, false)
	f("/v1/responses", KindResponses, true)
	f("/v1/responses/resp_1", 0, false)
}

func TestStoredID(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/responses/resp_1":             "resp_1 ",
		"/v1/responses/resp_1/cancel":      "resp_1 cancel",
		"/v1/responses/resp_1/input_items": "resp_1 input_items",
		"/v1/responses/resp_1/other":       "",
		"/v1/responses/":                   "",
		"/v1/responses//cancel":            "",
		"/v1/responses":                    "",
		"/v1/chat/completions":             "",
	} {
		id, sub, ok := StoredID([]byte(path))
		if got := string(id) + " " + sub; ok != (want != "") || ok && got != want {
			t.Errorf("StoredID(%q) = %q, %v; want %q", path, got, ok, want)
		}
	}
}

// TestParseResponses: a Responses API body gives its model, stream,
// store, ids and output budget; WithResponseID names its
// response first in the object, and a later WithModel still finds the
// model.
func TestParseResponses(t *testing.T) {
	r := NewRequest()
	body := `{"input":[{"role":"user","content":"hi"}],"model":"m","stream":true,"store":false,"previous_response_id":"resp_\u0041","max_output_tokens":5}`
	if err := r.Parse(KindResponses, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if string(r.Model) != "m" || !r.Stream || !r.NoStore || string(r.Previous) != "resp_A" || len(r.ResponseID) != 0 || r.MaxTokens != 5 {
		t.Errorf("got %q stream %v nostore %v previous %q id %q max %d", r.Model, r.Stream, r.NoStore, r.Previous, r.ResponseID, r.MaxTokens)
	}
	// In this order: the last body must not keep the first's request_id.
	for _, c := range []struct {
		body    string
		noStore bool
	}{
		{`{"model":"m","store":null,"request_id":"resp_x","previous_response_id":null}`, false},
		{`{"model":"m","store":"false"}`, true},
		{`{"model":"m"}`, false},
	} {
		if err := r.Parse(KindResponses, []byte(c.body)); err != nil || r.NoStore != c.noStore || len(r.Previous) != 0 {
			t.Errorf("%s: %v, nostore %v, previous %q", c.body, err, r.NoStore, r.Previous)
		}
	}
	if string(r.ResponseID) != "" {
		t.Errorf("request_id kept from an earlier body: %q", r.ResponseID)
	}
	for _, bad := range []string{`{"model":"m","previous_response_id":5}`, `{"model":"m","request_id":["x"]}`, `{"model":"m","store":"maybe"}`, `{"model":"m","prompt_cache_key":{}}`} {
		if err := r.Parse(KindResponses, []byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
		// Not read of other APIs' bodies, which the engine judges.
		other := strings.Replace(bad, `{`, `{"messages":[{"role":"user","content":"x"}],`, 1)
		if err := r.Parse(KindChat, []byte(other)); err != nil || len(r.Previous)+len(r.ResponseID)+len(r.CacheKey) > 0 || r.NoStore {
			t.Errorf("chat %s: %v", other, err)
		}
	}
	if err := r.Parse(KindResponses, []byte(`{"model":"m","prompt_cache_key":"conv-1"}`)); err != nil || string(r.CacheKey) != "conv-1" {
		t.Errorf("prompt_cache_key: %v %q", err, r.CacheKey)
	}
	for b, want := range map[string]string{
		` { "model" : "m" }`: ` {"request_id":"resp_1", "model" : "n" }`,
		`{"model":"m"}`:      `{"request_id":"resp_1","model":"n"}`,
	} {
		if err := r.Parse(KindResponses, []byte(b)); err != nil {
			t.Fatal(err)
		}
		if got := string(r.WithModel(r.WithResponseID([]byte(b), "resp_1"), "n")); got != want {
			t.Errorf("%s: got %s, want %s", b, got, want)
		}
	}
	if got := string(r.WithResponseID([]byte("{ }"), "resp_1")); got != `{"request_id":"resp_1" }` {
		t.Errorf("empty object: %s", got)
	}
}

// sameAsChat parses body as kind into r and chat as a chat into c, and
// fails unless both render the same stand-in prompt.
func sameAsChat(t *testing.T, r, c *Request, kind Kind, body, chat string) {
	t.Helper()
	if err := r.Parse(kind, []byte(body)); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	if err := c.Parse(KindChat, []byte(chat)); err != nil {
		t.Fatalf("%s: %v", chat, err)
	}
	if len(r.Prompt) == 0 || string(r.Prompt) != string(c.Prompt) || r.PromptTokens() != c.PromptTokens() || r.Unindexed() != c.Unindexed() {
		t.Errorf("%s rendered\n%q\nwant (as %s)\n%q", body, r.Prompt, chat, c.Prompt)
	}
}

// TestParseResponsesPrompt: a Responses body's prompt renders as the
// chat vLLM makes of it (construct_input_messages) renders: the same
// turns, so a conversation sent through either API keys its blocks
// alike; an input the engine refuses renders no prompt.
func TestParseResponsesPrompt(t *testing.T) {
	r, c := NewRequest(), NewRequest()
	same := func(responses, chat string) {
		t.Helper()
		sameAsChat(t, r, c, KindResponses, responses, chat)
	}
	same(`{"model":"m","input":"Hi"}`, `{"messages":[{"role":"user","content":"Hi"}]}`)
	same(`{"input":"H\u0069","instructions":"Be brief."}`, `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`)
	same(`{"instructions":"","input":"Hi"}`, `{"messages":[{"role":"user","content":"Hi"}]}`)
	// An empty text part is dropped before the texts are joined.
	same(`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":""},"b"]}]}`, `{"messages":[{"role":"user","content":"a\nb"}]}`)
	same(`{"instructions":"S","input":[
		{"role":"user","content":"one"},
		{"type":"message","role":"assistant","id":"msg_1","content":[{"type":"output_text","text":"two","annotations":[]},{"type":"output_text","text":"dropped"}]},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"three"},{"type":"input_text","text":"four"}]},
		{"role":"assistant","content":[]},
		{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]}],"store":false}`,
		`{"messages":[{"role":"system","content":"S"},{"role":"user","content":"one"},{"role":"assistant","content":"two"},
		{"role":"user","content":[{"type":"input_text","text":"three"},{"type":"input_text","text":"four"}]},{"role":"assistant","content":""},
		{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]}]}`)
	// Items that are no message render as their JSON, the same at every
	// turn of the conversation that resends them.
	call := `{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}`
	if err := r.Parse(KindResponses, []byte(`{"input":[{"role":"user","content":"q"},`+call+`]}`)); err != nil {
		t.Fatal(err)
	}
	if want := tokenize.AppendTurn(nil, []byte("function_call"), []byte(call)); !strings.Contains(string(r.Prompt), string(want)) {
		t.Errorf("function call rendered %q, want it to hold %q", r.Prompt, want)
	}
	for _, refused := range []string{`{"model":"m"}`, `{"input":[]}`, `{"input":7}`, `{"input":[{"content":"no role"}]}`, `{"input":[3]}`,
		`{"input":[{"role":"user","content":[{"text":"no type"}]}]}`, `{"input":[{"role":"user","content":5}]}`,
		`{"input":[{"role":"assistant","content":[{"type":"output_text","text":5}]}]}`} {
		if err := r.Parse(KindResponses, []byte(refused)); err != nil || len(r.Prompt) != 0 || r.PromptTokens() != 0 {
			t.Errorf("%s: %v, prompt %q", refused, err, r.Prompt)
		}
	}
}

// TestParsePriorCutShort: a body cut short in a stateless history's
// value is refused as no JSON, not a panic.
func TestParsePriorCutShort(t *testing.T) {
	r := NewRequest()
	for _, body := range []string{`{"previous_response":`, `{"previous_input_messages":[`, `{"previous_input_messages":[ `, `{"previous_response":n`} {
		if err := r.Parse(KindResponses, []byte(body)); err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
}

// TestParseOther: another API's body gives its model alone, whatever else
// it holds, and no output to charge; its JSON is still checked.
func TestParseOther(t *testing.T) {
	r := NewRequest()
	body := `{"input":["a",{"b":[1,2]}],"stream":"maybe","max_tokens":-5,"messages":7,"model":"emb","prompt":null}`
	if err := r.Parse(KindTokenizer, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if string(r.Model) != "emb" || r.Stream || r.MaxTokens != 0 || r.PromptTokens() != 0 {
		t.Errorf("got model %q, stream %v, max_tokens %d, prompt tokens %d", r.Model, r.Stream, r.MaxTokens, r.PromptTokens())
	}
	if got := string(r.WithModel([]byte(body), "other")); got != strings.Replace(body, `"emb"`, `"other"`, 1) {
		t.Errorf("WithModel: %s", got)
	}
	for _, bad := range []string{`{"model":"emb","input":`, `[1]`, `{"model":5}`} {
		if err := r.Parse(KindOther, []byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// FuzzParse checks Parse against a reference built on encoding/json: both
// must accept the same bodies and render the same prompt, and Parse must
// never panic, whatever the body.
func FuzzParse(f *testing.F) {
	f.Add(uint8(KindChat), []byte(`{"model":"m","messages":[{"role":"user","content":"hi\n"}],"stream":true,"max_tokens":5}`))
	f.Add(uint8(KindChat), []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}]}`))
	f.Add(uint8(KindChat), []byte(`{"model":"m","messages":[{"role":"user","content":["a",{"type":"refusal","refusal":null},{"image_url":{"url":"u"}}]}]}`))
	f.Add(uint8(KindCompletion), []byte(`{"model":"m","prompt":["a","b"],"max_completion_tokens":1}`))
	f.Add(uint8(KindCompletion), []byte(`{"model":"m","prompt":[[1,2],[3]],"stream_options":{"include_usage":true}}`))
	f.Add(uint8(KindChat), []byte(`{"model":"m","cache_salt":"t\u00e9n@nt","messages":[{"role":"user","content":"x"}]}`))
	f.Add(uint8(KindCompletion), []byte(`{"cache_salt":null,"model":"m","prompt":"x","cache_salt":"`+strings.Repeat("s", 128)+`"}`))
	f.Add(uint8(KindCompletion), []byte(`{"model":"m","prompt":"x","cache_salt":["s"]}`))
	f.Add(uint8(KindChat), []byte(`{"model":"m","n":3,"messages":[{"role":"user","content":"x"}]}`))
	f.Add(uint8(KindCompletion), []byte(`{"model":"m","prompt":"x","n":0}`))
	f.Add(uint8(KindCompletion), []byte(`{"model":"m","prompt":"abcdefghij","truncate_prompt_tokens":2}`))
	f.Add(uint8(KindCompletion), []byte(`{"model":"m","prompt":[[1,2,3],[4]],"truncate_prompt_tokens":3,"truncation_side":"right"}`))
	f.Add(uint8(KindChat), []byte(`{"model":"m","truncate_prompt_tokens":-1,"truncation_side":"left","messages":[{"role":"user","content":"x"}]}`))
	f.Add(uint8(KindChat), []byte(`{"model":"m","truncate_prompt_tokens":0,"truncation_side":null,"messages":[{"role":"user","content":"x"}]}`))
	f.Add(uint8(KindCompletion), []byte(`{"model":"m","prompt":"abcdefghij","truncate_prompt_tokens":-2,"truncation_side":"middle"}`))
	f.Add(uint8(KindCompletion), []byte(`{"model":"m","prompt":[1,2,3],"truncate_prompt_tokens":"2","truncate_prompt_tokens":2,"truncation_side":5}`))
	f.Add(uint8(KindCompletion), []byte(`{"model":"m","prompt":[1.0,"2",true],"stream":"on","max_tokens":" 1_0.00 ","n":2e0,"truncate_prompt_tokens":"-1"}`))
	f.Add(uint8(KindChat), []byte(`{"model":"m","stream":1,"stream_options":{"include_usage":"No"},"max_completion_tokens":"08","messages":[{"role":"user","content":"x"}]}`))
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := KindChat
		if k&1 == 1 {
			kind = KindCompletion
		}
		var r Request
		err := r.Parse(kind, body)
		if !utf8.Valid(body) {
			if err == nil {
				t.Fatalf("Parse(%q) accepted invalid UTF-8", body)
			}
			return // engines reject it; encoding/json would replace bytes
		}
		ref, refOK := referenceParse(kind, body)
		if err == nil && !refOK && bytes.ContainsFunc(body, isControl) {
			return // sonic.Valid lets raw control bytes through in strings; see Parse
		}
		if (err == nil) != refOK {
			t.Fatalf("Parse(%s) = %v, reference accepts: %v", body, err, refOK)
		}
		if err != nil {
			return
		}
		if string(r.Model) != ref.model || r.Stream != ref.stream || r.MaxTokens != ref.maxTokens || r.Choices != ref.choices || string(r.CacheSalt) != ref.salt ||
			r.IncludeUsage != ref.usage || r.HasIncludeUsage != ref.hasUsage || string(r.Prompt) != ref.prompt || r.TokenIDs != (ref.ids != nil) ||
			!slices.Equal(r.PromptIDs, ref.ids) {
			t.Fatalf("Parse(%s)\n got model %q stream %v max %d n %d usage %v (set %v) prompt %q ids %v\nwant %+v",
				body, r.Model, r.Stream, r.MaxTokens, r.Choices, r.IncludeUsage, r.HasIncludeUsage, r.Prompt, r.PromptIDs, ref)
		}
		if bad := r.TruncationError() != nil; bad != ref.badTruncation {
			t.Fatalf("Parse(%s): vLLM refuses its truncation: %v, want %v", body, bad, ref.badTruncation)
		}
		if bad := r.CacheSaltError() != nil; bad != ref.badSalt {
			t.Fatalf("Parse(%s): vLLM refuses its cache_salt: %v, want %v", body, bad, ref.badSalt)
		}
		if got, want := tokensOf(&r), ref.kept(); !slices.Equal(got, want) || r.PromptTokens() != len(want) {
			t.Fatalf("Parse(%s): kept tokens %v (PromptTokens %d), want %v", body, got, r.PromptTokens(), want)
		}
	})
}

func isControl(r rune) bool { return r < 0x20 }

type reference struct {
	model         string
	stream, usage bool
	hasUsage      bool // include_usage present, null included
	maxTokens     int
	choices       int
	prompt        string
	ids           []uint32
	salt          string
	keep          int // truncate_prompt_tokens; 0 for none, null, -1 or a bad value
	right         bool
	// badTruncation: a truncate_prompt_tokens or truncation_side value
	// vLLM refuses; badSalt: a cache_salt vLLM refuses.
	badTruncation, badSalt bool
	// texts and lists are a list prompt's strings or lists of ids: the
	// engine cuts each on its own.
	texts []string
	lists [][]uint32
}

// kept is the reference's tokens of the prompt the engine keeps: each
// prompt of a batch cut on its own, then concatenated (text before it is
// tokenized).
func (ref reference) kept() []uint32 {
	cut := func(n int) (from, to int) {
		switch {
		case ref.keep <= 0 || ref.keep >= n:
			return 0, n
		case ref.right:
			return 0, ref.keep
		}
		return n - ref.keep, n
	}
	switch {
	case ref.ids != nil && ref.lists != nil && ref.keep > 0:
		ids := []uint32{}
		for _, l := range ref.lists {
			from, to := cut(len(l))
			ids = append(ids, l[from:to]...)
		}
		return ids
	case ref.ids != nil:
		from, to := cut(len(ref.ids))
		return ref.ids[from:to]
	}
	texts := []string{ref.prompt}
	if ref.texts != nil && ref.keep > 0 {
		texts = ref.texts
	}
	var text string
	for _, t := range texts {
		from, to := cut(len(tokenize.Append(nil, []byte(t))))
		text += t[from*tokenize.BytesPerToken : min(to*tokenize.BytesPerToken, len(t))]
	}
	return tokenize.Append([]uint32{}, []byte(text))
}

// referenceParse is Parse's rules restated over encoding/json's generic
// decoding: slow and allocating, but obviously right.
func referenceParse(kind Kind, body []byte) (ref reference, ok bool) {
	if !json.Valid(body) {
		return ref, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var top map[string]any
	if dec.Decode(&top) != nil || top == nil {
		return ref, false
	}
	count := func(v any) (int, bool) {
		if v == nil {
			return -1, true
		}
		i, ok := referenceInt(v)
		return int(i), ok && i >= 0 && i <= math.MaxInt32
	}
	boolean := referenceBool
	// a model absent or null is the pod's; the gateway decides
	if model, present := top["model"]; present && model != nil {
		if ref.model, ok = model.(string); !ok {
			return ref, false
		}
	}
	if ref.stream, ok = boolean(top["stream"]); !ok {
		return ref, false
	}
	maxTokens, ok1 := count(top["max_tokens"])
	maxCompletion, ok2 := -1, true // chat's field alone
	if kind == KindChat {
		maxCompletion, ok2 = count(top["max_completion_tokens"])
	}
	if !ok1 || !ok2 {
		return ref, false
	}
	ref.maxTokens = maxTokens
	if maxCompletion >= 0 {
		ref.maxTokens = maxCompletion
	}
	choices, ok := count(top["n"])
	if !ok || choices == 0 {
		return ref, false
	}
	ref.choices = max(choices, 1)
	if so, present := top["stream_options"]; present && so != nil {
		m, isObj := so.(map[string]any)
		if !isObj {
			return ref, false
		}
		var v any
		v, ref.hasUsage = m["include_usage"]
		if ref.usage, ok = boolean(v); !ok {
			return ref, false
		}
	}
	if salt, present := top["cache_salt"]; present && salt != nil {
		// vLLM's rule
		s, isString := salt.(string)
		ref.salt = s
		ref.badSalt = !isString || s == "" || utf8.RuneCountInString(s) > 128 || strings.ContainsAny(s, "@/\\\x00")
	}
	if v, present := top["truncate_prompt_tokens"]; present && v != nil {
		if i, ok := referenceInt(v); ok && i == -1 {
			ref.keep = 0
		} else if ref.keep, ok = count(v); !ok {
			ref.keep, ref.badTruncation = 0, true
		}
	}
	if v, present := top["truncation_side"]; present && v != nil {
		ref.right = v == "right"
		ref.badTruncation = ref.badTruncation || v != "left" && !ref.right
	}
	if kind == KindChat {
		ref.prompt, ok = referenceChat(top["messages"])
	} else {
		ref.prompt, ref.ids, ref.texts, ref.lists, ok = referencePrompt(top["prompt"])
	}
	return ref, ok
}

// intString is the form of a string pydantic's lax mode reads as an int,
// once trimmed: sign, digits with single underscores between them (leading
// zeros and underscores among them), a tail of a dot and zeros.
var intString = regexp.MustCompile(`^[+-]?(0[0_]*[1-9][0-9]*(_[0-9]+)*|[1-9][0-9]*(_[0-9]+)*|0([0_]*0)?)(\.0+)?$`)

// referenceInt is an engine's int field's reading of a decoded JSON value
// (pydantic, lax mode), within int64.
func referenceInt(v any) (int64, bool) {
	switch v := v.(type) {
	case bool:
		if v {
			return 1, true
		}
		return 0, true
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i, true
		}
		f, err := v.Float64()
		return int64(f), err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<63
	case string:
		t := strings.TrimFunc(v, unicode.IsSpace)
		if !intString.MatchString(t) {
			return 0, false
		}
		t, _, _ = strings.Cut(strings.ReplaceAll(t, "_", ""), ".")
		i, err := strconv.ParseInt(t, 10, 64)
		return i, err == nil
	}
	return 0, false
}

// referenceBool is an engine's bool field's reading of a decoded JSON
// value (pydantic, lax mode); null is false.
func referenceBool(v any) (bool, bool) {
	switch v := v.(type) {
	case nil:
		return false, true
	case bool:
		return v, true
	case json.Number:
		f, err := v.Float64()
		return f == 1, err == nil && (f == 0 || f == 1)
	case string:
		switch strings.ToLower(v) {
		case "0", "f", "n", "no", "off", "false":
			return false, true
		case "1", "t", "y", "yes", "on", "true":
			return true, true
		}
	}
	return false, false
}

func referenceChat(v any) (string, bool) {
	msgs, isList := v.([]any)
	if !isList || len(msgs) == 0 {
		return "", false
	}
	var b []byte
	for _, m := range msgs {
		msg, isObj := m.(map[string]any)
		if !isObj {
			return "", false
		}
		role, isStr := msg["role"].(string)
		if !isStr {
			return "", false
		}
		var content []byte
		switch c := msg["content"].(type) {
		case nil:
		case string:
			content = []byte(c)
		case []any:
			texts := 0
			for _, p := range c {
				text, isStr := p.(string)
				part, isObj := p.(map[string]any)
				if !isStr && !isObj {
					return "", false
				}
				if isObj {
					typ := part["type"]
					if typ == nil {
						media := false
						for _, k := range []string{"image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url", "input_audio", "video_url", "tool_reference"} {
							_, has := part[k]
							media = media || has
						}
						if !media {
							return "", false
						}
						continue
					}
					name, isStr := typ.(string)
					if !isStr {
						return "", false
					}
					switch name {
					case "text", "input_text", "output_text":
					case "refusal", "thinking":
					default:
						continue
					}
					if name == "input_text" || name == "output_text" {
						name = "text"
					}
					if part[name] == nil {
						continue
					}
					if text, isStr = part[name].(string); !isStr {
						return "", false
					}
				}
				if texts > 0 {
					content = append(content, '\n')
				}
				texts++
				content = append(content, text...)
			}
		default:
			return "", false
		}
		b = tokenize.AppendTurn(b, []byte(role), content)
	}
	return string(b) + tokenize.GenerationPrompt, true
}

func referencePrompt(v any) (text string, ids []uint32, texts []string, lists [][]uint32, ok bool) {
	id := func(v any) (uint32, bool) {
		i, ok := referenceInt(v)
		return uint32(i), ok && i >= 0 && i <= math.MaxUint32
	}
	switch p := v.(type) {
	case string:
		return p, nil, nil, nil, true
	case []any:
		if len(p) == 0 {
			return "", nil, nil, nil, false
		}
		// pydantic's smart union: strings only are texts, lists only
		// lists of ids, anything else one prompt of ids.
		form := p[0]
		for _, e := range p {
			if _, isStr := e.(string); !isStr {
				if _, isStr := form.(string); isStr {
					form = 0
				}
			}
		}
		ids = []uint32{}
		for _, e := range p {
			switch form.(type) {
			case string:
				s, isStr := e.(string)
				if !isStr {
					return "", nil, nil, nil, false
				}
				text += s
				texts = append(texts, s)
			case []any:
				inner, isList := e.([]any)
				if !isList {
					return "", nil, nil, nil, false
				}
				list := []uint32{}
				for _, x := range inner {
					i, ok := id(x)
					if !ok {
						return "", nil, nil, nil, false
					}
					list = append(list, i)
				}
				ids = append(ids, list...)
				lists = append(lists, list)
			default:
				i, ok := id(e)
				if !ok {
					return "", nil, nil, nil, false
				}
				ids = append(ids, i)
			}
		}
		if _, isStr := form.(string); isStr {
			return text, nil, texts, nil, true
		}
		return "", ids, nil, lists, true
	}
	return "", nil, nil, nil, false
}

// TestInvalidUTF8 checks that Parse refuses every malformed sequence,
// wherever it lies relative to the validator's SIMD blocks, and accepts
// well-formed multi-byte text there.
func TestInvalidUTF8(t *testing.T) {
	for _, seq := range []string{"é", "€", "😀", "\xff", "\xc3", "\xe2\x82", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xf0\x9f\x98"} {
		for at := 0; at < 80; at++ {
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", at) + seq + `"}]}`)
			var r Request
			err := r.Parse(KindChat, body)
			if valid := utf8.ValidString(seq); (err == nil) != valid {
				t.Fatalf("Parse(%q) = %v, want valid UTF-8: %v", body, err, valid)
			}
		}
	}
}

// TestKeySeed: plain requests keep the model's seed; a salt gives the
// index's salted seed; non-text parts give a seed no pod's blocks have,
// one per media content.
func TestKeySeed(t *testing.T) {
	model := radix.Seed("m")
	seed := func(body string) (uint64, bool) {
		t.Helper()
		var r Request
		if err := r.Parse(KindChat, []byte(body)); err != nil {
			t.Fatal(err)
		}
		return r.KeySeed(model), r.Unindexed()
	}
	msgs := func(content string) string { return `"messages":[{"role":"user","content":` + content + `}]` }
	text := msgs(`"hi"`)
	image := func(url string) string {
		return msgs(`[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"` + url + `"}}]`)
	}
	f := func(body string, want uint64, wantUnindexed bool) {
		t.Helper()
		got, unindexed := seed(body)
		if got != want || unindexed != wantUnindexed {
			t.Fatalf("%s: seed %x unindexed %v, want %x %v", body, got, unindexed, want, wantUnindexed)
		}
	}
	f(`{"model":"m",`+text+`}`, model, false)
	f(`{"model":"m","cache_salt":null,`+text+`}`, model, false)
	f(`{"model":"m","cache_salt":"s1",`+text+`}`, radix.SeedWith(model, "", "s1"), false)
	f(`{"model":"m","cache_salt":"s\u0031",`+text+`}`, radix.SeedWith(model, "", "s1"), false)

	a, _ := seed(`{"model":"m",` + image("a.png") + `}`)
	b, _ := seed(`{"model":"m",` + image("b.png") + `}`)
	as, _ := seed(`{"model":"m","cache_salt":"s1",` + image("a.png") + `}`)
	f(`{"model":"m",`+image("a.png")+`}`, a, true)
	for _, s := range []uint64{model, radix.SeedWith(model, "", "s1"), b, as} {
		if a == s {
			t.Fatalf("an image request has the seed %x of another request", a)
		}
	}
}

func TestWithModel(t *testing.T) {
	f := func(body, name, want string) {
		t.Helper()
		var r Request
		if err := r.Parse(KindCompletion, []byte(body)); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		client := string(r.Model)
		got := r.WithModel([]byte(body), name)
		if string(got) != want {
			t.Errorf("WithModel(%s, %q) = %s, want %s", body, name, got, want)
		}
		// A second rewrite (a fallback after an alias) starts from the first's.
		wantAgain := strings.Replace(want, string(AppendJSONString(nil, name)), `"z"`, 1)
		if again := r.WithModel(got, "z"); string(again) != wantAgain {
			t.Errorf("second WithModel = %s, want %s", again, wantAgain)
		}
		if string(r.Model) != client {
			t.Errorf("Model = %q, want the client's %q", r.Model, client)
		}
	}
	// Key order, spacing, escapes and the word "model" elsewhere are kept.
	f(`{"prompt":"model","model":"a","max_tokens":3}`, "base", `{"prompt":"model","model":"base","max_tokens":3}`)
	f(`{ "model" : "a\u0062" , "prompt":"<b>"}`, "m-2", `{ "model" : "m-2" , "prompt":"<b>"}`)
	f(`{"model":"a","prompt":"x"}`, `q"u`, `{"model":"q\"u","prompt":"x"}`)
}

// TestParseChatGoldens: every request of engines/chat's goldens, which
// vLLM renders, is accepted, and as text only (none has media), so the
// gateway tokenizes it rather than routing it without the index.
func TestParseChatGoldens(t *testing.T) {
	b, err := os.ReadFile("../../engines/chat/testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Model, Name string
		Request     json.RawMessage
	}
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		var r Request
		if err := r.Parse(KindChat, c.Request); err != nil || r.Unindexed() {
			t.Errorf("%s/%s: Parse = %v, unindexed %v; vLLM renders it", c.Model, c.Name, err, r.Unindexed())
		}
	}
}

// TestParseChoices: "n" is read as the number of choices, 1 when absent
// or null.
func TestParseChoices(t *testing.T) {
	for body, want := range map[string]int{
		`{"model":"m","prompt":"x"}`:          1,
		`{"model":"m","prompt":"x","n":null}`: 1,
		`{"model":"m","prompt":"x","n":1}`:    1,
		`{"model":"m","prompt":"x","n":4}`:    4,
	} {
		r := NewRequest()
		if err := r.Parse(KindCompletion, []byte(body)); err != nil || r.Choices != want {
			t.Errorf("Parse(%s): n %d, %v; want %d", body, r.Choices, err, want)
		}
	}
}

// TestOutputBudget: a completion that leaves max_tokens out, or sends it
// null, gets its engine's default (16 on vLLM and SGLang, unknown on
// TensorRT-LLM); one that gives it, and a chat without one (the
// context's rest), keep what they say. A chat's max_completion_tokens 0
// is its budget on vLLM (which refuses it), but falls through to
// max_tokens on SGLang (engines.Kind.ReadsMaxCompletionTokens).
func TestOutputBudget(t *testing.T) {
	f := func(kind Kind, body string, engine engines.Kind, want int) {
		t.Helper()
		r := NewRequest()
		if err := r.Parse(kind, []byte(body)); err != nil {
			t.Fatalf("Parse(%s): %v", body, err)
		}
		r.Engine = engine
		if got := r.OutputBudget(); got != want {
			t.Errorf("%s on %q: budget %d, want %d", body, engine, got, want)
		}
	}
	const absent = `{"model":"m","prompt":"x"}`
	f(KindCompletion, absent, "", 16)
	f(KindCompletion, absent, engines.VLLM, 16)
	f(KindCompletion, absent, engines.SGLang, 16)
	f(KindCompletion, absent, engines.TRTLLM, -1)
	f(KindCompletion, `{"model":"m","prompt":"x","max_tokens":null}`, engines.VLLM, 16)
	f(KindCompletion, `{"model":"m","prompt":"x","max_tokens":null}`, engines.TRTLLM, -1)
	f(KindCompletion, `{"model":"m","prompt":"x","max_tokens":200}`, engines.VLLM, 200)
	f(KindCompletion, `{"model":"m","prompt":"x","max_completion_tokens":200}`, engines.VLLM, 16)
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, engines.VLLM, -1)
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":7}`, engines.SGLang, 7)
	const zero = `{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":0`
	f(KindChat, zero+`,"max_tokens":9}`, engines.VLLM, 0)
	f(KindChat, zero+`,"max_tokens":9}`, engines.SGLang, 9)
	f(KindChat, zero+`,"max_tokens":null}`, engines.SGLang, -1)
	f(KindChat, zero+`}`, engines.SGLang, -1)
}

// TestParseTruncation: a prompt is counted and tokenized as the engine
// keeps it under truncate_prompt_tokens: its last k tokens, or its first
// with truncation_side "right"; null, -1 (the context, unknown here) and
// 0 keep it whole.
func TestParseTruncation(t *testing.T) {
	f := func(kind Kind, body string, want []uint32) {
		t.Helper()
		r := NewRequest()
		if err := r.Parse(kind, []byte(body)); err != nil {
			t.Fatalf("Parse(%s): %v", body, err)
		}
		if got := tokensOf(r); !slices.Equal(got, want) || r.PromptTokens() != len(want) {
			t.Fatalf("Parse(%s): tokens %v (PromptTokens %d), want %v", body, got, r.PromptTokens(), want)
		}
	}
	ids := func(s string) []uint32 { return tokenize.Append(nil, []byte(s)) }
	f(KindCompletion, `{"model":"m","prompt":"aaaabbbbccccdd","truncate_prompt_tokens":2}`, ids("ccccdd"))
	f(KindCompletion, `{"model":"m","prompt":"aaaabbbbccccdd","truncate_prompt_tokens":2,"truncation_side":"left"}`, ids("ccccdd"))
	f(KindCompletion, `{"model":"m","prompt":"aaaabbbbccccdd","truncate_prompt_tokens":2,"truncation_side":"righ\u0074"}`, ids("aaaabbbb"))
	// vLLM cuts each prompt of a batch on its own.
	f(KindCompletion, `{"truncate_prompt_tokens":2,"model":"m","prompt":["aaaa","bbbb","cc"]}`, ids("aaaabbbbcc"))
	f(KindCompletion, `{"truncate_prompt_tokens":2,"model":"m","prompt":["aaaabbbbcccc","ddddeeeeffff"]}`, ids("bbbbcccceeeeffff"))
	f(KindCompletion, `{"model":"m","prompt":["`+strings.Repeat("p", 800)+`","`+strings.Repeat("q", 80)+`"],"truncate_prompt_tokens":64}`,
		ids(strings.Repeat("p", 256)+strings.Repeat("q", 80)))
	f(KindCompletion, `{"model":"m","prompt":"aaaabbbb","truncate_prompt_tokens":9}`, ids("aaaabbbb"))
	for _, none := range []string{"null", "-1", "0"} {
		f(KindCompletion, `{"model":"m","prompt":"aaaabbbb","truncate_prompt_tokens":`+none+`,"truncation_side":"right"}`, ids("aaaabbbb"))
	}
	f(KindCompletion, `{"model":"m","prompt":[1,2,3,4,5],"truncate_prompt_tokens":3}`, []uint32{3, 4, 5})
	f(KindCompletion, `{"model":"m","prompt":[[1,2],[3,4,5]],"truncate_prompt_tokens":3,"truncation_side":"right"}`, []uint32{1, 2, 3, 4, 5})
	f(KindCompletion, `{"model":"m","prompt":[[1,2,3,4],[5,6,7]],"truncate_prompt_tokens":2}`, []uint32{3, 4, 6, 7})
	chat := turn("user", "hello there") + tokenize.GenerationPrompt
	all := ids(chat)
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":"hello there"}],"truncate_prompt_tokens":4}`, all[len(all)-4:])
	// The last value of a repeated key wins.
	f(KindCompletion, `{"model":"m","prompt":[1,2,3],"truncate_prompt_tokens":1,"truncate_prompt_tokens":null,"truncation_side":"right","truncation_side":"left"}`, []uint32{1, 2, 3})
}

// TestWithUsage: a stream that gets no usage from any engine is asked
// for it, in place of its stream_options or first in the object, and a
// later WithModel still finds the model.
func TestWithUsage(t *testing.T) {
	f := func(kind Kind, body string, hidden bool, want string) {
		t.Helper()
		var r Request
		if err := r.Parse(kind, []byte(body)); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if r.UsageHidden() != hidden {
			t.Fatalf("%s: UsageHidden %v, want %v", body, !hidden, hidden)
		}
		if !hidden {
			return
		}
		if got := string(r.WithModel(r.WithUsage([]byte(body)), "n")); got != want {
			t.Errorf("%s: WithUsage, then WithModel: %s, want %s", body, got, want)
		}
	}
	const on = `{"include_usage":true}`
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`, true,
		`{"stream_options":`+on+`,"model":"n","messages":[{"role":"user","content":"x"}],"stream":true}`)
	f(KindCompletion, `{"stream_options" : null ,"model":"m","prompt":"x","stream":true}`, true,
		`{"stream_options" : `+on+` ,"model":"n","prompt":"x","stream":true}`)
	f(KindCompletion, `{"model":"m","stream_options":{"include_usage":false,"continuous_usage_stats":false},"prompt":"x","stream":true}`, true,
		`{"model":"n","stream_options":`+on+`,"prompt":"x","stream":true}`)
	// A repeated key: the last counts, as in Python's json.
	f(KindCompletion, `{"stream_options":{},"prompt":"x","stream":true,"stream_options":{"include_usage":null},"model":"m"}`, true,
		`{"stream_options":{},"prompt":"x","stream":true,"stream_options":`+on+`,"model":"n"}`)

	// Usage on some engine, or no stream: as it came.
	f(KindChat, `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`, false, "")
	f(KindCompletion, `{"model":"m","prompt":"x","stream":true,"stream_options":{}}`, false, "")
	f(KindCompletion, `{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":"yes"}}`, false, "")
	f(KindCompletion, `{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":7}}`, false, "")
	f(KindCompletion, `{"model":"m","prompt":"x"}`, false, "")
	f(KindResponses, `{"model":"m","input":"x","stream":true}`, false, "")
}

// TestPromptEmbeds: a completion's prompt_embeds stand for its prompt
// (or add to it), and make it Unindexed, its seed apart from the text's.
func TestPromptEmbeds(t *testing.T) {
	var plain, embeds Request
	if err := plain.Parse(KindCompletion, []byte(`{"prompt":"a"}`)); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`{"prompt_embeds":"QUJD"}`, `{"prompt":"a","prompt_embeds":["QUJD"]}`} {
		if err := embeds.Parse(KindCompletion, []byte(body)); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if !embeds.Unindexed() || embeds.KeySeed(1) == plain.KeySeed(1) {
			t.Errorf("%s: Unindexed %v, seed %x as the text's %x", body, embeds.Unindexed(), embeds.KeySeed(1), plain.KeySeed(1))
		}
	}
	for _, body := range []string{`{"prompt_embeds":null}`, `{"prompt_embeds":[ ]}`} {
		if err := embeds.Parse(KindCompletion, []byte(body)); err == nil || err.(*Error).Param != "prompt" {
			t.Errorf("%s: %v, want prompt's 400", body, err)
		}
	}
}

// tokensOf is the ids of the prompt the engine keeps, as PromptTokens
// counts them: PromptIDsKept, or the shared tokenizer's of PromptKept.
func tokensOf(r *Request) []uint32 {
	if r.TokenIDs {
		return r.PromptIDsKept()
	}
	return tokenize.Append(nil, r.PromptKept())
}

// TestRecycleKeepsBuffers: a recycled Request keeps the prompt buffer a
// usual request grew, empty, and drops one a huge request grew past
// maxKeptPrompt, which would otherwise stay with it for good.
func TestRecycleKeepsBuffers(t *testing.T) {
	r := NewRequest()
	for _, size := range []int{8 << 10, 2 * maxKeptPrompt} {
		if err := r.Parse(KindChat, chatBody(size)); err != nil {
			t.Fatal(err)
		}
		r.Recycle()
		if kept := cap(r.Prompt) > 0; kept != (size < maxKeptPrompt) || len(r.Prompt) != 0 || len(r.Model) != 0 {
			t.Errorf("a %d-byte request recycled: prompt %d of %d bytes, model %q", size, len(r.Prompt), cap(r.Prompt), r.Model)
		}
	}
}
