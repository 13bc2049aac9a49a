package openai

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
)

// Error is an error the gateway answers in OpenAI's shape:
//
//	{"error":{"message":"...","type":"...","param":null,"code":null}}
//
// Status is the HTTP status. Param and Code render as JSON null when empty,
// as OpenAI's own errors do. The type and code strings are the ones OpenAI
// returns where it has an equivalent (invalid_request_error with
// missing_required_parameter / invalid_type / invalid_value, model_not_found,
// requests + rate_limit_exceeded, server_error), so clients that branch on
// them behave as they would against OpenAI.
type Error struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
	// CodeIsStatus renders code as Status, a number, as vLLM's ErrorInfo
	// does (code: int): for the answers the gateway gives in a pod's stead.
	CodeIsStatus bool
}

// Error implements error.
func (e *Error) Error() string { return e.Message }

// OpenAI's error types and codes.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"
	// TypeRequests is the type OpenAI gives a 429 for a request-rate limit.
	TypeRequests = "requests"

	CodeMissingParam  = "missing_required_parameter"
	CodeInvalidType   = "invalid_type"
	CodeInvalidValue  = "invalid_value"
	CodeModelNotFound = "model_not_found"
	CodeRateLimited   = "rate_limit_exceeded"
)

// gotLimit is how many bytes of an offending JSON value an error message
// quotes; longer values are cut and marked with "...".
const gotLimit = 40

// InvalidJSON is the 400 for a body that is not valid JSON. The message is
// the first sentence of OpenAI's own.
func InvalidJSON() *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest,
		Message: "We could not parse the JSON body of your request."}
}

// InvalidUTF8 is the 400 for a body that is not UTF-8, which JSON requires.
func InvalidUTF8() *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest,
		Message: "The request body is not valid UTF-8."}
}

// NotAnObject is the 400 for a JSON body whose top level is not an object.
func NotAnObject() *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest,
		Message: "The request body must be a JSON object."}
}

// MissingParam is the 400 for a required field that is absent or null.
// param is the field's path, e.g. `messages[2].role`.
func MissingParam(param string) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest,
		Param: param, Code: CodeMissingParam,
		Message: strconv.Quote(param) + " is required"}
}

// InvalidType is the 400 for a field of the wrong JSON type or form. want
// completes "must be ..." and got is the offending raw JSON value, quoted in
// the message (cut after 40 bytes), e.g.
// `"max_tokens" must be a non-negative integer, got "abc"`.
func InvalidType(param, want string, got []byte) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest,
		Param: param, Code: CodeInvalidType,
		Message: strconv.Quote(param) + " must be " + want + ", got " + cut(got)}
}

// InvalidValue is the 400 for a field of the right type whose value is not
// allowed; problem completes the sentence, e.g. "must not be empty".
func InvalidValue(param, problem string) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest,
		Param: param, Code: CodeInvalidValue,
		Message: strconv.Quote(param) + " " + problem}
}

// ModelNotFound is the 404 for a model no pool serves; OpenAI answers an
// unknown model the same way.
func ModelNotFound(model []byte) *Error {
	return &Error{Status: http.StatusNotFound, Type: TypeInvalidRequest,
		Param: "model", Code: CodeModelNotFound,
		Message: "The model `" + string(model) + "` does not exist."}
}

// InvalidURL is the 404 for a path the gateway does not serve, worded as
// OpenAI words it: "Invalid URL (POST /v1/foo)".
func InvalidURL(method, path []byte) *Error {
	return &Error{Status: http.StatusNotFound, Type: TypeInvalidRequest,
		Message: "Invalid URL (" + string(method) + " " + string(path) + ")"}
}

// MethodNotAllowed is the 405 for a known path called with the wrong method,
// worded as OpenAI words it: "Invalid method for URL (GET /v1/completions)".
// The caller sets the Allow header.
func MethodNotAllowed(method, path []byte) *Error {
	return &Error{Status: http.StatusMethodNotAllowed, Type: TypeInvalidRequest,
		Message: "Invalid method for URL (" + string(method) + " " + string(path) + ")"}
}

// BodyTooLarge is the 413 for a body over the gateway's limit (bytes).
func BodyTooLarge(limit int) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: TypeInvalidRequest,
		Message: "The request body exceeds the limit of " + strconv.Itoa(limit) + " bytes."}
}

// RateLimited is the 429 for a client over its request rate. The caller sets
// Retry-After.
func RateLimited(detail string) *Error {
	return &Error{Status: http.StatusTooManyRequests, Type: TypeRequests,
		Code: CodeRateLimited, Message: "Rate limit reached: " + detail}
}

// Overloaded is the 429 for a request shed by admission control because the
// fleet cannot meet its latency target now; reason says which (for example
// "predicted time to first token 4.2s exceeds the 2s target"). The caller
// sets Retry-After. OpenAI's overload errors carry type server_error.
func Overloaded(reason string) *Error {
	return &Error{Status: http.StatusTooManyRequests, Type: TypeServer,
		Message: "The service is overloaded, please retry later: " + reason}
}

// UpstreamError is the 502 for an inference pod that failed or answered
// something the gateway could not relay; detail names what went wrong.
func UpstreamError(detail string) *Error {
	return &Error{Status: http.StatusBadGateway, Type: TypeServer,
		Message: "The inference server failed: " + detail}
}

// NoHealthyPod is the 503 for a model whose pools have no pod that can take
// the request now.
func NoHealthyPod(model []byte) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: TypeServer,
		Message: "No healthy inference server is available for model `" + string(model) + "`."}
}

// UpstreamTimeout is the 504 for a pod that did not answer within after.
func UpstreamTimeout(after time.Duration) *Error {
	return &Error{Status: http.StatusGatewayTimeout, Type: TypeServer,
		Message: fmt.Sprintf("The inference server did not answer within %s.", after)}
}

// AppendJSON appends e in OpenAI's shape to dst and returns the extended
// slice. Strings are escaped as encoding/json escapes them (invalid UTF-8
// becomes U+FFFD), without its HTML escaping, which only costs bytes here.
func (e *Error) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = AppendJSONString(dst, e.Message)
	dst = append(dst, `,"type":`...)
	dst = AppendJSONString(dst, e.Type)
	dst = append(dst, `,"param":`...)
	dst = appendJSONStringOrNull(dst, e.Param)
	dst = append(dst, `,"code":`...)
	if e.CodeIsStatus {
		dst = strconv.AppendInt(dst, int64(e.Status), 10)
	} else {
		dst = appendJSONStringOrNull(dst, e.Code)
	}
	return append(dst, "}}"...)
}

func appendJSONStringOrNull(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "null"...)
	}
	return AppendJSONString(dst, s)
}

// AppendJSONString appends s as a JSON string literal.
func AppendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, s[start:i]...)
				dst = append(dst, `\ufffd`...)
				i++
				start = i
				continue
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, `\n`...)
		case '\r':
			dst = append(dst, `\r`...)
		case '\t':
			dst = append(dst, `\t`...)
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendJSONBytes appends b as a JSON string literal.
func AppendJSONBytes(dst, b []byte) []byte { return AppendJSONString(dst, b2s(b)) }

// cut renders a raw JSON value for an error message, shortened to gotLimit
// bytes (backing off to a UTF-8 boundary).
func cut(raw []byte) string {
	if len(raw) <= gotLimit {
		return string(raw)
	}
	n := gotLimit
	for n > 0 && !utf8.RuneStart(raw[n]) {
		n--
	}
	return string(raw[:n]) + "..."
}
