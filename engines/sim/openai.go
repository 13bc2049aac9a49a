package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"pdlb/engines"
	"pdlb/engines/tokenize"
)

// genRequest is the part of an OpenAI chat or completions body the sim
// reads. Fields it does not know are ignored, as vLLM ignores them (with a
// warning).
type genRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *laxInt         `json:"max_tokens"`
	MaxCompletionTokens *laxInt         `json:"max_completion_tokens"`
	MinTokens           *laxInt         `json:"min_tokens"` // vLLM's
	// N is the answers asked for each prompt (null: 1); Temperature
	// decides whether vLLM samples them greedily (see choices).
	N             *laxInt        `json:"n"`
	Temperature   *laxFloat      `json:"temperature"`
	Stream        laxBool        `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
	// Echo is a completion's echo (vLLM's: see echoTexts).
	Echo laxBool `json:"echo"`
	// RequestID is vLLM's request_id extra parameter; RID is SGLang's.
	RequestID string `json:"request_id"`
	RID       string `json:"rid"`
	// AddGenerationPrompt is /tokenize's (default true).
	AddGenerationPrompt *laxBool `json:"add_generation_prompt"`
	// AddSpecialTokens is vLLM's completion field (default true): whether
	// the tokenizer adds its BOS and other special tokens to the prompt.
	AddSpecialTokens *laxBool `json:"add_special_tokens"`
	// CacheSalt is the engines' cache_salt as sent (nil: absent); see
	// cacheSalt.
	CacheSalt json.RawMessage `json:"cache_salt"`
	// TruncatePromptTokens and TruncationSide are vLLM's: keep only the
	// last (truncation_side "right": the first) so many prompt tokens;
	// see truncation.
	TruncatePromptTokens *laxInt `json:"truncate_prompt_tokens"`
	TruncationSide       *string `json:"truncation_side"`
	// PD fields of each engine; pd.go reads them.
	KVTransferParams    *kvTransferParams `json:"kv_transfer_params"` // vLLM
	BootstrapHost       perPrompt[string] `json:"bootstrap_host"`     // SGLang
	BootstrapPort       perPrompt[laxInt] `json:"bootstrap_port"`
	BootstrapRoom       perPrompt[laxInt] `json:"bootstrap_room"`
	DisaggregatedParams *disaggParams     `json:"disaggregated_params"` // TensorRT-LLM
	// PromptTokenIDs is TensorRT-LLM's chat field that replaces the
	// messages' tokenization (a generation leg's copy of the context
	// response's prompt_token_ids).
	PromptTokenIDs []uint32 `json:"prompt_token_ids"`
}

// streamOptions is stream_options; an unset include_usage takes the
// engine's default (see the pod's stream answer).
type streamOptions struct {
	IncludeUsage         nullableBool `json:"include_usage"`
	ContinuousUsageStats laxBool      `json:"continuous_usage_stats"`
}

// nullableBool tells an absent field (set false) from an explicit null
// (set, false): pydantic fills Optional[bool] defaults only for absent
// keys, and the engines' truthiness checks read None as false.
type nullableBool struct{ set, val bool }

func (b *nullableBool) UnmarshalJSON(d []byte) error {
	var v laxBool
	err := v.UnmarshalJSON(d)
	b.set, b.val = true, bool(v)
	return err
}

// laxInt is an int request field, read as the engines' pydantic v2 lax
// mode reads one: 8, 8.0, 1e3, true and "8" are all ints. null leaves it
// unset.
type laxInt int64

func (v *laxInt) UnmarshalJSON(d []byte) error {
	return readLax(d, v, reflect.TypeFor[int](), func(b bool) laxInt { return laxInt(boolInt(b)) },
		func(s string) (laxInt, bool) { n, ok := engines.LaxIntString(s); return laxInt(n), ok },
		func(s string) (laxInt, bool) { n, ok := engines.LaxIntNumber(s); return laxInt(n), ok })
}

// laxFloat is a float request field, read as the engines' pydantic v2
// lax mode reads one: a number, a bool, or a string holding a number
// between white space. null leaves it unset.
type laxFloat float64

func (v *laxFloat) UnmarshalJSON(d []byte) error {
	num := func(s string) (laxFloat, bool) {
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		return laxFloat(f), err == nil
	}
	return readLax(d, v, reflect.TypeFor[float64](), func(b bool) laxFloat { return laxFloat(boolInt(b)) }, num, num)
}

// laxBool is a bool request field, read as the engines' pydantic v2 lax
// mode reads one: true, 1, 1.0, "yes", "on" and "true" are all true. null
// leaves it unset (false).
type laxBool bool

func (b *laxBool) UnmarshalJSON(d []byte) error {
	return readLax(d, b, reflect.TypeFor[bool](), func(b bool) laxBool { return laxBool(b) },
		func(s string) (laxBool, bool) { v, ok := engines.LaxBoolString(s); return laxBool(v), ok },
		func(s string) (laxBool, bool) { v, ok := engines.LaxBoolNumber(s); return laxBool(v), ok })
}

// readLax reads d, a JSON value, into *v as pydantic v2's lax mode reads
// a field of type want: null leaves it unset, true and false, a string
// and a number each by their rule (the string unquoted).
func readLax[T any](d []byte, v *T, want reflect.Type, fromBool func(bool) T, fromString, fromNumber func(string) (T, bool)) error {
	var (
		x  T
		ok bool
	)
	switch d[0] {
	case 'n':
		return nil
	case 't', 'f':
		x, ok = fromBool(d[0] == 't'), true
	case '"':
		var s string
		_ = json.Unmarshal(d, &s) // a string the decoder checked
		x, ok = fromString(s)
	default:
		x, ok = fromNumber(string(d))
	}
	if !ok {
		return &json.UnmarshalTypeError{Value: string(d), Type: want}
	}
	*v = x
	return nil
}

// boolInt is b as the engines' lax int reads it.
func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// perPrompt is a field that holds one value for every prompt of a
// request, or a list of one per prompt (SGLang's bootstrap fields). null
// leaves it, or a list's element, unset.
type perPrompt[T any] struct {
	one    *T
	list   []*T
	isList bool
}

func (f *perPrompt[T]) UnmarshalJSON(d []byte) error {
	switch d[0] {
	case 'n':
		return nil
	case '[':
		f.isList = true
		return json.Unmarshal(d, &f.list)
	}
	f.one = new(T)
	return json.Unmarshal(d, f.one)
}

// at is prompt i's value (nil: unset); false when a list has none for it.
func (f *perPrompt[T]) at(i int) (*T, bool) {
	switch {
	case !f.isList:
		return f.one, true
	case i < len(f.list):
		return f.list[i], true
	}
	return nil, false
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// partText is the text vLLM keeps of a content part (chat_utils.py): a
// bare string; the "text" of a text, input_text or output_text part, the
// "refusal" of a refusal, the "thinking" of a thinking part. ok is false
// for a part without text (null, absent or empty: vLLM drops an empty
// text before it joins them) and for any other part.
func partText(raw json.RawMessage) (text string, ok bool) {
	if json.Unmarshal(raw, &text) == nil {
		return text, text != ""
	}
	var p struct {
		Type     string  `json:"type"`
		Text     *string `json:"text"`
		Refusal  *string `json:"refusal"`
		Thinking *string `json:"thinking"`
	}
	if json.Unmarshal(raw, &p) != nil {
		return "", false
	}
	var t *string
	switch p.Type {
	case "text", "input_text", "output_text":
		t = p.Text
	case "refusal":
		t = p.Refusal
	case "thinking":
		t = p.Thinking
	}
	if t == nil {
		return "", false
	}
	return *t, *t != ""
}

var errBadRequest = errors.New("bad request")

// checkStreamOptions refuses stream_options without stream as vLLM's
// validate_stream_options does: Python truthiness, so only a non-empty
// object counts as given, and only a true stream as streaming.
func checkStreamOptions(body []byte, stream bool) error {
	raw, ok, err := engines.Field(body, "stream_options")
	if err != nil || !ok || stream {
		return nil
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || len(m) == 0 {
		return nil
	}
	return badRequest("Stream options can only be defined when `stream=True`.")
}

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadRequest, fmt.Sprintf(format, args...))
}

// cacheSalt returns the salt of r's prompts ("" for none), refused as
// engine k refuses it (engines.Kind.CacheSaltFault), in its words; chat
// says r is a chat completion.
func (r *genRequest) cacheSalt(k engines.Kind, chat bool) (string, error) {
	form, s := saltForm(r.CacheSalt)
	switch k.CacheSaltFault(chat, form, s) {
	case engines.SaltTaken:
		return s, nil
	case engines.SaltWrongType:
		if k != engines.VLLM {
			return "", badRequest("cache_salt: Input should be a valid string")
		}
		return "", badRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
	case engines.SaltEmpty, engines.SaltBlank:
		return "", badRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
	case engines.SaltBadChars:
		return "", badRequest("Parameter 'cache_salt' must be at most %d characters and must not contain '@', '/', '\\\\', or NUL.", engines.MaxCacheSalt)
	case engines.SaltListFails:
		return "", serverFault("Value of cache_salt must be a string, but got list")
	default: // engines.SaltNoField
		return "", badRequest("cache_salt: Extra inputs are not permitted")
	}
}

// saltForm is the form of raw, a request's cache_salt as sent (nil:
// absent), and its text when it is a string.
func saltForm(raw json.RawMessage) (engines.SaltForm, string) {
	var s string
	var list []json.RawMessage
	switch {
	case raw == nil:
		return engines.SaltAbsent, ""
	case string(raw) == "null":
		return engines.SaltNull, ""
	case json.Unmarshal(raw, &s) == nil:
		return engines.SaltString, s
	case json.Unmarshal(raw, &list) != nil:
		return engines.SaltOther, ""
	case len(list) == 0:
		return engines.SaltEmptyList, ""
	}
	for _, e := range list {
		if e[0] != '"' {
			return engines.SaltOther, ""
		}
	}
	return engines.SaltList, ""
}

// serverFault is a request the engine takes and its server then fails
// with a 500, saying why.
type serverFault string

func (f serverFault) Error() string { return string(f) }

// vLLM's bounds on n (vllm/sampling_params.py): at most
// VLLM_MAX_N_SEQUENCES, as it defaults; and a temperature below
// samplingEps samples greedily.
const (
	maxChoices  = 16384
	samplingEps = 1e-5
)

// choices is the number of answers engine k gives each prompt of r (n),
// refused as vLLM's SamplingParams refuses it: below 1, above
// maxChoices, or above 1 when greedy (a temperature below samplingEps;
// without one, 1.0). SGLang samples greedily n times, and neither it nor
// TensorRT-LLM bounds n; the sim keeps vLLM's bound on every engine.
func (r *genRequest) choices(k engines.Kind) (int, error) {
	if r.N == nil {
		return 1, nil
	}
	switch n := int(*r.N); {
	case n < 1:
		return 0, badRequest("n must be at least 1, got %d.", n)
	case n > maxChoices:
		return 0, badRequest("n must be at most %d, got %d. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable.", maxChoices, n)
	case n > 1 && k == engines.VLLM && r.Temperature != nil && *r.Temperature < samplingEps:
		return 0, badRequest("n must be 1 when using greedy sampling, got %d.", n)
	default:
		return n, nil
	}
}

// completionBudget refuses a completion's max_tokens as SGLang's
// CompletionRequest does: it types the field int = 16, so null is not
// absent there, and checks that it is positive. The other engines' nulls
// are absent (setMaxTokens); body is the request's.
func (r *genRequest) completionBudget(k engines.Kind, body []byte) error {
	if k != engines.SGLang {
		return nil
	}
	if v, ok, _ := engines.Field(body, "max_tokens"); ok && v[0] == 'n' {
		return badRequest("max_tokens: Input should be a valid integer")
	}
	if r.MaxTokens != nil && *r.MaxTokens < 1 {
		return badRequest("max_tokens: Value error, max_tokens must be positive")
	}
	return nil
}

// echoTexts is the text vLLM's completion echo puts before the answers
// of each of r's prompts: the prompt as sent. vLLM detokenizes a prompt of
// token ids; the sim, whose ids may be the stand-in's, refuses to.
func (r *genRequest) echoTexts() ([]string, error) {
	raws, err := completionPrompts(r.Prompt)
	if err != nil {
		return nil, err
	}
	texts := make([]string, len(raws))
	for i, raw := range raws {
		s, ok := promptString(raw)
		if !ok {
			return nil, badRequest("echo of prompt %d, token ids: the sim echoes string prompts only", i)
		}
		texts[i] = s
	}
	return texts, nil
}

// outputBudget is the output budget engine k holds r to before it looks
// at the context: max_completion_tokens (a chat's alone), else
// max_tokens, else a completion's default (engines.Kind
// CompletionMaxTokens); -1 for none, the context's rest.
func (r *genRequest) outputBudget(k engines.Kind, chat bool) int {
	switch {
	case r.MaxCompletionTokens != nil:
		return int(*r.MaxCompletionTokens)
	case r.MaxTokens != nil:
		return int(*r.MaxTokens)
	case chat:
		return -1
	}
	return k.CompletionMaxTokens()
}

// truncation returns how many tokens engine k keeps of a prompt it cuts
// (-1: all; Kind.TruncatesPrompt says which prompts it cuts) and whether
// it keeps the first ones rather than the last, refusing what the engine
// refuses. SGLang has neither field and ignores both.
func (r *genRequest) truncation(k engines.Kind, body []byte, maxModelLen int, chat bool) (keep int, right bool, err error) {
	switch k {
	case engines.VLLM:
		return r.vllmTruncation(maxModelLen - max(r.outputBudget(k, chat), 0))
	case engines.TRTLLM:
		return r.trtTruncation(body)
	}
	return -1, false, nil
}

// trtTruncation is TensorRT-LLM's: truncate_prompt_tokens is null or at
// least 1 (its protocol's Field(ge=1)), and the HF tokenizer it loads
// truncates on the left; its request models forbid unknown fields, so
// truncation_side, even null, is refused.
func (r *genRequest) trtTruncation(body []byte) (keep int, right bool, err error) {
	if _, ok, _ := engines.Field(body, "truncation_side"); ok {
		return 0, false, badRequest("truncation_side: Extra inputs are not permitted")
	}
	switch k := r.TruncatePromptTokens; {
	case k == nil:
		return -1, false, nil
	case *k < 1:
		return 0, false, badRequest("truncate_prompt_tokens: Input should be greater than or equal to 1")
	default:
		return int(*k), false, nil
	}
}

// vllmTruncation is vLLM's: truncate_prompt_tokens -1 is input, the
// context less the output budget (TokenizeParams.max_input_tokens); no
// value may exceed that. Without truncation_side vLLM cuts on the
// tokenizer's side, which it sets to the left for generative models.
func (r *genRequest) vllmTruncation(input int) (keep int, right bool, err error) {
	if s := r.TruncationSide; s != nil && *s != "left" && *s != "right" {
		return 0, false, badRequest("truncation_side must be 'left' or 'right', got %q.", *s)
	}
	right = r.TruncationSide != nil && *r.TruncationSide == "right"
	if r.TruncatePromptTokens == nil {
		return -1, right, nil
	}
	k := int(*r.TruncatePromptTokens)
	switch {
	case k < -1:
		return 0, false, badRequest("truncate_prompt_tokens must be greater than or equal to -1, got %d.", k)
	case k == -1:
		return input, right, nil
	case k > input:
		return 0, false, badRequest("truncate_prompt_tokens=%d cannot be greater than max_model_len - max_tokens = %d. Please request a smaller truncation size.", k, input)
	}
	return k, right, nil
}

// renderChat renders messages with the chat template the gateway uses
// (engines/tokenize), so both sides compute the same tokens. A list
// content renders as vLLM joins it: its text parts' texts joined by "\n"
// (partText); other parts (images) add nothing.
func renderChat(dst []byte, msgs []chatMessage, generationPrompt bool) ([]byte, error) {
	if len(msgs) == 0 {
		return dst, badRequest("messages must not be empty")
	}
	for i, m := range msgs {
		c := bytes.TrimSpace(m.Content)
		switch {
		case len(c) == 0 || string(c) == "null":
			dst = tokenize.AppendTurn(dst, []byte(m.Role), nil)
		case c[0] == '"':
			var s string
			if err := json.Unmarshal(c, &s); err != nil {
				return dst, badRequest("messages[%d].content: %v", i, err)
			}
			dst = tokenize.AppendTurn(dst, []byte(m.Role), []byte(s))
		case c[0] == '[':
			var parts []json.RawMessage
			if err := json.Unmarshal(c, &parts); err != nil {
				return dst, badRequest("messages[%d].content: %v", i, err)
			}
			dst = tokenize.AppendTurnOpen(dst, []byte(m.Role))
			texts := 0
			for _, p := range parts {
				text, ok := partText(p)
				if !ok {
					continue
				}
				if texts > 0 {
					dst = append(dst, '\n')
				}
				texts++
				dst = append(dst, text...)
			}
			dst = tokenize.AppendTurnClose(dst)
		default:
			return dst, badRequest("messages[%d].content must be a string or a list of parts", i)
		}
	}
	if generationPrompt {
		dst = append(dst, tokenize.GenerationPrompt...)
	}
	return dst, nil
}

// completionPrompts splits a completions prompt into the prompts the
// engine runs, each as its own request: a string or a list of token ids
// is one; a list of strings or of token-id lists (a batch) is one each.
// The engines' pydantic model reads a list as the member of its union
// that takes it most exactly: all strings is a list of strings even where
// each would read as an int, all lists a list of lists of ints, and any
// other list can only be ids (promptTokens reads them, "1" and 1.0 too).
func completionPrompts(raw json.RawMessage) ([]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' {
		return []json.RawMessage{raw}, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, badRequest("prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids")
	}
	if len(list) == 0 {
		return nil, badRequest("prompt must not be empty")
	}
	form := func(e json.RawMessage) byte { return bytes.TrimSpace(e)[0] } // Unmarshal left no empty element
	for _, e := range list {
		if f := form(e); f != form(list[0]) || f != '"' && f != '[' {
			return []json.RawMessage{raw}, nil
		}
	}
	return list, nil
}

// promptTokens returns the tokens of one completions prompt: a string, in
// the stand-in's tokens (text says so), or a list of token ids, each read
// as the engines' list[int] with ids at least 0 reads it (tokenID).
func promptTokens(dst []uint32, raw json.RawMessage) (ids []uint32, text bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return dst, false, badRequest("prompt is required")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return dst, true, badRequest("prompt: %v", err)
		}
		return tokenize.Append(dst, []byte(s)), true, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return dst, false, badRequest("prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids")
	}
	for i, e := range list {
		id, ok := tokenID(e)
		if !ok {
			return dst, false, badRequest("prompt[%d] = %s is not a token id, and a batch is all strings or all lists of token ids", i, e)
		}
		dst = append(dst, id)
	}
	return dst, false, nil
}

// tokenID reads one prompt token id: an int as pydantic's lax mode reads
// one (laxInt), not negative; null is none.
func tokenID(e json.RawMessage) (uint32, bool) {
	if id, err := strconv.ParseUint(string(e), 10, 32); err == nil {
		return uint32(id), true // the common case, without the decoder
	}
	var v laxInt
	if e[0] == 'n' || json.Unmarshal(e, &v) != nil || v < 0 || v > math.MaxUint32 {
		return 0, false
	}
	return uint32(v), true
}

// promptString is one completions prompt given as a string, which the
// model's tokenizer encodes; ok is false for token ids.
func promptString(raw json.RawMessage) (s string, ok bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	return s, json.Unmarshal(raw, &s) == nil
}

// apiError is vLLM's error body (ErrorResponse with ErrorInfo).
type apiError struct {
	Error apiErrorInfo `json:"error"`
}

type apiErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// flatError is SGLang's and TensorRT-LLM's error body: their ErrorResponse
// dumped at the top level, "object" first.
type flatError struct {
	Object string `json:"object"`
	apiErrorInfo
}

// errorBody is engine k's whole-body error: vLLM nests it under "error",
// SGLang and TensorRT-LLM do not (create_error_response in SGLang's
// serving_base.py and in TensorRT-LLM's openai_server.py).
func errorBody(k engines.Kind, code int, typ, param, msg string) []byte {
	info := apiErrorInfo{Message: msg, Type: typ, Code: code}
	if param != "" {
		info.Param = &param
	}
	var v any = apiError{Error: info}
	if k != engines.VLLM {
		v = flatError{Object: "error", apiErrorInfo: info}
	}
	b, _ := json.Marshal(v) // a struct of strings and ints cannot fail
	return b
}

// appendUsage appends a UsageInfo's counts, then tail, the rest of its
// fields: whole answers dump them all (fullShape), stream chunks none.
func appendUsage(dst []byte, prompt, completion int, tail string) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt+completion), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(completion), 10)
	dst = append(dst, tail...)
	return append(dst, '}')
}

// sseWriter builds one response's SSE chunks in its engine's shapes
// (streamShape): the chat role chunk of each choice, then content deltas
// and the finish, then (with include_usage) a chunk with empty choices
// and the usage, then [DONE]. The n choices of each prompt of a
// completion batch stream interleaved, each chunk with its choice's
// index: prompt×n + the prompt's choice.
type sseWriter struct {
	chat       bool
	shape      *streamShape
	prefix     []byte // `data: {"id":…,"object":…,"created":…,"model":…,"choices":[`
	usage      bool
	continuous bool
	// perPrompt sends each prompt's usage chunk once its choices
	// finished, as TensorRT-LLM merges its prompts' streams; otherwise
	// one chunk at the end sums them (vLLM, SGLang).
	perPrompt bool
	prompts   []int // each prompt's length in tokens
	n         int   // choices of each prompt
	// left and produced are, for perPrompt, each prompt's choices still
	// running and the tokens of those that finished.
	left, produced []int
	sentRole       bool
	// finishes holds, with shape.finishDelta, the chat choices that
	// ended, in order, for appendEnd to send.
	finishes []finish
	// echo, when not nil, is each prompt's text, which a completion's
	// first delta of each choice starts with (echoTexts); with echoOnly
	// (max_tokens 0) the delta holds it alone. echoed marks the choices
	// that sent it.
	echo     []string
	echoOnly bool
	echoed   []bool
}

// finish is a choice's index and the reason it ended.
type finish struct {
	index  int
	reason uint8
}

// streamShape is the text of an engine's stream chunks around the sim's
// values. vLLM dumps its chunk models with exclude_unset, so a chunk
// carries exactly the fields it sets: a chat's finish rides on its last
// delta with stop_reason, and usage only where sent. SGLang builds its
// chat chunks with build_sse_content (sse_utils.py), whose delta always
// has reasoning_content and whose chunk omits an unset usage; the
// finish of each choice comes in a chunk of its own once all ended, and
// the role chunk never carries usage (serving_chat.py). Its completion
// chunks dump every field ("usage": null included), its closing usage
// chunk drops nulls (serving_completions.py). SGLang's choices carry
// matched_stop, null for the sim's ends (see fullShape). TensorRT-LLM
// dumps its chat chunks with exclude_none, so only a finished choice says
// finish_reason, and writes each role chunk as "data: {...} \n\n"; its
// completion and usage chunks dump every field (postprocess_handlers.py).
type streamShape struct {
	role      string // a chat choice's first chunk after its index
	roleUsage bool   // continuous usage rides on the role chunk
	roleSpace bool   // a space ends the role chunk's data line
	// delta is a chat delta before its text, deltaEnd after it; chatEnd
	// ends each chat choice and chatStop comes before it in a choice
	// that finished. dropNull leaves out an unfinished chat choice's
	// finish_reason.
	delta, deltaEnd, chatEnd, chatStop string
	dropNull                           bool
	// finishDelta, when set, is the delta of the chunk that carries a
	// chat choice's finish after every choice ended; content chunks then
	// say finish_reason null.
	finishDelta string
	// completionEnd ends each completion choice; nullUsage says a
	// completion chunk without usage says "usage": null.
	completionEnd string
	nullUsage     bool
	// usage ends a usage in the content chunks (continuous_usage_stats);
	// chatUsage and completionUsage end the closing chunk's.
	usage, chatUsage, completionUsage string
}

var (
	vllmStream = streamShape{
		role:          `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}`,
		roleUsage:     true,
		delta:         `,"delta":{"content":`,
		deltaEnd:      `},"logprobs":null`,
		chatStop:      `,"stop_reason":null`,
		completionEnd: `,"stop_reason":null`,
	}
	sglangStream = streamShape{
		role:            `,"delta":{"reasoning_content":null,"role":"assistant","content":""},"logprobs":null,"finish_reason":null,"matched_stop":null}`,
		delta:           `,"delta":{"reasoning_content":null,"content":`,
		deltaEnd:        `},"logprobs":null`,
		chatEnd:         `,"matched_stop":null`,
		finishDelta:     `,"delta":{"reasoning_content":null}`,
		completionEnd:   `,"matched_stop":null`,
		nullUsage:       true,
		usage:           sglangShape.usage,
		chatUsage:       sglangShape.usage,
		completionUsage: `,"reasoning_tokens":0`,
	}
	trtStream = streamShape{
		role:            `,"delta":{"role":"assistant"}}`,
		roleUsage:       true,
		roleSpace:       true,
		delta:           `,"delta":{"content":`,
		deltaEnd:        `,"reasoning_content":""}`,
		chatEnd:         trtShape.choiceEnd,
		dropNull:        true,
		completionEnd:   `,"stop_reason":null,"token_ids":null` + trtShape.choiceEnd,
		nullUsage:       true,
		usage:           trtShape.usage,
		chatUsage:       trtShape.usage,
		completionUsage: trtShape.usage,
	}
)

func newSSEWriter(k engines.Kind, chat bool, id string, created int64, model string, usage, continuous, perPrompt bool, prompts []int, n int) *sseWriter {
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
	}
	p := append([]byte(nil), `data: {"id":`...)
	p = appendJSONString(p, id)
	p = append(p, `,"object":"`...)
	p = append(p, object...)
	p = append(p, `","created":`...)
	p = strconv.AppendInt(p, created, 10)
	p = append(p, `,"model":`...)
	p = appendJSONString(p, model)
	p = append(p, `,"choices":[`...)
	_, shape := shapesOf(k)
	w := &sseWriter{chat: chat, shape: shape, prefix: p, usage: usage, continuous: continuous, perPrompt: perPrompt, prompts: prompts, n: n}
	if perPrompt {
		w.left, w.produced = make([]int, len(prompts)), make([]int, len(prompts))
		for i := range w.left {
			w.left[i] = n
		}
	}
	return w
}

