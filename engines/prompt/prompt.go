// Package prompt turns a request's prompt into the token ids its engine
// computes, for the gateway (block keys, prompt-token counts) and the sim
// pods alike. A model configured with Hugging Face tokenizer files gets
// vLLM's chat path: its Jinja chat template (engines/chat), then its own
// tokenizer (engines/tokenize/hf) without special tokens; a completion
// prompt is encoded with them. A model without files keeps the stand-in
// (engines/tokenize), whose ids no real engine produces.
package prompt

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"pdlb/engines/chat"
	"pdlb/engines/tokenize/hf"
)

// Config names a model's tokenizer and template, as vLLM's flags do.
type Config struct {
	// Tokenizer is a directory in the Hugging Face layout
	// (tokenizer.json, tokenizer_config.json, chat_template.jinja), vLLM's
	// --tokenizer. Empty: the stand-in.
	Tokenizer string
	// ChatTemplate replaces the tokenizer's own template: a file, or the
	// template text itself when it holds a '{' (vLLM's --chat-template).
	ChatTemplate string
	// ChatTemplateKwargs are defaults under each request's
	// chat_template_kwargs (vLLM's --default-chat-template-kwargs).
	ChatTemplateKwargs map[string]any
	// InlineSystem is where the engine puts the system-role messages
	// inside a Messages API request's messages (chat.InlineSystem).
	InlineSystem chat.InlineSystem
}

// Key names c's settings: configs with equal keys load the same Model, so
// a caller may share one loaded Model among them (a tokenizer.json is
// megabytes).
func (c Config) Key() string {
	kw, err := json.Marshal(c.ChatTemplateKwargs)
	if err != nil {
		kw = []byte(fmt.Sprint(c.ChatTemplateKwargs))
	}
	return c.Tokenizer + "\x00" + c.ChatTemplate + "\x00" + string(kw) + "\x00" + strconv.Itoa(int(c.InlineSystem))
}

// Loaded holds models by their settings (Config.Key), for callers that
// load many configs, some alike: each distinct one is loaded once.
type Loaded map[string]*Model

// Load returns the model of c, loading it unless an equal config was.
func (l Loaded) Load(c Config) (*Model, error) {
	key := c.Key()
	if m, ok := l[key]; ok {
		return m, nil
	}
	m, err := Load(c)
	if err == nil {
		l[key] = m
	}
	return m, err
}

// Model renders and encodes one model's prompts. It is safe for concurrent
// use.
type Model struct {
	dir    string
	tok    *hf.Tokenizer
	tmpl   *chat.Template
	kwargs map[string]any
	inline chat.InlineSystem
	text   sync.Pool // *[]byte: rendered prompts
}

// ErrNoTemplate says the model's tokenizer has no chat template and none
// was configured, so chat requests cannot be rendered as the engine would.
var ErrNoTemplate = errors.New("prompt: the tokenizer has no chat template and none is configured (chat_template)")

// SettingError is a Config that does not load, by the setting at fault
// as config files spell it (tokenizer, chat_template or
// chat_template_kwargs) and the value written there, so that a loader can
// name where it was written. Its text is Err's.
type SettingError struct {
	Setting string
	Value   any
	Err     error
}

func (e *SettingError) Error() string { return e.Err.Error() }

func (e *SettingError) Unwrap() error { return e.Err }

// settingError is err, which setting of c caused.
func (c Config) settingError(setting string, err error) *SettingError {
	var v any = c.Tokenizer
	switch setting {
	case "chat_template":
		v = c.ChatTemplate
	case "chat_template_kwargs":
		v = c.ChatTemplateKwargs
	}
	return &SettingError{setting, v, err}
}

