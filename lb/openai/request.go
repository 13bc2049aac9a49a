// Package openai holds the OpenAI wire pieces the gateway needs: request
// extraction (the few fields routing reads, without decoding the body),
// OpenAI-shaped errors, and SSE framing for relaying streamed responses.
//
// The gateway forwards a request body byte for byte; nothing here modifies
// it.
package openai

import (
	"bytes"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/bytedance/sonic"
	"github.com/cespare/xxhash/v2"

	"pdlb/engines"
	"pdlb/engines/tokenize"
	"pdlb/radix"
)

// Kind is the API a request came in on, which the caller knows from the
// path; it decides whether the prompt is read from messages or from prompt.
type Kind uint8

const (
	// KindChat is POST /v1/chat/completions: the prompt is "messages".
	KindChat Kind = iota + 1
	// KindCompletion is POST /v1/completions: the prompt is "prompt".
	KindCompletion
	// KindOther is a POST to another of the engines' JSON APIs that names
	// its model and runs on the engine (embeddings, scores, reranking,
	// pooling, classification): only "model" is read, and the body goes
	// to a pod as it came.
	KindOther
	// KindTokenizer is KindOther for /tokenize and /detokenize, which the
	// engine's API server answers without the engine.
	KindTokenizer
	// KindResponses is POST /v1/responses, OpenAI's Responses API: its
	// prompt is "instructions" and "input" (renderResponses), its output
	// budget "max_output_tokens"; besides "model", "cache_salt" and
	// "stream", its "store", "previous_response_id" and "request_id"
	// (vLLM names the response after it) are read, since a stored
	// response lives on the pod that made it, "prompt_cache_key", a
	// conversation's key, and whether "previous_response" or
	// "previous_input_messages" hold a history (Continues).
	KindResponses
	// KindStored is a request about a stored response, by the id in its
	// path (GET or DELETE /v1/responses/{id}, its /cancel and
	// /input_items): it has no body to read.
	KindStored
	// KindAudio is POST /v1/audio/transcriptions or
	// /v1/audio/translations, vLLM's speech-to-text APIs: a multipart
	// form (ParseForm) whose "model" and "stream" are read; the body goes
	// to a pod as it came.
	KindAudio
	// KindMessages is POST /v1/messages, Anthropic's Messages API, which
	// vLLM serves as the chat its messages make: its prompt is "system"
	// and "messages" (renderMessages), its output budget "max_tokens".
	KindMessages
)

// Generates reports whether k's requests generate tokens: chat and
// completion, whose prompt is read.
func (k Kind) Generates() bool { return k == KindChat || k == KindCompletion }

// Outputs reports whether k's requests have a prompt the gateway reads
// and answers that carry generated tokens to count: Generates', the
// Responses API's and the Messages API's.
func (k Kind) Outputs() bool { return k.Generates() || k == KindResponses || k == KindMessages }

// EndMarked reports whether k's streams end with a marker ([DONE],
// message_stop, response.completed) and may carry the engine's error
// event, which the relay checks for: Outputs', and the speech-to-text
// APIs', whose text is not counted as output (vLLM's usage for them is the
// audio's duration, or none).
func (k Kind) EndMarked() bool { return k.Outputs() || k == KindAudio }

// StreamsResponses reports whether k's streams are a Responses API
// response's events: KindResponses', and a stored response's retrieval.
func (k Kind) StreamsResponses() bool { return k == KindResponses || k == KindStored }

// RunsAsChat reports whether k's requests are of an API the engine runs
// as the chat it makes of them: the Responses and Messages APIs, Outputs'
// besides chat and completion. The gateway runs them on one combined pod
// but where the engine's prefill/decode exchange carries them (vLLM's, a
// Messages request: the gateway's strategyFor).
func (k Kind) RunsAsChat() bool { return k.Outputs() && !k.Generates() }

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case KindChat:
		return "chat"
	case KindCompletion:
		return "completion"
	case KindOther:
		return "other"
	case KindTokenizer:
		return "tokenizer"
	case KindResponses:
		return "responses"
	case KindStored:
		return "stored"
	case KindAudio:
		return "audio"
	case KindMessages:
		return "messages"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// KindFromPath returns the kind of a POST path the gateway routes to pods
// by the model its body names; ok is false for any other path. KindOther's
// and KindTokenizer's are vLLM's and SGLang's model-bearing JSON APIs
// that hold no state between requests; KindAudio's take a form.
func KindFromPath(path []byte) (k Kind, ok bool) {
	switch string(path) {
	case "/v1/chat/completions":
		return KindChat, true
	case "/v1/completions":
		return KindCompletion, true
	case "/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank":
		return KindOther, true
	case "/tokenize", "/detokenize", "/v1/messages/count_tokens":
		return KindTokenizer, true
	case "/v1/responses":
		return KindResponses, true
	case "/v1/audio/transcriptions", "/v1/audio/translations":
		return KindAudio, true
	case "/v1/messages":
		return KindMessages, true
	}
	return 0, false
}

// StoredID returns the response id a KindStored path names, and what
// follows it: /v1/responses/{id} (""), /v1/responses/{id}/cancel
// ("cancel") or /v1/responses/{id}/input_items ("input_items"). ok is
// false for any other path.
func StoredID(path []byte) (id []byte, sub string, ok bool) {
	rest, ok := bytes.CutPrefix(path, []byte("/v1/responses/"))
	if !ok {
		return nil, "", false
	}
	id, after, slash := bytes.Cut(rest, []byte("/"))
	switch sub = string(after); sub {
	case "", "cancel", "input_items":
		return id, sub, len(id) > 0 && (sub != "" || !slash)
	}
	return nil, "", false
}