// appendDelta appends the chunks for choice i's new output text;
// completion is the number of tokens it produced so far and reason its
// finish reason, if any.
func (w *sseWriter) appendDelta(dst []byte, i int, text []byte, completion int, reason uint8) []byte {
	if w.chat && !w.sentRole {
		// A chat has one prompt, whose choices each open with a role
		// chunk before any text.
		w.sentRole = true
		for j := range w.n {
			dst = append(dst, w.prefix...)
			dst = append(dst, `{"index":`...)
			dst = strconv.AppendInt(dst, int64(j), 10)
			dst = append(dst, w.shape.role...)
			dst = append(dst, ']')
			end := chunkEnd
			if w.shape.roleSpace {
				end = "} \n\n"
			}
			dst = w.closeChunk(dst, w.shape.roleUsage, w.prompts[0], 0, end)
		}
	}
	prompt := i / w.n
	dst = append(dst, w.prefix...)
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	shown := reason
	if w.chat {
		dst = append(dst, w.shape.delta...)
		dst = appendJSONBytes(dst, text)
		dst = append(dst, w.shape.deltaEnd...)
		if w.shape.finishDelta != "" && reason != finishNone {
			w.finishes = append(w.finishes, finish{i, reason})
			shown = finishNone
		}
		if shown != finishNone || !w.shape.dropNull {
			dst = append(dst, `,"finish_reason":`...)
		}
	} else {
		dst = append(dst, `,"text":`...)
		if w.echo != nil && !w.echoed[i] {
			w.echoed[i] = true
			dst = appendEchoed(dst, w.echo[prompt], text, w.echoOnly)
		} else {
			dst = appendJSONBytes(dst, text)
		}
		dst = append(dst, `,"logprobs":null,"finish_reason":`...)
	}
	if shown != finishNone || !w.chat || !w.shape.dropNull {
		dst = appendFinish(dst, shown)
	}
	switch {
	case !w.chat:
		dst = append(dst, w.shape.completionEnd...)
	case shown != finishNone:
		dst = append(dst, w.shape.chatStop...)
		fallthrough
	default:
		dst = append(dst, w.shape.chatEnd...)
	}
	dst = append(dst, "}]"...)
	dst = w.closeChunk(dst, true, w.prompts[prompt], completion, chunkEnd)
	if reason != finishNone && w.perPrompt {
		w.left[prompt]--
		w.produced[prompt] += completion
		if w.left[prompt] == 0 {
			dst = w.appendUsage(dst, w.prompts[prompt], w.produced[prompt])
		}
	}
	return dst
}

