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
// are read; the audio file and every other field are stepped over.
// contentType is the request's Content-Type, which names the boundary.
// As the engine's form parser, a field's last value wins.
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
	if bytes.HasPrefix(body, delim[2:]) {
		i = len(delim) - 2
	} else if i = nextDelimiter(body, delim); i < 0 {
		return BadForm()
	} else {
		i += len(delim)
	}
	for {
		rest := body[i:]
		if bytes.HasPrefix(rest, []byte("--")) {
			return nil // the close delimiter
		}
		// Transport padding, then the delimiter line's end, then the
		// part's header lines up to an empty one.
		line := len(body) - len(bytes.TrimLeft(rest, " \t"))
		if !bytes.HasPrefix(body[line:], []byte("\r\n")) {
			return BadForm()
		}
		end := bytes.Index(body[line:], []byte("\r\n\r\n"))
		if end < 0 {
			return BadForm()
		}
		name, ok := formName(body[line : line+end])
		from := line + end + 4
		next := nextDelimiter(body[from:], delim)
		if !ok || next < 0 {
			return BadForm()
		}
		if err := r.formField(name, body[from:from+next], from); err != nil {
			return err
		}
		i = from + next + len(delim)
	}
}

// nextDelimiter returns where the first delimiter in b begins, -1 if none:
// the delimiter followed by "--", or by transport padding and a line's
// end. Where other bytes follow, the part's content goes on, as Go's and
// the engines' form parsers read it.
func nextDelimiter(b, delim []byte) int {
	for at := 0; ; {
		k := bytes.Index(b[at:], delim)
		if k < 0 {
			return -1
		}
		k += at
		after := b[k+len(delim):]
		if bytes.HasPrefix(after, []byte("--")) || bytes.HasPrefix(bytes.TrimLeft(after, " \t"), []byte("\r\n")) {
			return k
		}
		at = k + 1
	}
}

// formField takes the value of the field named name, which lies at
// offset at of the body.
func (r *Request) formField(name string, value []byte, at int) error {
	switch name {
	case "model":
		r.Model = append(r.Model[:0], value...)
		r.modelAt = [2]int{at, at + len(value)}
	case "stream":
		v, ok := engines.LaxBoolString(string(value))
		if !ok {
			return InvalidType("stream", wantBool, value)
		}
		r.Stream = v
	}
	return nil
}

// formName returns the field name a part's header block gives in its
// Content-Disposition; ok is false for a header without one.
func formName(head []byte) (string, bool) {
	for line := range bytes.SplitSeq(head, []byte("\r\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || !strings.EqualFold(string(bytes.TrimSpace(k)), "Content-Disposition") {
			continue
		}
		disp, params, err := mime.ParseMediaType(string(v))
		if err != nil || disp != "form-data" {
			return "", false
		}
		name, ok := params["name"]
		return name, ok
	}
	return "", false
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