// Request is what the gateway reads from a chat or completion request body.
// Parse fills it without decoding the body into maps or structs: one pass
// over the body checks its grammar, reads the fields below and steps over
// every other value.
//
// A Request holds no reference to the body: every field is a copy, so the
// body buffer may be reused while the Request lives. A Request is kept
// for the next one (Recycle) with its buffers, so Parse allocates nothing
// once they have grown to the workload's prompt size. A Request is not
// safe for concurrent use.
type Request struct {
	Kind Kind
	// Model is the "model" field, empty when absent, null or "": vLLM and
	// SGLang then serve the request with the pod's model. modelAt is where
	// its JSON value lies in the parsed body, quotes included ([start,
	// end) byte offsets), for WithModel.
	Model   []byte
	modelAt [2]int
	// form says the body is a multipart form (ParseForm), where the
	// model's value is its raw bytes.
	form bool
	// FormTextBytes is the size of a form's fields, its files left out
	// (ParseForm).
	FormTextBytes int
	// Stream is the "stream" field (default false).
	Stream bool
	// MaxTokens is the output budget in tokens: on the chat path
	// "max_completion_tokens" if present, else "max_tokens", else -1.
	// vLLM gives max_completion_tokens the same precedence, and reads it
	// only on the chat path.
	MaxTokens int
	// MaxCompletionTokens says MaxTokens came from "max_completion_tokens".
	MaxCompletionTokens bool
	// chatMaxTokens is then the chat's "max_tokens" (-1: absent or
	// null), which SGLang holds it to instead of a 0 (OutputBudget).
	chatMaxTokens int
	// engineBudget says a completion left max_tokens out or sent null, so
	// the engine's default applies (OutputBudget): vLLM's
	// normalize_null_max_tokens gives null the default too.
	engineBudget bool
	// Choices is "n", the completions generated for the prompt (default
	// 1): their tokens come interleaved in one stream, and usage counts
	// them all.
	Choices int
	// HasStreamOptions says "stream_options" was an object; IncludeUsage is
	// its "include_usage" (default false), and HasIncludeUsage says the key
	// was there (null included): without it the engine's default applies.
	HasStreamOptions bool
	IncludeUsage     bool
	HasIncludeUsage  bool
	// continuousUsage says stream_options held a continuous_usage_stats
	// that is not false or null (SGLang streams usage for it alone);
	// optionsAt is where the stream_options value lies in the parsed body
	// ([start, end) byte offsets; end 0: absent), for WithUsage.
	continuousUsage bool
	optionsAt       [2]int

	// Prompt is the prompt rendered as the engine sees it. Chat: each
	// message as tokenize.AppendTurn(role, content), then
	// tokenize.GenerationPrompt; content given as a list of parts renders
	// its text parts joined by "\n" (as vLLM and TensorRT-LLM join them) and
	// skips other parts. Completion: the prompt string; a list of strings
	// (a batch to the engine) renders as their concatenation, each one
	// apart in BatchPrompt: the engine runs each prompt as a request of
	// its own, its blocks a chain of their own. Responses: the chat turns
	// vLLM makes of the instructions and input (renderResponses). Empty
	// when the prompt is given as token ids.
	Prompt []byte
	// TokenIDs says the completion prompt was token ids (a list of ids or a
	// list of lists of ids); PromptIDs holds them, lists concatenated.
	TokenIDs  bool
	PromptIDs []uint32
	// Messages is the number of chat messages.
	Messages int
	// MediaBytes is the raw JSON size of the content parts that are not
	// text (image_url, input_audio, ...) and of a completion's
	// prompt_embeds: not rendered into Prompt, it lets a caller weigh
	// multimodal requests (bytes, not tokens).
	MediaBytes int
	// CacheSalt is "cache_salt" when it is a string (else empty): the
	// engine keys the prompt's cached blocks apart from other salts'. salt
	// is its JSON form, and saltGot the text of one that is not a string,
	// for CacheSaltError.
	CacheSalt []byte
	salt      engines.SaltForm
	saltGot   []byte
	// SpecialTokens is vLLM's "add_special_tokens" when given: whether the
	// tokenizer adds its special tokens (BOS) to the prompt text;
	// SpecialTokensSet is false when it was absent or null, and the
	// engine's default applies (true for completions, false for chats).
	SpecialTokens, SpecialTokensSet bool
	// TruncatePromptTokens is vLLM's "truncate_prompt_tokens" when it
	// cuts the prompt: the engine keeps only this many of its tokens, the
	// last ones, or the first if TruncateRight ("truncation_side":
	// "right"), and caches and counts only those. 0 keeps them all: the
	// field absent or null; -1, which cuts to the context less the output
	// budget, unknown here (only a prompt the engine would refuse as too
	// long without the field is cut); or 0, which leaves an empty prompt
	// the engine refuses.
	TruncatePromptTokens int
	TruncateRight        bool
	// badTruncate and badSide are the 400s for a truncate_prompt_tokens
	// or truncation_side value an engine that reads them refuses (their
	// fields then keep the whole prompt): TruncationError's, for the
	// engine to decide.
	badTruncate, badSide *Error
	// Engine is the engine that serves the request: whether it cuts the
	// prompt as TruncatePromptTokens asks is Kind.TruncatesPrompt's
	// answer. "", as Parse leaves it, is vLLM.
	Engine engines.Kind
	// Tokens is the prompt's length as the model's own tokenizer counts
	// it, once the gateway has tokenized it (0: not done, PromptTokens
	// counts the client's ids or the stand-in's).
	Tokens int

	// KindResponses: Previous is "previous_response_id", ResponseID
	// "request_id" and CacheKey "prompt_cache_key" (a conversation's
	// key, which vLLM ignores), each empty when absent or null;
	// ResponseIDSet says "request_id" was there, null or "" too; NoStore
	// says "store" was false (the API's default is true).
	Previous, ResponseID, CacheKey []byte
	ResponseIDSet, NoStore         bool
	// prior has a bit for each of vLLM's "previous_response" and
	// "previous_input_messages" given a history: see Continues.
	prior uint8

	media   uint64 // digest of the non-text content parts (MediaBytes > 0)
	scratch []byte // unescaped keys and roles
	// ends is where each prompt of a prompt list ends in Prompt (bytes)
	// or PromptIDs: vLLM cuts each prompt of a batch on its own.
	ends []int
	// keptText and keptIDs hold a cut batch's kept prompts, concatenated.
	keptText []byte
	keptIDs  []uint32
}

// maxKeptPrompt bounds the prompt buffer a recycled Request keeps (bytes),
// so one huge request does not pin its buffer for good.
const maxKeptPrompt = 1 << 20

// maxKeptID bounds the buffers of a recycled Request's response ids and
// conversation key together (bytes): vLLM's ids are 37 bytes, a client's
// may be as long as a body.
const maxKeptID = 4 << 10

// NewRequest returns an empty Request.
func NewRequest() *Request { return &Request{MaxTokens: -1, Choices: 1} }

// Recycle empties r for its next Parse, as Reset does, and first drops
// the buffers a huge request grew past what a kept Request holds.
func (r *Request) Recycle() {
	if cap(r.Prompt) > maxKeptPrompt {
		r.Prompt = nil
	}
	if cap(r.PromptIDs)*4 > maxKeptPrompt {
		r.PromptIDs = nil
	}
	if cap(r.keptText) > maxKeptPrompt || cap(r.keptIDs)*4 > maxKeptPrompt {
		r.keptText, r.keptIDs = nil, nil
	}
	if cap(r.Previous)+cap(r.ResponseID)+cap(r.CacheKey) > maxKeptID {
		r.Previous, r.ResponseID, r.CacheKey = nil, nil, nil
	}
	r.Reset()
}