// appendFinish appends a finish reason's JSON value, null for none.
func appendFinish(dst []byte, reason uint8) []byte {
	if reason == finishNone {
		return append(dst, "null"...)
	}
	dst = append(dst, '"')
	dst = append(dst, finishNames[reason]...)
	return append(dst, '"')
}

// chunkEnd closes a chunk's JSON and its event.
const chunkEnd = "}\n\n"

// closeChunk ends a chunk after its choices with end: with the usage so
// far where continuous_usage_stats asks and usage allows it.
func (w *sseWriter) closeChunk(dst []byte, usage bool, prompt, completion int, end string) []byte {
	switch {
	case w.continuous && usage:
		dst = append(dst, `,"usage":`...)
		dst = appendUsage(dst, prompt, completion, w.shape.usage)
	case w.shape.nullUsage && !w.chat:
		dst = append(dst, `,"usage":null`...)
	}
	return append(dst, end...)
}

// appendUsage appends a usage chunk, if asked for.
func (w *sseWriter) appendUsage(dst []byte, prompt, completion int) []byte {
	if !w.usage {
		return dst
	}
	tail := w.shape.completionUsage
	if w.chat {
		tail = w.shape.chatUsage
	}
	dst = append(dst, w.prefix...)
	dst = append(dst, `],"usage":`...)
	dst = appendUsage(dst, prompt, completion, tail)
	return append(dst, chunkEnd...)
}

