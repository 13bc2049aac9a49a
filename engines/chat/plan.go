package chat

import (
	"bytes"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// A plan is a template's rendering of plain text conversations learnt by
// probing: the prompt is gap(before message 0) + content 0 + gap(0→1) +
// content 1 + ... + tail, where each gap depends only on the contexts of
// the two messages around it and the tail on the last message's context
// and add_generation_prompt. A context is the role, whether the message is
// first, last, and after the last user message (Qwen3 renders reasoning
// there). Gaps are read from Jinja renders of every role sequence up to
// probeDepth messages with sentinel contents; a gap seen with two values
// is left unknown. The plan is then rendered against Jinja on random
// conversations; one difference drops it.
//
// The envelope, checked per request: roles system, user and assistant;
// string contents, not empty or blank, without a trigger literal of the
// template, with whitespace at their edges only in contexts where padded
// probes came out as given; no name, tool calls, reasoning, tools,
// continue_final_message or media; not a request's own template; kwargs
// with scalar values, a plan learnt per distinct set (and per day for a
// template calling strftime_now). Anything else renders with Jinja.
type plan struct {
	gaps  [numCtx + 1][numCtx]gap // [prev context + 1][context]
	tails [numCtx][2]gap          // [last context][add_generation_prompt]
	// triggers grouped by first byte: a content is scanned once per
	// distinct first byte, and each hit tried against its group.
	firsts   []byte
	triggers [][][]byte
	// padded[cx] is set when probes showed contents of context cx written
	// as given even with whitespace at their edges (no strip or trim).
	padded    [numCtx]bool
	paddedBad [numCtx]bool
}

type gap struct {
	s     string
	known bool
	bad   bool // seen with two values
}

const (
	planRoles  = 3 // system, user, assistant: roleSystem..roleAssistant
	numCtx     = planRoles * 8
	probeDepth = 5
	// verifyConversations random conversations check a learnt plan.
	verifyConversations = 300
	maxPlansPerTemplate = 8
	dayLayout           = "2006-01-02"
)

func context(role int, first, last, afterUser bool) int {
	x := role << 3
	if first {
		x |= 4
	}
	if last {
		x |= 2
	}
	if afterUser {
		x |= 1
	}
	return x
}

// render appends c's prompt by copying; false when c needs a gap the
// probes never saw (dst is then unchanged).
func (p *plan) render(dst []byte, c *Conversation, segs bool) ([]byte, bool) {
	start := len(dst)
	lastUser := -1
	for i := range c.msgs {
		if c.msgs[i].role == roleUser {
			lastUser = i
		}
	}
	prev := -1
	n := len(c.msgs)
	for i := range c.msgs {
		m := &c.msgs[i]
		cx := context(m.role, i == 0, i == n-1, i > lastUser)
		g := &p.gaps[prev+1][cx]
		if !g.known || !p.padded[cx] && edgeSpace(c.bytes(m.content)) {
			return dst[:start], false
		}
		dst = append(dst, g.s...)
		lo := len(dst) - start
		dst = append(dst, c.bytes(m.content)...)
		if segs {
			c.seg = append(c.seg, Segment{Start: lo, End: len(dst) - start})
		}
		prev = cx
	}
	gen := 0
	if c.addGenerationPrompt {
		gen = 1
	}
	g := &p.tails[prev][gen]
	if !g.known {
		return dst[:start], false
	}
	return append(dst, g.s...), true
}

// inEnvelope reports whether c is a conversation the plan renders.
func (p *plan) inEnvelope(c *Conversation) bool {
	if c.hasTools || c.continueFinalMessage {
		return false
	}
	for i := range c.msgs {
		m := &c.msgs[i]
		if m.role > roleAssistant || m.contentKind != contentString || m.hasName || m.hasReason || !m.toolCalls.empty() {
			return false
		}
		if !p.contentOK(c.bytes(m.content)) {
			return false
		}
	}
	return true
}

// contentOK: not empty or only whitespace (templates test contents for
// truth, or strip them first), without a trigger literal.
func (p *plan) contentOK(b []byte) bool {
	if len(b) == 0 || edgeSpace(b) && len(bytes.TrimFunc(b, isPySpace)) == 0 {
		return false
	}
	for g, f := range p.firsts {
		for at := 0; ; at++ {
			i := bytes.IndexByte(b[at:], f)
			if i < 0 {
				break
			}
			at += i
			for _, lit := range p.triggers[g] {
				if bytes.HasPrefix(b[at:], lit) {
					return false
				}
			}
		}
	}
	return true
}

// addTrigger files a trigger literal under its first byte.
func (p *plan) addTrigger(lit string) {
	g := bytes.IndexByte(p.firsts, lit[0])
	if g < 0 {
		g = len(p.firsts)
		p.firsts = append(p.firsts, lit[0])
		p.triggers = append(p.triggers, nil)
	}
	p.triggers[g] = append(p.triggers[g], []byte(lit))
}

// edgeSpace reports whitespace, as Python's str.strip sees it, at either
// end of b.
func edgeSpace(b []byte) bool {
	r, _ := utf8.DecodeRune(b)
	l, _ := utf8.DecodeLastRune(b)
	return isPySpace(r) || isPySpace(l)
}

// Warm learns the fast path of requests that bring no
// chat_template_kwargs of their own (defaults alone) and returns once it
// is known, so a model loaded at start-up serves its first requests on
// it rather than on Jinja.
func (t *Template) Warm(defaults map[string]any) {
	c := AcquireConversation()
	defer ReleaseConversation(c)
	if c.ParseRequest([]byte(`{"messages":[{"role":"user","content":"warm"}]}`)) == nil {
		t.planFor(c, defaults)
	}
	t.learners.Wait()
}

// planFor returns the verified plan for c's kwargs, or nil: c outside the
// envelope, no plan for the template, or one still being learnt.
func (t *Template) planFor(c *Conversation, defaults map[string]any) *plan {
	if t.noPlan {
		return nil
	}
	key, ok := c.kwargsKey(defaults)
	if !ok {
		return nil
	}
	if t.timeBound {
		// strftime_now prints the day: a plan holds for one day.
		key = time.Now().AppendFormat(append(key, 1), dayLayout)
		c.key = key
	}
	plans := *t.plans.Load()
	p, seen := plans[string(key)]
	if !seen {
		t.startLearning(c, defaults, string(key))
		return nil
	}
	if p == nil || !p.inEnvelope(c) {
		return nil
	}
	return p
}

// startLearning learns the plan for key in the background, one learner
// per template at a time: probing takes hundreds of Jinja renders, which
// no request should wait for. Requests render with Jinja meanwhile.
func (t *Template) startLearning(c *Conversation, defaults map[string]any, key string) {
	t.plansMu.Lock()
	defer t.plansMu.Unlock()
	if t.learning {
		return
	}
	if _, ok := (*t.plans.Load())[key]; ok {
		return
	}
	if len(t.livePlans(key)) >= maxPlansPerTemplate {
		return
	}
	kw := map[string]jinja.Value{}
	var d decoder
	if err := kwargsInto(kw, c, defaults, &d); err != nil || d.inexact(t) {
		t.storePlan(key, nil)
		return
	}
	t.learning = true
	t.learners.Add(1)
	go func() {
		defer t.learners.Done()
		p := t.probe(kw)
		t.plansMu.Lock()
		defer t.plansMu.Unlock()
		t.storePlan(key, p)
		t.learning = false
	}()
}

// livePlans is the plans map without other days' plans of a template that
// prints the day. Called with plansMu held.
func (t *Template) livePlans(key string) map[string]*plan {
	old := *t.plans.Load()
	if !t.timeBound {
		return old
	}
	day := key[strings.LastIndexByte(key, 1):]
	live := maps.Clone(old)
	maps.DeleteFunc(live, func(k string, _ *plan) bool { return !strings.HasSuffix(k, day) })
	return live
}

// storePlan publishes a copy of the plans with key's plan set (nil: no
// fast path). Called with plansMu held.
func (t *Template) storePlan(key string, p *plan) {
	next := maps.Clone(t.livePlans(key))
	next[key] = p
	t.plans.Store(&next)
}

// probe learns and verifies a plan for one set of kwargs.
func (t *Template) probe(kw map[string]jinja.Value) *plan {
	p := &plan{}
	for _, lit := range t.triggers {
		p.addTrigger(lit)
	}
	roles := make([]int, 0, probeDepth)
	var walk func()
	walk = func() {
		if len(roles) > 0 {
			for gen := 0; gen < 2; gen++ {
				t.probeOne(p, kw, roles, gen)
			}
		}
		if len(roles) > 0 && len(roles) < probeDepth {
			for gen := 0; gen < 2; gen++ {
				t.probePadded(p, kw, roles, gen)
			}
		}
		if len(roles) == probeDepth {
			return
		}
		for r := 0; r < planRoles; r++ {
			roles = append(roles, r)
			walk()
			roles = roles[:len(roles)-1]
		}
	}
	walk()
	for cx := range p.padded {
		p.padded[cx] = p.padded[cx] && !p.paddedBad[cx]
	}
	if !t.verify(p, kw) {
		return nil
	}
	return p
}

func sentinel(i int) string { return "pdlbQ" + strconv.Itoa(1000+i) + "Zx" }

// probeRender renders one role sequence with sentinel contents, each
// between before and after, for add_generation_prompt gen (0 or 1); it
// returns the prompt, the contents and each message's context.
func (t *Template) probeRender(kw map[string]jinja.Value, roles []int, gen int, before, after string) (out string, contents []string, cxs []int, ok bool) {
	contents = make([]string, len(roles))
	for i := range roles {
		contents[i] = before + sentinel(i) + after
	}
	out, err := t.jinjaPlain(kw, roles, contents, gen == 1)
	if err != nil {
		return "", nil, nil, false
	}
	lastUser := -1
	for i, r := range roles {
		if r == roleUser {
			lastUser = i
		}
	}
	cxs = make([]int, len(roles))
	for i, r := range roles {
		cxs[i] = context(r, i == 0, i == len(roles)-1, i > lastUser)
	}
	return out, contents, cxs, true
}

// probeOne renders one role sequence with sentinel contents and records
// the gaps between them.
func (t *Template) probeOne(p *plan, kw map[string]jinja.Value, roles []int, gen int) {
	out, contents, cxs, ok := t.probeRender(kw, roles, gen, "", "")
	if !ok {
		return
	}
	pos, prev := 0, -1
	for i, cx := range cxs {
		at := strings.Index(out[pos:], contents[i])
		if at < 0 || strings.Count(out, contents[i]) != 1 {
			return
		}
		record(&p.gaps[prev+1][cx], out[pos:pos+at])
		pos += at + len(contents[i])
		prev = cx
	}
	record(&p.tails[prev][gen], out[pos:])
}

// Whitespace the padded probes put around sentinels.
const (
	padBefore = "\r\n \t\u00a0"
	padAfter  = "\u00a0\t \n\r"
)

// probePadded renders a role sequence with whitespace around each
// sentinel and marks each context whose content came out as given, in the
// gaps the plain probes learnt.
func (t *Template) probePadded(p *plan, kw map[string]jinja.Value, roles []int, gen int) {
	out, contents, cxs, ok := t.probeRender(kw, roles, gen, padBefore, padAfter)
	if !ok {
		return
	}
	pos, prev := 0, -1
	for i, cx := range cxs {
		g := &p.gaps[prev+1][cx]
		if !g.known || !strings.HasPrefix(out[pos:], g.s+contents[i]) {
			// Later messages cannot be judged once one is off.
			p.paddedBad[cx] = true
			return
		}
		p.padded[cx] = true
		pos += len(g.s) + len(contents[i])
		prev = cx
	}
	if tail := &p.tails[prev][gen]; !tail.known || out[pos:] != tail.s {
		p.paddedBad[prev] = true
	}
}

func record(g *gap, s string) {
	switch {
	case g.bad:
	case !g.known:
		g.s, g.known = s, true
	case g.s != s:
		g.s, g.known, g.bad = "", false, true
	}
}

// jinjaPlain renders a conversation of plain string contents with Jinja.
func (t *Template) jinjaPlain(kw map[string]jinja.Value, roles []int, contents []string, gen bool) (string, error) {
	c := AcquireConversation()
	defer ReleaseConversation(c)
	for i, r := range roles {
		lo := len(c.arena)
		c.arena = append(c.arena, contents[i]...)
		c.msgs = append(c.msgs, message{role: r, contentKind: contentString, content: span{uint32(lo), uint32(len(c.arena))}})
	}
	c.addGenerationPrompt = gen
	data := make(map[string]jinja.Value, len(kw)+len(t.special)+4)
	for k, v := range t.special {
		data[k] = v
	}
	for k, v := range kw {
		data[k] = v
	}
	var d decoder
	msgs, err := t.messagesValue(c, &d)
	if err != nil {
		return "", err
	}
	data[jsonFunc] = jsonCallable
	data["messages"] = msgs
	data["tools"] = jinja.None()
	data["documents"] = jinja.None()
	data["add_generation_prompt"] = jinja.NewBool(gen)
	return t.eng.RenderValues(data)
}

// contentPieces build verification contents: words, punctuation, markup
// the templates use around contents, whitespace inside, non-ASCII.
var contentPieces = []string{
	"hello", "world", "user", "assistant", "system", "tool", "the", "42",
	" ", "  ", "\n", "\n\n", "\t", ",", ".", "?", "!", "{", "}", "{{", "%}",
	"'", "\"", "\\", "<", ">", "|", "#", "é", "中文", "🙂", "think", "im_start",
	"json", "none", "None", "true", "[", "]", ":", "-", "_", "/", "=",
}

// verify renders random conversations both ways; any difference rejects
// the plan.
func (t *Template) verify(p *plan, kw map[string]jinja.Value) bool {
	rng := rand.New(rand.NewPCG(7, uint64(len(t.src))))
	checked := 0
	for k := range verifyConversations {
		n := 1 + rng.IntN(12)
		if k%16 == 0 {
			n = 13 + rng.IntN(52) // a few long chats
		}
		roles := make([]int, n)
		contents := make([]string, n)
		for i := range roles {
			roles[i] = rng.IntN(planRoles)
			contents[i] = randomContent(rng, p)
		}
		for gen := 0; gen < 2; gen++ {
			want, err := t.jinjaPlain(kw, roles, contents, gen == 1)
			if err != nil {
				continue
			}
			c := AcquireConversation()
			for i, r := range roles {
				lo := len(c.arena)
				c.arena = append(c.arena, contents[i]...)
				c.msgs = append(c.msgs, message{role: r, contentKind: contentString, content: span{uint32(lo), uint32(len(c.arena))}})
			}
			c.addGenerationPrompt = gen == 1
			got, ok := p.render(nil, c, false)
			ReleaseConversation(c)
			if !ok {
				continue
			}
			if string(got) != want {
				return false
			}
			checked++
		}
	}
	return checked > 0
}

func randomContent(rng *rand.Rand, p *plan) string {
	for {
		var b strings.Builder
		for range 1 + rng.IntN(12) {
			b.WriteString(contentPieces[rng.IntN(len(contentPieces))])
		}
		if s := b.String(); p.contentOK([]byte(s)) {
			return s
		}
	}
}

// kwPair is one effective kwarg, name and canonical value, in c.arena.
type kwPair struct{ k, v span }

// kwargsKey builds in c.key a canonical text of the effective kwargs
// (defaults under the request's, reasoning_effort's enable_thinking),
// false when a value is not a scalar: such requests use Jinja.
func (c *Conversation) kwargsKey(defaults map[string]any) ([]byte, bool) {
	mark := len(c.arena)
	defer func() { c.arena = c.arena[:mark] }()
	c.kwKeys = c.kwKeys[:0]
	for k, v := range defaults {
		if reservedKwargs[k] {
			continue
		}
		lo := len(c.arena)
		c.arena = append(c.arena, k...)
		ks := span{uint32(lo), uint32(len(c.arena))}
		lo = len(c.arena)
		switch x := v.(type) {
		case nil:
			c.arena = append(c.arena, 'N')
		case bool:
			c.arena = strconv.AppendBool(append(c.arena, 'B'), x)
		case string:
			c.arena = append(append(c.arena, 'S'), x...)
		case int:
			c.arena = strconv.AppendInt(append(c.arena, 'I'), int64(x), 10)
		case float64:
			c.arena = strconv.AppendFloat(append(c.arena, 'F'), x, 'g', -1, 64)
		default:
			return nil, false
		}
		c.setKw(ks, span{uint32(lo), uint32(len(c.arena))})
	}
	userThinking := false
	if c.hasKwargs {
		var s scanner
		s.reset(c.bytes(c.kwargs))
		s.pos++
		first := true
		for s.more(&first, '}') {
			var ks span
			c.arena, ks = s.key(c.arena)
			lo := len(c.arena)
			switch ch := s.peek(); {
			case ch == 'n':
				s.isNull()
				c.arena = append(c.arena, 'N')
			case ch == 't' || ch == 'f':
				b, _ := s.boolean()
				c.arena = strconv.AppendBool(append(c.arena, 'B'), b)
			case ch == '"':
				c.arena = append(c.arena, 'S')
				c.arena, _ = s.str(c.arena)
			case ch == '-' || ch >= '0' && ch <= '9':
				text, isInt := s.number()
				if !isInt {
					return nil, false
				}
				c.arena = append(append(c.arena, 'I'), text...)
			default:
				return nil, false
			}
			if s.err != nil {
				return nil, false
			}
			name := c.bytes(ks)
			if reservedKwargs[string(name)] {
				continue
			}
			userThinking = userThinking || string(name) == "enable_thinking"
			c.setKw(ks, span{uint32(lo), uint32(len(c.arena))})
		}
	}
	if c.hasReasoningEffort {
		c.arena = append(c.arena, "reasoning_effort"...)
		ks := span{uint32(len(c.arena) - len("reasoning_effort")), uint32(len(c.arena))}
		lo := len(c.arena)
		c.arena = append(append(c.arena, 'S'), c.bytes(c.reasoningEffort)...)
		c.setKw(ks, span{uint32(lo), uint32(len(c.arena))})
		if !userThinking {
			c.arena = append(c.arena, "enable_thinking"...)
			ks := span{uint32(len(c.arena) - len("enable_thinking")), uint32(len(c.arena))}
			lo := len(c.arena)
			c.arena = strconv.AppendBool(append(c.arena, 'B'), string(c.bytes(c.reasoningEffort)) != "none")
			c.setKw(ks, span{uint32(lo), uint32(len(c.arena))})
		}
	}
	slices.SortFunc(c.kwKeys, func(a, b kwPair) int { return bytes.Compare(c.bytes(a.k), c.bytes(b.k)) })
	c.key = c.key[:0]
	for _, kv := range c.kwKeys {
		c.key = append(append(append(append(c.key, c.bytes(kv.k)...), 0), c.bytes(kv.v)...), 0)
	}
	return c.key, true
}

// setKw adds or replaces a kwarg: later sources override earlier ones.
func (c *Conversation) setKw(k, v span) {
	for i := range c.kwKeys {
		if bytes.Equal(c.bytes(c.kwKeys[i].k), c.bytes(k)) {
			c.kwKeys[i].v = v
			return
		}
	}
	c.kwKeys = append(c.kwKeys, kwPair{k, v})
}