// Reset empties r and keeps its buffers. (Zeroing r and then putting the
// buffers back costs half of assigning one composite literal with them,
// which the compiler builds on the stack and copies.)
func (r *Request) Reset() {
	model, prompt, ids, salt, scratch := r.Model[:0], r.Prompt[:0], r.PromptIDs[:0], r.CacheSalt[:0], r.scratch[:0]
	ends, keptText, keptIDs, saltGot := r.ends[:0], r.keptText[:0], r.keptIDs[:0], r.saltGot[:0]
	previous, responseID, cacheKey := r.Previous[:0], r.ResponseID[:0], r.CacheKey[:0]
	*r = Request{MaxTokens: -1, Choices: 1}
	r.Model, r.Prompt, r.PromptIDs, r.CacheSalt, r.scratch = model, prompt, ids, salt, scratch
	r.ends, r.keptText, r.keptIDs, r.saltGot = ends, keptText, keptIDs, saltGot
	r.Previous, r.ResponseID, r.CacheKey = previous, responseID, cacheKey
}

// WithModel returns body, the body r was parsed from (or the last body
// WithModel returned), with its "model" value replaced by name and every
// other byte as the client sent it. r.Model stays the client's name. The
// result is a new slice.
func (r *Request) WithModel(body []byte, name string) []byte {
	start, end := r.modelAt[0], r.modelAt[1]
	if end == 0 || end > len(body) {
		panic("BUG: openai: WithModel on a body without the parsed model")
	}
	out := make([]byte, 0, len(body)-(end-start)+len(name)+2)
	out = append(out, body[:start]...)
	if r.form {
		out = append(out, name...)
	} else {
		out = AppendJSONString(out, name)
	}
	r.modelAt[1] = len(out)
	return append(out, body[end:]...)
}

// KeySeed returns the seed of the request's block-key chain, given its
// model's (radix.Seed of the model name): the engine's block keys depend
// on the cache salt, so the request's do, as the index keys a pod's salted
// blocks (radix.SeedWith). A request with non-text content parts
// (Unindexed) gets a seed of its own besides, from a digest of those
// parts: the engine hashes multimodal inputs into the blocks holding their
// placeholder tokens, which the gateway cannot compute, so its keys must
// match no block any pod reported.
func (r *Request) KeySeed(model uint64) uint64 {
	seed := radix.SeedWith(model, "", b2s(r.CacheSalt))
	if r.Unindexed() {
		seed = radix.Extend(seed, r.media)
	}
	return seed
}

// Unindexed reports that the request's blocks cannot be keyed as the
// engine keys them (it has non-text content parts, or prompt_embeds):
// its keys match none of the KV-event index, and it is routed without it.
func (r *Request) Unindexed() bool { return r.MediaBytes > 0 }

// PromptTokens is the length in tokens of the prompt the engine keeps:
// Tokens when set, the kept ids' count for token-id prompts, else
// tokenize.Count of the kept rendered prompt.
func (r *Request) PromptTokens() int {
	if r.Tokens > 0 {
		return r.Tokens
	}
	if r.TokenIDs {
		return len(r.PromptIDsKept())
	}
	return tokenize.Count(r.PromptKept())
}

// PromptIDsKept is PromptIDs cut as TruncatePromptTokens asks: the ids
// the engine keeps. A batch's prompts are cut one by one, as vLLM cuts
// them, and concatenated (into a buffer r keeps: valid until the next
// call).
func (r *Request) PromptIDsKept() []uint32 {
	if !r.batchCut() {
		from, to := r.kept(len(r.PromptIDs))
		return r.PromptIDs[from:to]
	}
	r.keptIDs = r.keptIDs[:0]
	for i := range r.ends {
		r.keptIDs = append(r.keptIDs, r.BatchIDsKept(i)...)
	}
	return r.keptIDs
}

// PromptKept is Prompt cut as TruncatePromptTokens asks, in the shared
// tokenizer's tokens: the text whose ids are those the engine keeps when
// it tokenizes as the shared tokenizer does. A model's own tokenizer must
// cut its ids instead, since text cut short encodes differently. A
// batch's prompts are cut one by one, as in PromptIDsKept.
func (r *Request) PromptKept() []byte {
	if !r.batchCut() {
		return keptText(r.Prompt, r)
	}
	r.keptText = r.keptText[:0]
	for i := range r.ends {
		r.keptText = append(r.keptText, r.BatchPromptKept(i)...)
	}
	return r.keptText
}

// keptText is one prompt's text cut as r's truncation asks.
func keptText(p []byte, r *Request) []byte {
	from, to := r.kept(tokenize.Count(p))
	return p[from*tokenize.BytesPerToken : min(to*tokenize.BytesPerToken, len(p))]
}

// Batch is the number of prompts in a completion's prompt list; 1 for a
// single prompt (a string or a list of token ids).
func (r *Request) Batch() int { return max(len(r.ends), 1) }

// BatchPrompt is the text of prompt i of the Batch, a part of Prompt.
func (r *Request) BatchPrompt(i int) []byte {
	if len(r.ends) == 0 {
		return r.Prompt
	}
	return r.Prompt[r.start(i):r.ends[i]]
}

// BatchPromptKept is BatchPrompt(i) cut as PromptKept cuts it.
func (r *Request) BatchPromptKept(i int) []byte { return keptText(r.BatchPrompt(i), r) }

// BatchIDsKept is the ids of prompt i of the Batch, a part of PromptIDs,
// cut as TruncatePromptTokens asks: those the engine keeps.
func (r *Request) BatchIDsKept(i int) []uint32 {
	p := r.PromptIDs
	if len(r.ends) > 0 {
		p = p[r.start(i):r.ends[i]]
	}
	from, to := r.kept(len(p))
	return p[from:to]
}

// start is where prompt i of the batch starts in Prompt or PromptIDs.
func (r *Request) start(i int) int {
	if i == 0 {
		return 0
	}
	return r.ends[i-1]
}

// batchCut says the engine cuts each of several prompts.
func (r *Request) batchCut() bool {
	k, _ := r.Truncation()
	return k > 0 && len(r.ends) > 1
}

// Truncation is how many prompt tokens Engine keeps (0: all), the first
// ones if right: TruncatePromptTokens where Engine cuts such a prompt.
func (r *Request) Truncation() (keep int, right bool) {
	if !r.Engine.TruncatesPrompt(r.TokenIDs) {
		return 0, false
	}
	return r.TruncatePromptTokens, r.TruncateRight
}

// kept returns the range [from, to) of an n-token prompt the engine
// keeps.
func (r *Request) kept(n int) (from, to int) {
	switch k, right := r.Truncation(); {
	case k <= 0 || k >= n:
		return 0, n
	case right:
		return 0, k
	default:
		return n - k, n
	}
}

// Field forms named in error messages.
const (
	wantString     = "a string"
	wantBool       = "a boolean"
	wantObject     = "an object"
	wantList       = "a list"
	wantCount      = "a non-negative integer"
	wantTokenID    = "a token id (an integer from 0 to 4294967295)"
	wantContent    = "a string or a list of parts"
	wantPart       = "a string or an object"
	wantPromptForm = "a string, a list of strings, a list of token ids or a list of lists of token ids"
	wantTruncation = "an integer from -1 to 2147483647"
	wantSide       = `"left" or "right"`
)