// appendEnd appends the finish chunks held back (streamShape.finishDelta),
// the usage chunk summing the prompts, each counted once, unless each
// had its own, and [DONE]; completion is the tokens of every choice.
func (w *sseWriter) appendEnd(dst []byte, completion int) []byte {
	for _, f := range w.finishes {
		dst = append(dst, w.prefix...)
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(f.index), 10)
		dst = append(dst, w.shape.finishDelta...)
		dst = append(dst, `,"logprobs":null,"finish_reason":`...)
		dst = appendFinish(dst, f.reason)
		dst = append(dst, w.shape.chatEnd...)
		dst = append(dst, "}]"...)
		dst = w.closeChunk(dst, false, 0, 0, chunkEnd)
	}
	if !w.perPrompt {
		prompt := 0
		for _, n := range w.prompts {
			prompt += n
		}
		dst = w.appendUsage(dst, prompt, completion)
	}
	return append(dst, "data: [DONE]\n\n"...)
}

// choice is one answer of a response: its text and finish reason, and
// the echo that starts it (echoTexts), or with echoOnly is all of it.
type choice struct {
	text     []byte
	reason   uint8
	echo     string
	echoOnly bool
}

// fullShape is the text of an engine's whole answer around the sim's
// values, every field its response models dump (nulls included):
// vLLM's, or SGLang's, whose
// choices carry matched_stop (null: SGLang names the stop string or
// token matched, the sim's natural end has no token id) and whose
// answer carries metadata (the weight version, "default" unless the
// server is told another). SGLang drops hidden_states, token_ids,
// prompt_token_ids, meta_info and sglext while unset
// (sglang/srt/entrypoints/openai/protocol.py). TensorRT-LLM dumps all of
// its models (tensorrt_llm/serve/openai_protocol.py): a chat message's
// reasoning_content is "" without a reasoning parser; a choice's
// avg_decoded_tokens_per_iter is 1.0 without speculative decoding; its
// usage counts cached_tokens, 0 here.
type fullShape struct {
	message string // after the content
	// choice ends each choice, chat's and completion's, after its
	// finish reason's closing quote; disagg then says the choice has
	// disaggregated_params (null unless a prefill leg's), choiceEnd
	// comes last.
	choice, completionChoice string
	disagg                   bool
	choiceEnd                string
	// beforeUsage comes between the choices and the usage; usage ends
	// the usage.
	beforeUsage, usage string
	// body ends the body after the usage, chat's and completion's.
	body, completionBody string
	// promptIDs says the body ends with prompt_token_ids (null unless
	// a prefill leg's), kvTransfer with kv_transfer_params.
	promptIDs, kvTransfer bool
}

