package openai

import (
	"bytes"
	"mime"
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
// engine's parser (Starlette's, on python-multipart) does: a delimiter
// is the boundary at a line's start followed by "--" or a line's end
// (no transport padding), a part's last Content-Disposition names it,
// a field's last value wins and an empty one counts as absent, and a form
// holds at most 1,000 fields and 1,000 files. A part whose name cannot be
// read is left to the engine to judge. contentType is the request's
// Content-Type, which names the boundary.
//
// The parts are found by searching for their delimiter, not read through
// mime/multipart: a Reader copies every byte of the audio (up to
// max_body_bytes) to find the next part, and hides where the model's
// value lies, which WithModel rewrites in place.
func (r *Request) ParseForm(body, contentType []byte) error {
	r.Reset()
	r.Kind, r.form = KindAudio, true
	typ, params, err := mime.ParseMediaType(string(contentType))
	if err != nil || typ != "multipart/form-data" || params["boundary"] == "" {
		return NotAForm(contentType)
	}
	delim := append([]byte("\r\n--"), params["boundary"]...)
	// The first delimiter may follow a preamble, or open the body.
	var i int
	if bytes.HasPrefix(body, delim[2:]) && closes(body[len(delim)-2:]) {
		i = len(delim) - 2
	} else if i = nextDelimiter(body, delim); i < 0 {
		return BadForm()
	} else {
		i += len(delim)
	}
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
// filename); named is false when no such header can be read.
func formName(head []byte) (name string, file, named bool) {
	for line := range bytes.SplitSeq(head, []byte("\r\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || !strings.EqualFold(string(bytes.TrimSpace(k)), "Content-Disposition") {
			continue
		}
		disp, params, err := mime.ParseMediaType(string(v))
		if err != nil || disp != "form-data" {
			name, file, named = "", false, false
			continue
		}
		_, plain := params["filename"]
		_, starred := params["filename*"]
		name, named = params["name"]
		file = plain || starred
	}
	return name, file, named
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