// Parse resets r and fills it from body, a request of the given kind. It
// returns nil or an *Error (400) that names the offending field, e.g.
// `"messages[2].content" must be a string or a list of parts, got 5`.
// Unknown fields are skipped; a repeated key counts once, its last value
// winning, as in Python's json module that engines parse with. Bad values
// of truncate_prompt_tokens, truncation_side and cache_salt, which the
// engines judge differently, are EngineRefusal's to answer once the engine
// is known.
//
// The body must be JSON as sonic.Valid defines it (see scanner: raw control
// bytes inside strings are let through), with valid escapes, in UTF-8. One
// walk checks the grammar and reads the fields; the UTF-8 check is a
// second pass over the body. A walk that fails, or meets an error before
// the end of the body, is reported as a validator run first would report
// it: malformed JSON first, then malformed UTF-8, then the walk's error.
func (r *Request) Parse(kind Kind, body []byte) error {
	r.Reset()
	r.Kind = kind
	if kind < KindChat || kind > KindResponses && kind != KindMessages {
		panic("BUG: openai: Parse with " + kind.String())
	}
	s := scanner{b: body}
	err := r.parse(&s)
	if err == nil && !s.bad {
		// JSON text is UTF-8 (RFC 8259) and the walk does not check it;
		// an engine would choke on what we forwarded, so refuse it here.
		// Not sonic's SIMD validator: faster alone, dearer on the loop.
		if !utf8.Valid(body) {
			return InvalidUTF8()
		}
		return nil
	}
	// The error path: the walk may have stopped before a later fault, so
	// the whole body is checked again for the error that comes first.
	if !sonic.Valid(body) {
		return InvalidJSON()
	}
	if !utf8.Valid(body) {
		return InvalidUTF8()
	}
	if err == nil {
		return InvalidJSON() // an escape sonic.Valid lets through
	}
	return err
}

// parse is Parse's walk over s.b: nil, or the first error it meets; s.bad
// reports a grammar fault or an invalid escape.
func (r *Request) parse(s *scanner) error {
	s.ws()
	if s.c() != '{' {
		return NotAnObject()
	}
	s.open()
	var maxTokens, maxCompletion = -1, -1
	var seenPrompt, seenEmbeds bool
	var instructions, input field // KindResponses, KindMessages: rendered once all is read
	for i := 0; s.more('}', i); i++ {
		key := s.key(&r.scratch)
		switch r.Kind {
		case KindResponses:
			if err := r.responsesField(s, key, &instructions, &input); err != nil {
				return err
			}
			continue
		case KindMessages:
			// The system field and the messages.
			if err := r.messagesField(s, key, &instructions, &input); err != nil {
				return err
			}
			continue
		}
		if !r.Kind.Generates() && b2s(key) != "model" {
			s.skip()
			continue
		}
		var err error
		switch b2s(key) {
		case "model":
			err = r.parseModel(s)
		case "stream":
			r.Stream, err = r.parseBool(s, "stream")
		case "add_special_tokens":
			r.SpecialTokensSet = s.c() != 'n'
			r.SpecialTokens, err = r.parseBool(s, "add_special_tokens")
		case "max_tokens":
			maxTokens, err = r.parseCount(s, "max_tokens")
		case "max_completion_tokens":
			// Chat's field alone: vLLM's and SGLang's completion requests
			// have none, ignore it, and default max_tokens to 16.
			if r.Kind == KindChat {
				maxCompletion, err = r.parseCount(s, "max_completion_tokens")
			} else {
				s.skip()
			}
		case "n":
			err = r.parseChoices(s)
		case "stream_options":
			start := s.p
			err = r.parseStreamOptions(s)
			r.optionsAt = [2]int{start, s.p}
		case "cache_salt":
			err = r.parseCacheSalt(s)
		case "truncate_prompt_tokens":
			r.TruncatePromptTokens, r.badTruncate = r.parseTruncation(s)
		case "truncation_side":
			r.TruncateRight, r.badSide, err = r.parseTruncationSide(s)
		case "messages":
			if r.Kind == KindChat {
				seenPrompt, err = r.parseMessages(s)
			} else {
				s.skip()
			}
		case "prompt":
			if r.Kind == KindCompletion {
				seenPrompt, err = r.parsePrompt(s)
			} else {
				s.skip()
			}
		case "prompt_embeds":
			if r.Kind == KindCompletion {
				seenEmbeds = r.parsePromptEmbeds(s)
			} else {
				s.skip()
			}
		default:
			s.skip()
		}
		if err != nil {
			return err
		}
	}
	if s.ws(); s.p != len(s.b) {
		s.fail() // trailing bytes
	}
	if s.bad {
		return nil
	}
	switch r.Kind {
	case KindResponses:
		r.renderResponses(s.b, instructions, input)
		return nil
	case KindMessages:
		r.renderMessages(s.b, instructions, input)
		return nil
	}
	if !r.Kind.Generates() {
		// Nothing to generate: no output to charge or wait for.
		r.MaxTokens = 0
		return nil
	}
	if !seenPrompt && !seenEmbeds {
		if r.Kind == KindChat {
			return MissingParam("messages")
		}
		return MissingParam("prompt")
	}
	r.MaxTokens, r.MaxCompletionTokens = maxTokens, false
	r.engineBudget = r.Kind == KindCompletion && maxTokens < 0
	if maxCompletion >= 0 {
		r.MaxTokens, r.MaxCompletionTokens, r.chatMaxTokens = maxCompletion, true, maxTokens
	}
	return nil
}

// OutputBudget is the most tokens the engine generates for each of r's
// sequences: MaxTokens, or for a completion without max_tokens (or with
// null) its engine's default (engines.Kind.CompletionMaxTokens), or for
// a chat whose max_completion_tokens the engine passes over
// (engines.Kind.ReadsMaxCompletionTokens) its max_tokens; -1 when
// unknown, as for a chat without one, which vLLM lets run to the
// context's end.
func (r *Request) OutputBudget() int {
	switch {
	case r.engineBudget:
		return r.Engine.CompletionMaxTokens()
	case r.MaxCompletionTokens && !r.Engine.ReadsMaxCompletionTokens(r.MaxTokens):
		return r.chatMaxTokens
	}
	return r.MaxTokens
}

// parseModel reads "model": a string, or null, which counts as absent.
func (r *Request) parseModel(s *scanner) error {
	start, quoted := s.p, s.c() == '"'
	var err error
	r.Model, err = r.parseString(s, r.Model, "model")
	r.modelAt = [2]int{}
	if quoted && err == nil {
		r.modelAt = [2]int{start, s.p}
	}
	return err
}