var (
	vllmShape = fullShape{
		message:          `,"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null}`,
		choice:           `,"stop_reason":null`,
		completionChoice: `,"stop_reason":null,"prompt_logprobs":null`,
		beforeUsage:      `,"service_tier":null,"system_fingerprint":null`,
		usage:            `,"prompt_tokens_details":null`,
		body:             `,"prompt_logprobs":null`,
		kvTransfer:       true,
	}
	sglangShape = fullShape{
		message:          `,"reasoning_content":null,"tool_calls":null}`,
		choice:           `,"matched_stop":null`,
		completionChoice: `,"matched_stop":null`,
		usage:            `,"prompt_tokens_details":null,"reasoning_tokens":0`,
		body:             `,"metadata":{"weight_version":"default"}`,
		completionBody:   `,"metadata":{"weight_version":"default"}`,
	}
	trtShape = fullShape{
		message:          `,"reasoning_content":"","reasoning":null,"tool_calls":[]}`,
		choice:           `,"stop_reason":null,"mm_embedding_handle":null`,
		completionChoice: `,"stop_reason":null,"token_ids":null,"context_logits":null`,
		disagg:           true,
		choiceEnd:        `,"avg_decoded_tokens_per_iter":1.0`,
		usage:            `,"prompt_tokens_details":{"cached_tokens":0}`,
		body:             `,"prompt_token_ids_b64":null`,
		promptIDs:        true,
	}
)