// Load reads the tokenizer and compiles the chat template of c. It returns
// nil and no error when c names no tokenizer (the stand-in). A model whose
// tokenizer has no template still encodes completions; its chat requests
// fail with ErrNoTemplate. Its errors are *SettingError.
func Load(c Config) (*Model, error) {
	// A template comes from chat_template, else from the tokenizer's files.
	tmplSetting := "tokenizer"
	if c.ChatTemplate != "" {
		tmplSetting = "chat_template"
	}
	if c.Tokenizer == "" {
		if c.ChatTemplate != "" || len(c.ChatTemplateKwargs) > 0 {
			setting := "chat_template_kwargs"
			if c.ChatTemplate != "" {
				setting = tmplSetting
			}
			return nil, c.settingError(setting, errors.New("prompt: chat_template and chat_template_kwargs need a tokenizer (the stand-in has no template)"))
		}
		return nil, nil
	}
	tok, err := hf.Load(c.Tokenizer)
	if err != nil {
		return nil, c.settingError("tokenizer", err)
	}
	src := tok.ChatTemplate()
	if c.ChatTemplate != "" {
		if src, err = templateText(c.ChatTemplate); err != nil {
			return nil, c.settingError(tmplSetting, err)
		}
	}
	m := &Model{dir: c.Tokenizer, tok: tok, kwargs: c.ChatTemplateKwargs, inline: c.InlineSystem}
	if src != "" {
		if m.tmpl, err = chat.Compile(src, tok.SpecialTokens()); err != nil {
			return nil, c.settingError(tmplSetting, fmt.Errorf("prompt: chat template of %s: %w", c.Tokenizer, err))
		}
		m.tmpl.Warm(c.ChatTemplateKwargs)
	}
	return m, nil
}

// templateText is a --chat-template value's template: the text itself when
// it looks like Jinja, else the file it names.
func templateText(v string) (string, error) {
	if strings.ContainsAny(v, "{\n") {
		return v, nil
	}
	b, err := os.ReadFile(v)
	if err != nil {
		return "", fmt.Errorf("prompt: chat_template: %w", err)
	}
	return string(b), nil
}

// Name is the tokenizer directory the model was loaded from.
func (m *Model) Name() string { return m.dir }

// Tokenizer is the model's tokenizer.
func (m *Model) Tokenizer() *hf.Tokenizer { return m.tok }

// Chat appends the ids of a chat completion request body to dst: its
// messages rendered by the template, then encoded without special tokens
// unless addSpecial (the request's add_special_tokens, false by default in
// vLLM's chat API: the template writes them). A request vLLM would refuse fails with
// a *chat.RequestError; one the template engine cannot render as Python
// would, with chat.ErrInexact.
func (m *Model) Chat(dst []uint32, body []byte, addSpecial bool) ([]uint32, error) {
	return m.conversation(dst, body, (*chat.Conversation).ParseRequest, addSpecial, -1)
}

// ChatFast is Chat on the template's fast path alone, encoding at most
// unseen (>= 0; a negative bound is Chat's) bytes of text the tokenizer's
// segment cache does not hold: chat.ErrJinja, before any encoding, where
// Chat would render with the Jinja engine; ErrUnseen past unseen.
func (m *Model) ChatFast(dst []uint32, body []byte, addSpecial bool, unseen int) ([]uint32, error) {
	return m.conversation(dst, body, (*chat.Conversation).ParseRequest, addSpecial, unseen)
}

// ErrUnseen is ChatFast's for a prompt with more new text than its bound.
var ErrUnseen = errors.New("prompt: more of the prompt is new to the tokenizer than the bound")

// Responses appends the ids of a Responses API request body to dst: the
// conversation vLLM makes of it (chat.Conversation.ParseResponses),
// rendered and encoded as Chat's, without special tokens (the API has no
// add_special_tokens). What vLLM renders otherwise fails with
// chat.ErrInexact.
func (m *Model) Responses(dst []uint32, body []byte) ([]uint32, error) {
	return m.conversation(dst, body, (*chat.Conversation).ParseResponses, false, -1)
}