// responsesField reads the field key of a KindResponses body, or steps
// over it; instructions and input are kept for renderResponses.
func (r *Request) responsesField(s *scanner, key []byte, instructions, input *field) (err error) {
	switch b2s(key) {
	case "instructions":
		*instructions = s.field()
	case "input":
		*input = s.field()
	case "max_output_tokens":
		r.MaxTokens, err = r.parseCount(s, "max_output_tokens")
	case "cache_salt":
		err = r.parseCacheSalt(s)
	case "model":
		err = r.parseModel(s)
	case "stream":
		r.Stream, err = r.parseBool(s, "stream")
	case "store":
		if s.c() == 'n' {
			s.skip() // null: the default, true
			break
		}
		var store bool
		store, err = r.parseBool(s, "store")
		r.NoStore = !store
	case "previous_response_id":
		r.Previous, err = r.parseString(s, r.Previous, "previous_response_id")
	case "previous_response", "previous_input_messages":
		// vLLM's stateless history: the earlier turns come with the
		// request, outside its input. Each key's last value counts; null
		// or an empty list adds no history.
		bit := priorResponse
		if b2s(key) == "previous_input_messages" {
			bit = priorMessages
		}
		r.prior &^= bit
		if nonEmpty(s.b[s.skip():s.p]) {
			r.prior |= bit
		}
	case "request_id":
		r.ResponseIDSet = true
		r.ResponseID, err = r.parseString(s, r.ResponseID, "request_id")
	case "prompt_cache_key":
		r.CacheKey, err = r.parseString(s, r.CacheKey, "prompt_cache_key")
	default:
		s.skip()
	}
	return err
}

// nonEmpty says a JSON value v is neither null nor an empty list (v may
// be cut short in a body that is no JSON).
func nonEmpty(v []byte) bool {
	v = bytes.TrimSpace(v)
	switch {
	case len(v) == 0 || v[0] == 'n':
		return false
	case v[0] == '[':
		return len(bytes.TrimSpace(bytes.TrimSuffix(v[1:], []byte("]")))) > 0
	}
	return true
}

// Bits of Request.prior.
const (
	priorResponse uint8 = 1 << iota
	priorMessages
)

// Continues reports whether a Responses request continues a
// conversation its input does not hold: one named by
// previous_response_id, or one given as vLLM's previous_response or
// previous_input_messages. Its prompt is then its new input alone.
func (r *Request) Continues() bool { return len(r.Previous) > 0 || r.prior != 0 }

// renderResponses renders a Responses request's prompt into Prompt as
// the chat vLLM makes of it (engines/chat's Conversation.ParseResponses),
// in the turns a chat's messages render: the instructions, when a string
// not empty, as the system's turn, then the input's, then
// tokenize.GenerationPrompt. An input string is the user's turn; a list's
// message items are turns of their role, an assistant's holding its
// content's first part's text alone; any other item (a function call,
// its output, reasoning) renders as its JSON, which keys it the same at
// every turn. An input the engine refuses leaves Prompt empty: the engine
// answers it.
func (r *Request) renderResponses(body []byte, instructions, input field) {
	r.Prompt = r.Prompt[:0]
	if instructions.form == '"' && len(instructions.raw) > 0 {
		r.Prompt = tokenize.AppendTurnOpen(r.Prompt, []byte("system"))
		r.Prompt, _ = appendUnquoted(r.Prompt, instructions.raw, instructions.esc)
		r.Prompt = tokenize.AppendTurnClose(r.Prompt)
	}
	ok := false
	switch s := (&scanner{b: body, p: input.start}); input.form {
	case '"':
		r.Prompt = tokenize.AppendTurnOpen(r.Prompt, []byte("user"))
		r.Prompt, ok = appendUnquoted(r.Prompt, input.raw, input.esc)
		r.Prompt = tokenize.AppendTurnClose(r.Prompt)
	case '[':
		s.open()
		items := 0
		for ok = true; ok && s.more(']', items); items++ {
			ok = r.renderItem(s, items)
		}
		ok = ok && items > 0
	}
	if !ok {
		r.Prompt, r.MediaBytes, r.media = r.Prompt[:0], 0, 0
		return
	}
	r.Prompt = append(r.Prompt, tokenize.GenerationPrompt...)
}

// renderItem renders input item j of a Responses request (s on it) as a
// chat turn; false when the engine would refuse it.
func (r *Request) renderItem(s *scanner, j int) bool {
	start := s.p
	if s.c() != '{' {
		s.skip()
		return false
	}
	s.open()
	var role, content, typ field
	for k := 0; s.more('}', k); k++ {
		switch b2s(s.key(&r.scratch)) {
		case "role":
			role = s.field()
		case "content":
			content = s.field()
		case "type":
			typ = s.field()
		default:
			s.skip()
		}
	}
	if typ.form != 0 && string(typ.raw) != "message" || role.form != '"' {
		if typ.form != '"' {
			return false
		}
		r.Prompt = tokenize.AppendTurn(r.Prompt, typ.raw, s.b[start:s.p])
		return true
	}
	roleText, ok := r.text(role)
	if !ok {
		return false
	}
	r.Prompt = tokenize.AppendTurnOpen(r.Prompt, roleText)
	switch content.form {
	case '"':
		r.Prompt, ok = appendUnquoted(r.Prompt, content.raw, content.esc)
	case '[':
		ps := &scanner{b: s.b, p: content.start}
		if string(roleText) == "assistant" {
			ok = r.firstText(ps)
		} else {
			ok = r.renderParts(ps, j) == nil
		}
	default:
		ok = false
	}
	r.Prompt = tokenize.AppendTurnClose(r.Prompt)
	return ok
}

// firstText appends the text of an assistant item's first content part
// (s on the list), all vLLM keeps of it: a string, or a part's "text".
func (r *Request) firstText(s *scanner) bool {
	s.open()
	if !s.more(']', 0) {
		return true
	}
	switch s.c() {
	case '"':
		f := s.field()
		var ok bool
		r.Prompt, ok = appendUnquoted(r.Prompt, f.raw, f.esc)
		return ok
	case '{':
		s.open()
		var text field
		for k := 0; s.more('}', k); k++ {
			if b2s(s.key(&r.scratch)) == "text" {
				text = s.field()
			} else {
				s.skip()
			}
		}
		switch text.form {
		case 0: // no text: ""
			return true
		case '"':
			var ok bool
			r.Prompt, ok = appendUnquoted(r.Prompt, text.raw, text.esc)
			return ok
		}
	}
	return false
}

// parseString reads a string field into dst[:0]: a string, or null,
// which counts as absent.
func (r *Request) parseString(s *scanner, dst []byte, param string) ([]byte, error) {
	dst = dst[:0]
	switch s.c() {
	case 'n':
		s.skip()
		return dst, nil
	case '"':
		raw, esc := s.str()
		dst, ok := appendUnquoted(dst, raw, esc)
		if !ok {
			return dst, InvalidJSON()
		}
		return dst, nil
	}
	return dst, InvalidType(param, wantString, s.b[s.skip():s.p])
}

