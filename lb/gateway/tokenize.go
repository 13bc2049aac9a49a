package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"

	"pdlb/engines/chat"
	"pdlb/engines/prompt"
	"pdlb/engines/tokenize"
	"pdlb/lb/openai"
	"pdlb/lb/pool"
	"pdlb/radix"
)

// tokenMode says how a request's prompt became the token ids its block
// keys are made of.
type tokenMode uint8

const (
	// tokensStandIn: the model names no tokenizer; the stand-in's ids
	// match the gateway's own picks but no engine's KV events.
	tokensStandIn tokenMode = iota
	// tokensExact: the model's tokenizer and chat template, or the
	// client's own token ids: the ids the engine computes.
	tokensExact
	// tokensUnindexed: the engine's keys cannot be made here (non-text
	// content, a template the engine renders differently from Python, no
	// template): the request is routed without the KV-event index.
	tokensUnindexed
	numTokenModes
)

var tokenModeNames = [numTokenModes]string{"stand_in", "exact", "unindexed"}

// tokenize gives x the ids m's engine computes for its prompt, when m has
// a tokenizer, and counts how x's keys will be made. A truncation or a
// cache salt m's engine refuses, or, on vLLM, a chat it would refuse
// before rendering, fails the request with the engine's 400; anything
// else the gateway cannot render exactly routes the request without the
// index.
// It runs before the pick, on the connection's loop or worker: a chat
// whose earlier turns were seen costs tens of microseconds (the
// tokenizer's segment cache; engines/prompt's benchmarks). With fast, a
// chat is rendered on its template's fast path alone, and encoded only if
// little of it is new: later says it was not (its template renders it with
// the Jinja engine, or more than unseenOnLoopMax of its text is new to the
// tokenizer), nothing counted, for a worker to tokenize whole.
func (g *Gateway) tokenize(x *completion, m *pool.Model, body []byte, fast bool) (f *failure, later bool) {
	x.ids, x.idEnds, x.req.Tokens, x.req.Engine = x.ids[:0], x.idEnds[:0], 0, m.Engine
	if !x.req.Kind.Outputs() {
		return nil, false // no prompt was read
	}
	if e := x.req.EngineRefusal(); e != nil {
		return answer(e), false
	}
	mode, encodes := keying(x, m)
	switch {
	case !encodes:
	case x.req.Kind == openai.KindChat, x.req.Kind == openai.KindResponses, x.req.Kind == openai.KindMessages:
		special := x.req.SpecialTokensSet && x.req.SpecialTokens
		var err error
		switch {
		case x.req.Kind == openai.KindResponses:
			x.ids, err = m.Prompt.Responses(x.ids, body)
		case x.req.Kind == openai.KindMessages:
			x.ids, err = m.Prompt.Messages(x.ids, body)
		case fast:
			if x.ids, err = m.Prompt.ChatFast(x.ids, body, special, unseenOnLoopMax); err == chat.ErrJinja || err == prompt.ErrUnseen {
				return nil, true
			}
		default:
			x.ids, err = m.Prompt.Chat(x.ids, body, special)
		}
		if err != nil {
			// A Messages request vLLM refuses is refused by the engine,
			// in Anthropic's shape.
			if x.req.Kind != openai.KindMessages {
				if f := refusal(err, m); f != nil {
					return f, false
				}
			}
			mode = tokensUnindexed
			x.ids = x.ids[:0]
			// A Responses request with tools, reasoning or a previous
			// response, and a Messages request with system-role messages
			// or images, are rendered by the engine alone, as expected.
			if x.req.Kind == openai.KindChat {
				if held, ok := g.inexactLog.Allow(time.Now().UnixNano(), time.Second); ok {
					g.log.Warn("prompt not tokenized as the engine would; routed without the KV-event index",
						"model", m.Name, "err", err, "suppressed", held)
				}
			}
		} else if k, right := x.req.Truncation(); k > 0 {
			// The engine caches and counts only the ids it keeps.
			x.ids = m.Prompt.Tokenizer().Truncate(x.ids, k, right, special)
		}
	default:
		// A batch's prompts are the engine's separate requests: each is
		// tokenized and cut on its own, and their ids are concatenated.
		k, right := x.req.Truncation()
		x.ids, x.idEnds = m.Prompt.Batch(x.ids, x.idEnds, x.req.Batch(), x.req.BatchPrompt, !x.req.SpecialTokensSet || x.req.SpecialTokens, k, right)
	}
	if len(x.ids) > 0 {
		x.req.Tokens = len(x.ids)
	}
	g.metrics.model(m).tokenized[mode].Inc()
	return nil, false
}

