package engines

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// SaltForm is the JSON form of a request's "cache_salt": with the engine
// and the request's kind it decides whether the engine takes the salt
// (Kind.CacheSaltFault).
type SaltForm uint8

const (
	SaltAbsent    SaltForm = iota
	SaltNull               // null
	SaltString             // a string
	SaltEmptyList          // []
	SaltList               // a list of strings
	SaltOther              // any other value
)

// SaltFault is what an engine finds wrong with a cache_salt.
type SaltFault uint8

const (
	// SaltTaken: the engine serves the request; a string salts the
	// prompt's blocks, and anything else salts nothing.
	SaltTaken SaltFault = iota
	// SaltWrongType: the request model's type refuses the value.
	SaltWrongType
	// SaltEmpty: vLLM refuses "".
	SaltEmpty
	// SaltBlank: TensorRT-LLM refuses a salt of white space only.
	SaltBlank
	// SaltBadChars: vLLM refuses a salt over MaxCacheSalt characters or
	// holding a character its cache backends use as a separator.
	SaltBadChars
	// SaltListFails: SGLang's protocol takes a list of salts, and its
	// server then fails the request with a 500.
	SaltListFails
	// SaltNoField: TensorRT-LLM's completion request has no cache_salt
	// and refuses fields it does not know.
	SaltNoField
)

// MaxCacheSalt is the longest cache_salt vLLM takes, in characters (code
// points).
const MaxCacheSalt = 128

// CacheSaltFault is what engine k finds wrong with a request's cache_salt
// of form f, whose text is s when it is a string; chat says the request
// is a chat completion. vLLM takes a non-empty string of at most
// MaxCacheSalt characters without '@', '/', '\' or NUL
// (validate_cache_salt in vllm/entrypoints/generate/base/protocol.py);
// TensorRT-LLM's chat a string that is not blank (its str.strip()
// validator), and its completion request no cache_salt at all, null
// included (extra="forbid" in tensorrt_llm/serve/openai_protocol.py);
// SGLang any string or empty list, "" and [] salting nothing, while a
// list of salts, which its protocol types Union[List[str], str], fails
// in its server's _compute_extra_key, which wants a string.
func (k Kind) CacheSaltFault(chat bool, f SaltForm, s string) SaltFault {
	switch {
	case f == SaltAbsent:
		return SaltTaken
	case k == TRTLLM && !chat:
		return SaltNoField
	case f == SaltNull:
		return SaltTaken
	case k == SGLang:
		switch f {
		case SaltOther:
			return SaltWrongType
		case SaltList:
			return SaltListFails
		}
		return SaltTaken
	case f != SaltString:
		return SaltWrongType
	case k == TRTLLM:
		if strings.TrimFunc(s, isPythonSpace) == "" {
			return SaltBlank
		}
		return SaltTaken
	case s == "":
		return SaltEmpty
	case utf8.RuneCountInString(s) > MaxCacheSalt || strings.ContainsAny(s, "@/\\\x00"):
		return SaltBadChars
	}
	return SaltTaken
}

// isPythonSpace says whether Python's str.strip strips c: Go's white
// space and the separators U+001C to U+001F.
func isPythonSpace(c rune) bool { return unicode.IsSpace(c) || c >= 0x1c && c <= 0x1f }