// Messages appends the ids of an Anthropic Messages API request body to
// dst: the chat request vLLM makes of it (chat.AppendMessages, with the
// model's InlineSystem), rendered and encoded as Chat's, without special
// tokens. A request vLLM's releases convert differently fails with
// chat.ErrInexact.
func (m *Model) Messages(dst []uint32, body []byte) ([]uint32, error) {
	buf := m.acquireText()
	defer m.text.Put(buf)
	var exact bool
	var err error
	if *buf, exact, err = chat.AppendMessages((*buf)[:0], body, m.inline); err != nil {
		return dst, err
	}
	if !exact {
		return dst, chat.ErrInexact
	}
	return m.Chat(dst, *buf, false)
}

// conversation appends the ids of the conversation parse reads from body;
// with unseen >= 0, as ChatFast does.
func (m *Model) conversation(dst []uint32, body []byte, parse func(*chat.Conversation, []byte) error, addSpecial bool, unseen int) ([]uint32, error) {
	c := chat.AcquireConversation()
	defer chat.ReleaseConversation(c)
	if err := parse(c, body); err != nil {
		return dst, err
	}
	return m.appendChat(dst, c, addSpecial, unseen)
}

// AppendChat is Chat for a conversation already parsed.
func (m *Model) AppendChat(dst []uint32, c *chat.Conversation, addSpecial bool) ([]uint32, error) {
	return m.appendChat(dst, c, addSpecial, -1)
}

func (m *Model) appendChat(dst []uint32, c *chat.Conversation, addSpecial bool, unseen int) ([]uint32, error) {
	buf := m.acquireText()
	defer m.text.Put(buf)
	var err error
	if *buf, err = m.render((*buf)[:0], c, unseen >= 0); err != nil {
		return dst, err
	}
	if unseen < 0 {
		return m.tok.Append(dst, *buf, addSpecial), nil
	}
	ids, ok := m.tok.AppendWithin(dst, *buf, addSpecial, unseen)
	if !ok {
		return dst, ErrUnseen
	}
	return ids, nil
}

// Render appends c rendered by the model's chat template to dst: the text
// the engine tokenizes.
func (m *Model) Render(dst []byte, c *chat.Conversation) ([]byte, error) {
	return m.render(dst, c, false)
}

func (m *Model) render(dst []byte, c *chat.Conversation, fast bool) ([]byte, error) {
	switch {
	case m.tmpl == nil:
		return dst, ErrNoTemplate
	case fast:
		return m.tmpl.RenderFast(dst, c, m.kwargs)
	}
	return m.tmpl.Render(dst, c, m.kwargs)
}

// Completion appends the ids of a completion prompt string to dst, with
// the tokenizer's special tokens unless addSpecial is false (vLLM's
// add_special_tokens, true by default on /v1/completions).
func (m *Model) Completion(dst []uint32, prompt []byte, addSpecial bool) []uint32 {
	return m.tok.Append(dst, prompt, addSpecial)
}

// Batch appends the ids an engine prefills for a batch of n completion
// prompts (prompt(i) is each) to dst, and where each prompt's ids end in
// dst to ends: every prompt is the engine's own request, tokenized on its
// own (as Completion) and, with keep > 0, cut to keep tokens as vLLM's
// truncate_prompt_tokens cuts it (the first ones if right; see
// hf.Tokenizer.Truncate).
func (m *Model) Batch(dst []uint32, ends []int, n int, prompt func(int) []byte, addSpecial bool, keep int, right bool) ([]uint32, []int) {
	for i := range n {
		start := len(dst)
		dst = m.Completion(dst, prompt(i), addSpecial)
		if keep > 0 {
			dst = dst[:start+len(m.tok.Truncate(dst[start:], keep, right, addSpecial))]
		}
		ends = append(ends, len(dst))
	}
	return dst, ends
}

func (m *Model) acquireText() *[]byte {
	if b, ok := m.text.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, 8<<10)
	return &b
}