// WithResponseID returns body, the body r was parsed from, with
// "request_id": id first in its object: vLLM names the response it
// makes after it. r's model offsets move with the bytes after them. The
// result is a new slice.
func (r *Request) WithResponseID(body []byte, id string) []byte {
	return r.withFirst(body, AppendJSONString([]byte(`"request_id":`), id))
}

// UsageHidden reports whether r, a chat or completion stream, gets no
// usage from any engine: stream_options absent or null, or its
// include_usage false or null, without continuous_usage_stats. The
// gateway then asks the engine for usage (WithUsage), which counts the
// stream's output exactly where its events may hold several tokens each,
// and keeps the engine's usage chunk from the client.
func (r *Request) UsageHidden() bool {
	return r.Kind.Generates() && r.Stream && !r.IncludeUsage && (!r.HasStreamOptions || r.HasIncludeUsage && !r.continuousUsage)
}

// WithUsage returns body, the body r was parsed from, with
// "stream_options": {"include_usage": true} in place of the client's (or
// first in its object, where it had none): of a request UsageHidden, the
// engines then add a usage chunk, and nothing else, to its stream. r's
// model offsets move with the bytes after the change; it is to be
// called before WithModel. The result is a new slice.
func (r *Request) WithUsage(body []byte) []byte {
	const options = `{"include_usage":true}`
	start, end := r.optionsAt[0], r.optionsAt[1]
	if end == 0 {
		return r.withFirst(body, []byte(`"stream_options":`+options))
	}
	out := make([]byte, 0, len(body)-(end-start)+len(options))
	out = append(append(append(out, body[:start]...), options...), body[end:]...)
	if r.modelAt[0] >= end {
		shift := len(out) - len(body)
		r.modelAt[0] += shift
		r.modelAt[1] += shift
	}
	return out
}

// withFirst returns body, the body r was parsed from, with member (a
// key, ':' and a value) first in its object; r's model offsets move with
// the bytes after it. The result is a new slice.
func (r *Request) withFirst(body, member []byte) []byte {
	open := bytes.IndexByte(body, '{') + 1
	if open == 0 {
		panic("BUG: openai: a member added to a body that is no object")
	}
	out := make([]byte, 0, len(body)+len(member)+1)
	out = append(append(out, body[:open]...), member...)
	if rest := bytes.TrimLeft(body[open:], " \t\r\n"); len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	if r.modelAt[1] != 0 {
		shift := len(out) - open
		r.modelAt[0] += shift
		r.modelAt[1] += shift
	}
	return append(out, body[open:]...)
}

// parseBool reads a boolean as the engines do (laxBool); null means
// false, the API's default.
func (r *Request) parseBool(s *scanner, param string) (bool, error) {
	v, raw, ok := r.laxBool(s)
	if !ok {
		return false, InvalidType(param, wantBool, raw)
	}
	return v, nil
}

// parseCount reads a token count as the engines read an integer (laxInt):
// a non-negative one up to MaxInt32, or null, which gives -1 (absent).
func (r *Request) parseCount(s *scanner, param string) (int, error) {
	if s.c() == 'n' {
		s.skip()
		return -1, nil
	}
	v, raw, ok := r.laxInt(s)
	if !ok || v < 0 || v > math.MaxInt32 {
		return -1, InvalidType(param, wantCount, raw)
	}
	return int(v), nil
}

// parseTruncation reads "truncate_prompt_tokens" as the engines read an
// integer (laxInt): null, -1 or a token count up to MaxInt32 (vLLM takes larger ones, to refuse them as more
// than the context holds); see Request.TruncatePromptTokens for why null,
// -1 and 0 all give 0. Any other value is bad: the 400 an engine that
// reads the field answers.
func (r *Request) parseTruncation(s *scanner) (keep int, bad *Error) {
	if s.c() == 'n' {
		s.skip()
		return 0, nil
	}
	switch v, raw, ok := r.laxInt(s); {
	case ok && v >= 0 && v <= math.MaxInt32:
		return int(v), nil
	case ok && v == -1:
		return 0, nil
	default:
		return 0, InvalidType("truncate_prompt_tokens", wantTruncation, raw)
	}
}

// parseTruncationSide reads "truncation_side": right is true for "right",
// false for "left" or null (vLLM then cuts on its tokenizer's side, the
// left for generative models). Any other value is bad, as in
// parseTruncation; err is a string the JSON grammar refuses.
func (r *Request) parseTruncationSide(s *scanner) (right bool, bad *Error, err error) {
	f := s.field()
	switch f.form {
	case 0:
		return false, nil, nil
	case '"':
	default:
		return false, InvalidType("truncation_side", wantSide, f.raw), nil
	}
	side, ok := r.text(f)
	switch {
	case !ok:
		return false, nil, InvalidJSON()
	case string(side) == "left":
		return false, nil, nil
	case string(side) == "right":
		return true, nil, nil
	}
	return false, InvalidValue("truncation_side", "must be "+wantSide+", got "+cut(s.b[f.start:s.p])), nil
}

// TruncationError is the 400 Engine answers to r's truncate_prompt_tokens
// or truncation_side, nil when their values are good or Engine does not
// read them (Kind.ReadsTruncation). Parse leaves them to it: only the
// caller knows the engine that serves r.
func (r *Request) TruncationError() *Error {
	if !r.Engine.ReadsTruncation() {
		return nil
	}
	if r.badTruncate != nil {
		return r.badTruncate
	}
	return r.badSide
}

// EngineRefusal is the 400 Engine answers to what Parse left to it, nil if
// it serves r: CacheSaltError first (vLLM checks the salt before reading
// the fields), else TruncationError.
func (r *Request) EngineRefusal() *Error {
	if e := r.CacheSaltError(); e != nil {
		return e
	}
	return r.TruncationError()
}

// parseChoices reads "n": null or absent is 1, and 0 is refused, as vLLM
// refuses it.
func (r *Request) parseChoices(s *scanner) error {
	n, err := r.parseCount(s, "n")
	switch {
	case err != nil:
		return err
	case n == 0:
		return InvalidValue("n", "must be at least 1")
	case n > 0:
		r.Choices = n
	}
	return nil
}

// parseStreamOptions reads "stream_options": an object whose include_usage
// is read and other keys skipped, or null.
func (r *Request) parseStreamOptions(s *scanner) error {
	r.HasStreamOptions, r.IncludeUsage, r.HasIncludeUsage, r.continuousUsage = false, false, false, false
	switch s.c() {
	case 'n':
		s.skip()
		return nil
	case '{':
	default:
		return InvalidType("stream_options", wantObject, s.b[s.skip():s.p])
	}
	r.HasStreamOptions = true
	s.open()
	for i := 0; s.more('}', i); i++ {
		switch b2s(s.key(&r.scratch)) {
		case "include_usage":
			r.HasIncludeUsage = true
			var err error
			if r.IncludeUsage, err = r.parseBool(s, "stream_options.include_usage"); err != nil {
				return err
			}
		case "continuous_usage_stats":
			// A value the engine refuses counts as set: the body goes on
			// as it came, for the engine to answer.
			v, _, ok := r.laxBool(s)
			r.continuousUsage = v || !ok
		default:
			s.skip()
		}
	}
	return nil
}