// keying says how the keys of x, whose prompt is read, are made on m:
// encodes, by m's tokenizer (the mode then tokensExact, unless rendering
// fails), else as mode says.
func keying(x *completion, m *pool.Model) (mode tokenMode, encodes bool) {
	switch {
	case x.req.Unindexed():
		return tokensUnindexed, false
	case x.req.TokenIDs:
		return tokensExact, false
	case m.Prompt == nil:
		return tokensStandIn, false
	case x.req.Kind == openai.KindMessages && !m.Engine.ConvertsMessagesAsVLLM():
		return tokensUnindexed, false
	}
	return tokensExact, true
}

// refusal is the 400 for a chat vLLM refuses before rendering, when m's
// engine refuses it as vLLM does (on a model mixing engines, m.Engine is
// vLLM only when every pod is); nil for any other error. (Apart from
// tokenize, so its error variable does not escape on every request.)
func refusal(err error, m *pool.Model) *failure {
	var refused *chat.RequestError
	if !m.Engine.RefusesChatAsVLLM() || !errors.As(err, &refused) {
		return nil
	}
	return &failure{E: &openai.Error{Status: http.StatusBadRequest, Type: openai.TypeInvalidRequest,
		Param: refused.Param, Code: openai.CodeInvalidValue, Message: refused.Message}}
}

// appendKeys appends the block keys of x's prompt on m to dst, and for a
// completion batch where each prompt's keys end to chains: each prompt is
// the engine's request of its own, whose blocks it hashes from the root.
func appendKeys(dst []uint64, chains []int, m *pool.Model, x *completion) ([]uint64, []int) {
	seed := x.req.KeySeed(keySeed(m, x))
	if len(x.ids) > 0 {
		// The ids tokenize made.
		return radix.AppendBatchKeys(dst, chains, seed, x.ids, x.idEnds, m.BlockSize)
	}
	n := x.req.Batch()
	if n == 1 {
		return appendPromptKeys(dst, seed, m, x, 0), chains
	}
	for i := range n {
		dst = appendPromptKeys(dst, seed, m, x, i)
		chains = append(chains, len(dst))
	}
	return dst, chains
}

// appendPromptKeys appends the keys of prompt i of x's batch, from seed:
// from the client's ids, or the stand-in's rendering, cut as the engine
// cuts them.
func appendPromptKeys(dst []uint64, seed uint64, m *pool.Model, x *completion, i int) []uint64 {
	if x.req.TokenIDs {
		return radix.AppendBlockKeys(dst, seed, x.req.BatchIDsKept(i), m.BlockSize)
	}
	return tokenize.AppendBlockKeys(dst, seed, x.req.BatchPromptKept(i), m.BlockSize)
}

// serveIndexMatch is POST /admin/index/match: which pods hold the blocks
// of a prompt given as token ids ({"model", "ids", "ends", "cache_salt"}),
// as pdlb tokenize --admin asks. ends, for a completion batch, is where
// each prompt's ids end: each is keyed from the root and a pod's cached
// tokens are the prompts' sum, as lookup counts them. model may name an
// adapter: its blocks are keyed apart from its base model's.
func (g *Gateway) serveIndexMatch(w http.ResponseWriter, r *http.Request) {
	var q struct {
		Model     string   `json:"model"`
		IDs       []uint32 `json:"ids"`
		Ends      []int    `json:"ends"`
		CacheSalt string   `json:"cache_salt"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&q); err != nil {
		http.Error(w, "the body must be {\"model\": ..., \"ids\": [...], \"ends\": [...], \"cache_salt\": ...}: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(q.Ends) > 0 && (!slices.IsSorted(q.Ends) || q.Ends[0] < 0 || q.Ends[len(q.Ends)-1] != len(q.IDs)) {
		http.Error(w, "ends must rise from 0 to the number of ids, where each prompt's ids end", http.StatusBadRequest)
		return
	}
	m, a := g.pool.Load().Resolve([]byte(q.Model))
	if m == nil {
		g.modelNotFound(w, q.Model)
		return
	}
	seed := m.Seed
	if a != nil {
		seed = a.Seed
	}
	keys, chains := radix.AppendBatchKeys(nil, nil, radix.SeedWith(seed, "", q.CacheSalt), q.IDs, q.Ends, m.BlockSize)
	depth := make([]int32, m.Slots)
	m.Prefix.MatchChains(keys, chains, depth, make([]int32, m.Slots))
	type hit struct {
		Pod          string `json:"pod"`
		CachedTokens int    `json:"cached_tokens"`
	}
	out := struct {
		Model     string `json:"model"`
		BlockSize int    `json:"block_size"`
		Blocks    int    `json:"blocks"`
		Pods      []hit  `json:"pods"`
	}{Model: m.Name, BlockSize: m.BlockSize, Blocks: len(keys), Pods: []hit{}}
	for _, p := range m.Pods {
		out.Pods = append(out.Pods, hit{Pod: p.Config.Name, CachedTokens: int(depth[p.Slot]) * m.BlockSize})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
