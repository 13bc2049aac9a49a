package openai

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"

	"pdlb/engines"
)

// ParseForm reads a KindAudio request (POST /v1/audio/transcriptions or
// /v1/audio/translations): a multipart/form-data body (RFC 7578), as
// vLLM's speech-to-text API takes it, whose "model" and "stream" fields
// are read; the audio file and every other field are stepped over, and
// FormTextBytes counts the fields' text. It reads the form as the
// engine's parser (Starlette's, on python-multipart) does: the first
// delimiter is at the body's first '-', every other one is the boundary
// at a line's start followed by "--" or a line's end (no transport
// padding); a part's last Content-Disposition names it, its parameters
// read as python-multipart reads them (optionsHeader), a filename making
// it a file; a field's last value wins and an empty one counts as absent;
// a form holds at most 1,000 fields and 1,000 files. A part without a
// name is left to the engine to refuse. contentType is the request's
// Content-Type, which names the boundary.
//
// The parts are found by searching for their delimiter, not read through
// mime/multipart: a Reader copies every byte of the audio (up to
// max_body_bytes) to find the next part, and hides where the model's
// value lies, which WithModel rewrites in place.
func (r *Request) ParseForm(body, contentType []byte) error {
	r.Reset()
	r.Kind, r.form = KindAudio, true
	typ, boundary := "", ""
	optionsHeader(contentType, func(t string) { typ = t }, func(k, v string) {
		if k == "boundary" {
			boundary = v
		}
	})
	if typ != "multipart/form-data" || boundary == "" {
		return NotAForm(contentType)
	}
	delim := append([]byte("\r\n--"), boundary...)
	// The first delimiter is at the body's first '-', as python-multipart
	// looks for it: a preamble without one goes before it.
	i := bytes.IndexByte(body, '-')
	if i < 0 || !bytes.HasPrefix(body[i:], delim[2:]) || !closes(body[i+len(delim)-2:]) {
		return BadForm()
	}
	i += len(delim) - 2
	var stream []byte // the last value, read at the end
	fields, files := 0, 0
	for !bytes.HasPrefix(body[i:], []byte("--")) {
		// The delimiter line's end, then the part's header lines up to
		// an empty one.
		line := i
		end := bytes.Index(body[line:], []byte("\r\n\r\n"))
		if end < 0 {
			return BadForm()
		}
		name, file, named := formName(body[line : line+end])
		from := line + end + 4
		next := nextDelimiter(body[from:], delim)
		if next < 0 {
			return BadForm()
		}
		value := body[from : from+next]
		if file {
			files++
		} else {
			fields++
			r.FormTextBytes += len(value)
		}
		if fields > maxFormParts || files > maxFormParts {
			return TooManyParts()
		}
		switch {
		case !named || file:
		case name == "model":
			r.Model = append(r.Model[:0], value...)
			r.modelAt = [2]int{from, from + len(value)}
		case name == "stream":
			stream = value
		}
		i = from + next + len(delim)
	}
	if len(stream) > 0 {
		v, ok := engines.LaxBoolString(string(stream))
		if !ok {
			return InvalidType("stream", wantBool, stream)
		}
		r.Stream = v
	}
	return nil
}

// maxFormParts is how many fields, and how many files, a form may hold:
// Starlette's default max_fields and max_files.
const maxFormParts = 1000

// closes reports whether what follows a boundary makes it a delimiter:
// "--" (the last) or a line's end.
func closes(after []byte) bool {
	return bytes.HasPrefix(after, []byte("--")) || bytes.HasPrefix(after, []byte("\r\n"))
}

// nextDelimiter returns where the first delimiter in b begins, -1 if none.
// A boundary followed by other bytes is content, as the engine's form
// parser reads it.
func nextDelimiter(b, delim []byte) int {
	for at := 0; ; {
		k := bytes.Index(b[at:], delim)
		if k < 0 {
			return -1
		}
		k += at
		if closes(b[k+len(delim):]) {
			return k
		}
		at = k + 1
	}
}

// formName returns the field name the last Content-Disposition of a
// part's header block gives, and whether the part is a file (it has a
// filename); named is false when no such header names the part.
func formName(head []byte) (name string, file, named bool) {
	for line := range bytes.SplitSeq(head, []byte("\r\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || !strings.EqualFold(string(bytes.TrimSpace(k)), "Content-Disposition") {
			continue
		}
		name, file, named = "", false, false
		optionsHeader(v, func(string) {}, func(k, v string) {
			switch k {
			case "name":
				name, named = v, true
			case "filename":
				file = true
			}
		})
	}
	return name, file, named
}