// parseCacheSalt reads "cache_salt": a string, the salt, or any other
// value, which keeps its text. Whether the engine takes it is
// CacheSaltError's to say.
func (r *Request) parseCacheSalt(s *scanner) error {
	r.CacheSalt, r.salt = r.CacheSalt[:0], engines.SaltOther
	start := s.p
	switch s.c() {
	case 'n':
		s.skip()
		r.salt = engines.SaltNull
		return nil
	case '"':
		r.salt = engines.SaltString
		raw, esc := s.str()
		var ok bool
		if r.CacheSalt, ok = appendUnquoted(r.CacheSalt, raw, esc); !ok {
			return InvalidJSON()
		}
		return nil
	case '[':
		r.salt = engines.SaltEmptyList
		s.open()
		for i := 0; s.more(']', i); i++ {
			switch {
			case s.c() != '"':
				r.salt = engines.SaltOther
			case r.salt == engines.SaltEmptyList:
				r.salt = engines.SaltList
			}
			s.skip()
		}
	default:
		s.skip()
	}
	// InvalidType shows at most gotLimit bytes, and "..." past them.
	r.saltGot = append(r.saltGot[:0], s.b[start:min(s.p, start+gotLimit+1)]...)
	return nil
}

// CacheSaltError is the 400 Engine answers to r's cache_salt, nil when it
// takes it (engines.Kind.CacheSaltFault). SGLang fails a list of salts
// with a 500: the gateway refuses it up front, as the client's fault,
// rather than count it against the pod.
func (r *Request) CacheSaltError() *Error {
	// vLLM checks a Responses or Messages request's salt as a chat's (its
	// ResponsesRequest's check_cache_salt_support; the chat request it
	// makes of a Messages one), and runs it as a chat.
	chat := r.Kind == KindChat || r.Kind == KindResponses || r.Kind == KindMessages
	switch r.Engine.CacheSaltFault(chat, r.salt, b2s(r.CacheSalt)) {
	case engines.SaltWrongType:
		if r.Engine == engines.SGLang {
			return InvalidType("cache_salt", "a string or a list of strings", r.saltGot)
		}
		return InvalidType("cache_salt", "a non-empty string", r.saltGot)
	case engines.SaltEmpty:
		return InvalidValue("cache_salt", "must not be empty")
	case engines.SaltBlank:
		return InvalidValue("cache_salt", "must not be blank")
	case engines.SaltBadChars:
		return InvalidValue("cache_salt", "must be at most "+strconv.Itoa(engines.MaxCacheSalt)+` characters and must not contain '@', '/', '\\' or NUL`)
	case engines.SaltListFails:
		return InvalidValue("cache_salt", "must be a string: SGLang's server fails a list of salts")
	case engines.SaltNoField:
		return InvalidValue("cache_salt", "is not a field of TensorRT-LLM's completion request")
	}
	return nil
}

// parseMessages reads "messages" and renders them into r.Prompt. seen is
// false for null, which counts as absent.
func (r *Request) parseMessages(s *scanner) (seen bool, err error) {
	r.Prompt, r.Messages, r.MediaBytes, r.media = r.Prompt[:0], 0, 0, 0
	switch s.c() {
	case 'n':
		s.skip()
		return false, nil
	case '[':
	default:
		return false, InvalidType("messages", wantList, s.b[s.skip():s.p])
	}
	s.open()
	for ; s.more(']', r.Messages); r.Messages++ {
		if err := r.parseMessage(s); err != nil {
			return false, err
		}
	}
	if r.Messages == 0 {
		return false, InvalidValue("messages", "must not be empty")
	}
	r.Prompt = append(r.Prompt, tokenize.GenerationPrompt...)
	return true, nil
}

// parseMessage reads the message at s.p, r.Messages being its index, and
// renders it as one chat turn. The turn is rendered only once the whole
// object has been read, because "role" may follow "content" and a repeated
// key's last value wins; string values are kept as spans of the body, so
// they are not scanned twice.
func (r *Request) parseMessage(s *scanner) error {
	i := r.Messages
	if s.c() != '{' {
		return InvalidType(indexPath("messages", i, ""), wantObject, s.b[s.skip():s.p])
	}
	s.open()
	var role, c field
	for k := 0; s.more('}', k); k++ {
		switch b2s(s.key(&r.scratch)) {
		case "role":
			role = s.field()
		case "content":
			c = s.field()
		default:
			s.skip()
		}
	}
	switch role.form {
	case '"':
	case 0:
		return MissingParam(indexPath("messages", i, ".role"))
	default:
		return InvalidType(indexPath("messages", i, ".role"), wantString, role.raw)
	}
	roleText, ok := r.text(role)
	if !ok {
		return InvalidJSON()
	}
	r.Prompt = tokenize.AppendTurnOpen(r.Prompt, roleText)
	switch c.form {
	case 0: // absent or null: assistant turns that only call tools
	case '"':
		if r.Prompt, ok = appendUnquoted(r.Prompt, c.raw, c.esc); !ok {
			return InvalidJSON()
		}
	case '[':
		if err := r.renderParts(&scanner{b: s.b, p: c.start}, i); err != nil {
			return err
		}
	default:
		return InvalidType(indexPath("messages", i, ".content"), wantContent, c.raw)
	}
	r.Prompt = tokenize.AppendTurnClose(r.Prompt)
	return nil
}

// renderParts appends the text parts of message i's content list (s on its
// '[') to r.Prompt, separated by "\n", and adds the other parts' raw sizes to
// r.MediaBytes. Parts are read as vLLM reads them (chat_utils.py): a bare
// string is text; text, input_text and output_text parts hold their text
// in "text", refusal and thinking parts in "refusal" and "thinking", and
// one whose text is null, absent or empty is skipped; a part without a type is
// media when it holds a media field.
func (r *Request) renderParts(s *scanner, i int) error {
	s.open()
	texts := 0
	for j := 0; s.more(']', j); j++ {
		start := s.p
		var text field
		switch s.c() {
		case '"':
			text = s.field()
		case '{':
			var err error
			if text, err = r.readPart(s, i, j); err != nil {
				return err
			}
		default:
			return InvalidType(partPath(i, j, ""), wantPart, s.b[s.skip():s.p])
		}
		switch {
		case text.form == 0, text.form == '"' && len(text.raw) == 0:
			// No text, or an empty one: skipped, as vLLM skips it.
			continue
		case text.form == 'm':
			r.MediaBytes += s.p - start
			r.media = radix.Extend(r.media, xxhash.Sum64(s.b[start:s.p]))
			continue
		}
		if texts > 0 {
			r.Prompt = append(r.Prompt, '\n')
		}
		texts++
		var ok bool
		if r.Prompt, ok = appendUnquoted(r.Prompt, text.raw, text.esc); !ok {
			return InvalidJSON()
		}
	}
	return nil
}