// shapesOf is engine k's whole answer's shape and its stream's.
func shapesOf(k engines.Kind) (*fullShape, *streamShape) {
	switch k {
	case engines.SGLang:
		return &sglangShape, &sglangStream
	case engines.TRTLLM:
		return &trtShape, &trtStream
	}
	return &vllmShape, &vllmStream
}

// appendFullResponse appends engine k's non-streaming chat.completion or
// text_completion body (fullShape): n choices per prompt, and the usage
// of them all.
//
// pd, when not nil, adds a prefill leg's answer fields: vLLM's top-level
// kv_transfer_params, TensorRT-LLM's choices[0].disaggregated_params and
// top-level prompt_token_ids.
func appendFullResponse(dst []byte, k engines.Kind, chat bool, id string, created int64, model string, choices []choice, prompt, completion int, pd *pdAnswer) []byte {
	var disagg, kvParams []byte
	var promptIDs []uint32
	if pd != nil {
		disagg, kvParams, promptIDs = pd.disaggParams, pd.kvTransferParams, pd.promptTokenIDs
	}
	shape, _ := shapesOf(k)
	dst = append(dst, `{"id":`...)
	dst = appendJSONString(dst, id)
	if chat {
		dst = append(dst, `,"object":"chat.completion"`...)
	} else {
		dst = append(dst, `,"object":"text_completion"`...)
	}
	dst = append(dst, `,"created":`...)
	dst = strconv.AppendInt(dst, created, 10)
	dst = append(dst, `,"model":`...)
	dst = appendJSONString(dst, model)
	dst = append(dst, `,"choices":[`...)
	for i, c := range choices {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		if chat {
			dst = append(dst, `,"message":{"role":"assistant","content":`...)
			dst = appendJSONBytes(dst, c.text)
			dst = append(dst, shape.message...)
		} else {
			dst = append(dst, `,"text":`...)
			dst = appendEchoed(dst, c.echo, c.text, c.echoOnly)
		}
		dst = append(dst, `,"logprobs":null,"finish_reason":"`...)
		dst = append(dst, finishNames[c.reason]...)
		dst = append(dst, '"')
		if chat {
			dst = append(dst, shape.choice...)
		} else {
			dst = append(dst, shape.completionChoice...)
		}
		if shape.disagg {
			dst = append(dst, `,"disaggregated_params":`...)
			dst = appendOrNull(dst, disagg)
		}
		dst = append(dst, shape.choiceEnd...)
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	dst = append(dst, shape.beforeUsage...)
	dst = append(dst, `,"usage":`...)
	dst = appendUsage(dst, prompt, completion, shape.usage)
	if chat {
		dst = append(dst, shape.body...)
	} else {
		dst = append(dst, shape.completionBody...)
	}
	if shape.promptIDs {
		dst = append(dst, `,"prompt_token_ids":`...)
		if promptIDs == nil {
			dst = append(dst, "null"...)
		} else {
			dst = append(dst, '[')
			for i, t := range promptIDs {
				if i > 0 {
					dst = append(dst, ',')
				}
				dst = strconv.AppendUint(dst, uint64(t), 10)
			}
			dst = append(dst, ']')
		}
	}
	if shape.kvTransfer {
		dst = append(dst, `,"kv_transfer_params":`...)
		dst = appendOrNull(dst, kvParams)
	}
	return append(dst, '}')
}

// appendOrNull appends the JSON value v, null when it is nil.
func appendOrNull(dst, v []byte) []byte {
	if v == nil {
		return append(dst, "null"...)
	}
	return append(dst, v...)
}

// appendJSONString appends s as a JSON string. The sim's own text is plain
// ASCII words; json.Marshal handles what a client may send (model names).
func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return append(dst, b...)
}

// appendEchoed appends echo, the client's text, then generated text
// (unless only), as one JSON string.
func appendEchoed(dst []byte, echo string, text []byte, only bool) []byte {
	if only {
		text = nil
	}
	if echo == "" {
		return appendJSONBytes(dst, text)
	}
	b, _ := json.Marshal(echo) // a string always marshals
	dst = append(dst, b[:len(b)-1]...)
	return append(append(dst, text...), '"')
}

// appendJSONBytes appends generated text, which is ASCII letters and spaces
// only (words), as a JSON string without escaping work.
func appendJSONBytes(dst, text []byte) []byte {
	dst = append(dst, '"')
	dst = append(dst, text...)
	return append(dst, '"')
}