// optionsHeader reads a header value of a type and parameters
// (Content-Type, Content-Disposition) as python-multipart's
// parse_options_header does (it serves the engines' forms), so the
// gateway names a form's parts as the engine does: typ gets the type as
// written, param each parameter in order (a later one of the same key
// wins), its key lower case, a quoted value unquoted with \\ and then
// \" unescaped. A parameter whose key holds '*' (RFC 2231's extended
// syntax, which RFC 7578 forbids) is skipped.
func optionsHeader(v []byte, typ func(string), param func(k, v string)) {
	segments := parseParams(string(v))
	typ(segments[0])
	for _, seg := range segments[1:] {
		k, val, _ := strings.Cut(seg, "=")
		if strings.Contains(k, "*") {
			continue
		}
		if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
			val = strings.ReplaceAll(strings.ReplaceAll(val[1:len(val)-1], `\\`, `\`), `\"`, `"`)
		}
		param(k, val)
	}
}

// parseParams splits a header value at its ';'s outside double quotes,
// step for step as Python's email.message._parseparam (which
// python-multipart vendors), quirks included: a key before '=' is
// lower-cased and right-trimmed, its value left-trimmed, the whole
// segment trimmed. The first segment is the value's type.
func parseParams(v string) []string {
	s := ";" + v
	var out []string
	for start := 0; pyFind(s, ";", start) == start; {
		start++
		end := pyFind(s, ";", start)
		ind, diff := start, 0
		for end > 0 {
			diff += pyCount(s, `"`, ind, end) - pyCount(s, `\"`, ind, end)
			if diff%2 == 0 {
				break
			}
			end, ind = ind, pyFind(s, ";", end+1)
		}
		if end < 0 {
			end = len(s)
		}
		var f string
		if i := strings.Index(s[start:max(end, start)], "="); i < 0 {
			f = s[start:max(end, start)]
		} else {
			i += start
			f = strings.ToLower(pyTrim(s[start:i], false, true)) + "=" + pyTrim(s[i+1:max(end, i+1)], true, false)
		}
		out = append(out, pyTrim(f, true, true))
		start = end
	}
	return out
}

// pyTrim is Python's str.lstrip (left), rstrip (right) or strip (both)
// of a header decoded as Latin-1, as python-multipart decodes it: each
// byte a character, 0x85 and 0xA0 whitespace too.
func pyTrim(s string, left, right bool) string {
	space := func(b byte) bool {
		return b == ' ' || b >= '\t' && b <= '\r' || b >= 0x1c && b <= 0x1f || b == 0x85 || b == 0xa0
	}
	for left && len(s) > 0 && space(s[0]) {
		s = s[1:]
	}
	for right && len(s) > 0 && space(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}

// pySlice bounds start and end as Python bounds a slice s[start:end].
func pySlice(s string, start, end int) (int, int) {
	bound := func(i int) int {
		if i < 0 {
			i += len(s)
		}
		return min(max(i, 0), len(s))
	}
	return bound(start), bound(end)
}

// pyFind is Python's s.find(sub, start).
func pyFind(s, sub string, start int) int {
	lo, _ := pySlice(s, start, len(s))
	if i := strings.Index(s[lo:], sub); i >= 0 {
		return lo + i
	}
	return -1
}

// pyCount is Python's s.count(sub, start, end).
func pyCount(s, sub string, start, end int) int {
	lo, hi := pySlice(s, start, end)
	if lo > hi {
		return 0
	}
	return strings.Count(s[lo:hi], sub)
}

// NotAForm is the 400 for an audio request whose body is not a
// multipart form.
func NotAForm(contentType []byte) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest,
		Message: "The request body must be multipart/form-data with a boundary, as the audio APIs take it; got Content-Type " + strconv.Quote(string(contentType)) + "."}
}

// BadForm is the 400 for a multipart body whose parts cannot be read.
func BadForm() *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest,
		Message: "We could not parse the multipart/form-data body of your request."}
}

// TooManyParts is the 400 for a form of more fields, or files, than the
// engine's form parser takes.
func TooManyParts() *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest,
		Message: "The form holds more than " + strconv.Itoa(maxFormParts) + " fields or " + strconv.Itoa(maxFormParts) + " files, the most the engines take."}
}