// readPart reads the content part object at s.p (part j of message i) and
// returns its text: a string field, form 0 for a text part without text,
// or form 'm' for a media part.
func (r *Request) readPart(s *scanner, i, j int) (field, error) {
	s.open()
	var typ field
	var texts [3]field // "text", "refusal", "thinking"
	media := false
	for k := 0; s.more('}', k); k++ {
		switch key := b2s(s.key(&r.scratch)); key {
		case "type":
			typ = s.field()
		case "text":
			texts[0] = s.field()
		case "refusal":
			texts[1] = s.field()
		case "thinking":
			texts[2] = s.field()
		default:
			media = media || mediaField(key)
			s.skip()
		}
	}
	switch typ.form {
	case '"':
	case 0:
		if media {
			return field{form: 'm'}, nil
		}
		return field{}, MissingParam(partPath(i, j, ".type"))
	default:
		return field{}, InvalidType(partPath(i, j, ".type"), wantString, typ.raw)
	}
	typText, ok := r.text(typ)
	if !ok {
		return field{}, InvalidJSON()
	}
	var text field
	var name string
	switch b2s(typText) {
	case "text", "input_text", "output_text":
		text, name = texts[0], ".text"
	case "refusal":
		text, name = texts[1], ".refusal"
	case "thinking":
		text, name = texts[2], ".thinking"
	default:
		return field{form: 'm'}, nil
	}
	if text.form != 0 && text.form != '"' {
		return field{}, InvalidType(partPath(i, j, name), wantString, text.raw)
	}
	return text, nil
}

// mediaField says whether a part's key is one that makes a part without a
// type a media part in vLLM (_parse_chat_message_content_mm_part).
func mediaField(key string) bool {
	switch key {
	case "image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url", "input_audio", "video_url", "tool_reference":
		return true
	}
	return false
}

// text returns the string f holds, unescaped into r.scratch if need be
// (valid until the next key is read).
func (r *Request) text(f field) (text []byte, ok bool) {
	if !f.esc {
		return f.raw, true
	}
	r.scratch, ok = appendUnquoted(r.scratch[:0], f.raw, true)
	return r.scratch, ok
}

// parsePrompt reads "prompt": a string, a list of strings, a list of token
// ids, or a list of lists of token ids; the first element of a list decides
// which. seen is false for null, which counts as absent.
func (r *Request) parsePrompt(s *scanner) (seen bool, err error) {
	r.Prompt, r.PromptIDs, r.TokenIDs, r.ends = r.Prompt[:0], r.PromptIDs[:0], false, r.ends[:0]
	switch s.c() {
	case 'n':
		s.skip()
		return false, nil
	case '"':
		raw, esc := s.str()
		var ok bool
		if r.Prompt, ok = appendUnquoted(r.Prompt, raw, esc); !ok {
			return false, InvalidJSON()
		}
		return true, nil
	case '[':
	default:
		return false, InvalidType("prompt", wantPromptForm, s.b[s.skip():s.p])
	}
	s.open()
	elems := s.p
	first := s.c()
	if first == ']' {
		return false, InvalidValue("prompt", "must not be an empty list")
	}
	r.TokenIDs = first != '"'
	for j := 0; s.more(']', j); j++ {
		switch c := s.c(); {
		case first == '"' && c != '"' && c != '[':
			// Strings beside other values are no batch of texts: the
			// engines' prompt, a union, takes the list as one prompt of
			// ids, each read as a lax int ("2" is 2). Read again so.
			s.p, first, j = elems, '0', -1
			r.Prompt, r.ends, r.TokenIDs = r.Prompt[:0], r.ends[:0], true
		case first == '"' && c == '"':
			raw, esc := s.str()
			var ok bool
			if r.Prompt, ok = appendUnquoted(r.Prompt, raw, esc); !ok {
				return false, InvalidJSON()
			}
			r.ends = append(r.ends, len(r.Prompt))
		case first == '[' && c == '[':
			s.open()
			for k := 0; s.more(']', k); k++ {
				if err := r.parseTokenID(s, j, k); err != nil {
					return false, err
				}
			}
			r.ends = append(r.ends, len(r.PromptIDs))
		case first != '"' && first != '[':
			if err := r.parseTokenID(s, j, -1); err != nil {
				return false, err
			}
		default:
			return false, InvalidType(indexPath("prompt", j, ""), promptElementForm(first), s.b[s.skip():s.p])
		}
	}
	return true, nil
}

// parsePromptEmbeds steps over vLLM's "prompt_embeds" (the base64 of a
// tensor, or a list of them, a batch), which the engine prompts with
// besides or instead of "prompt": seen when it is neither null nor an
// empty list. Its bytes weigh the request as a media part's do, and make
// it Unindexed: the gateway cannot tell the blocks its embeddings fill.
func (r *Request) parsePromptEmbeds(s *scanner) (seen bool) {
	start := s.skip()
	v := s.b[start:s.p]
	if !nonEmpty(v) {
		return false
	}
	r.MediaBytes += len(v)
	r.media = radix.Extend(r.media, xxhash.Sum64(v))
	return true
}

// parseTokenID appends the token id at s.p to r.PromptIDs; j and k index it
// within the prompt for an error message (k < 0 for a flat list), whose
// path is built only when there is an error.
func (r *Request) parseTokenID(s *scanner, j, k int) error {
	start := s.p
	if c := s.c(); c >= '0' && c <= '9' {
		if v, _, ok := s.uint(math.MaxUint32); ok {
			r.PromptIDs = append(r.PromptIDs, uint32(v))
			return nil
		}
		s.p = start
	}
	// Not a plain id: the engines' list of ints takes what laxInt does.
	v, raw, ok := r.laxInt(s)
	if ok && v >= 0 && v <= math.MaxUint32 {
		r.PromptIDs = append(r.PromptIDs, uint32(v))
		return nil
	}
	param := indexPath("prompt", j, "")
	if k >= 0 {
		param = indexPath(param, k, "")
	}
	return InvalidType(param, wantTokenID, raw)
}

// promptElementForm names what every element of a prompt list must be,
// given its first element.
func promptElementForm(first byte) string {
	switch first {
	case '"':
		return wantString
	case '[':
		return "a list of token ids"
	}
	return wantTokenID
}

// indexPath renders "name[i]suffix" for error messages.
func indexPath(name string, i int, suffix string) string {
	return name + "[" + strconv.Itoa(i) + "]" + suffix
}

// partPath renders "messages[i].content[j]suffix" for error messages.
func partPath(i, j int, suffix string) string {
	return indexPath("messages", i, ".content") + "[" + strconv.Itoa(j) + "]" + suffix
}
