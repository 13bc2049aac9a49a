package openai

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestErrorConstructors(t *testing.T) {
	f := func(e *Error, wantStatus int, wantJSON string) {
		t.Helper()
		if e.Status != wantStatus {
			t.Fatalf("%q: status %d, want %d", e.Message, e.Status, wantStatus)
		}
		if got := string(e.AppendJSON(nil)); got != wantJSON {
			t.Fatalf("AppendJSON\n got %s\nwant %s", got, wantJSON)
		}
		if e.Error() != e.Message {
			t.Fatalf("Error() = %q, want the message", e.Error())
		}
	}
	f(InvalidJSON(), 400, `{"error":{"message":"We could not parse the JSON body of your request.","type":"invalid_request_error","param":null,"code":null}}`)
	f(NotAnObject(), 400, `{"error":{"message":"The request body must be a JSON object.","type":"invalid_request_error","param":null,"code":null}}`)
	f(MissingParam("messages[0].role"), 400, `{"error":{"message":"\"messages[0].role\" is required","type":"invalid_request_error","param":"messages[0].role","code":"missing_required_parameter"}}`)
	f(InvalidType("max_tokens", "a non-negative integer", []byte(`"abc"`)), 400,
		`{"error":{"message":"\"max_tokens\" must be a non-negative integer, got \"abc\"","type":"invalid_request_error","param":"max_tokens","code":"invalid_type"}}`)
	f(InvalidValue("messages", "must not be empty"), 400, `{"error":{"message":"\"messages\" must not be empty","type":"invalid_request_error","param":"messages","code":"invalid_value"}}`)
	f(ModelNotFound([]byte("gpt-9")), 404, "{\"error\":{\"message\":\"The model `gpt-9` does not exist.\",\"type\":\"invalid_request_error\",\"param\":\"model\",\"code\":\"model_not_found\"}}")
	f(InvalidURL([]byte("POST"), []byte("/v1/foo")), 404, `{"error":{"message":"Invalid URL (POST /v1/foo)","type":"invalid_request_error","param":null,"code":null}}`)
	f(MethodNotAllowed([]byte("GET"), []byte("/v1/completions")), 405, `{"error":{"message":"Invalid method for URL (GET /v1/completions)","type":"invalid_request_error","param":null,"code":null}}`)
	f(BodyTooLarge(1<<20), 413, `{"error":{"message":"The request body exceeds the limit of 1048576 bytes.","type":"invalid_request_error","param":null,"code":null}}`)
	f(RateLimited("10 requests per second"), 429, `{"error":{"message":"Rate limit reached: 10 requests per second","type":"requests","param":null,"code":"rate_limit_exceeded"}}`)
	f(Overloaded("queue full"), 429, `{"error":{"message":"The service is overloaded, please retry later: queue full","type":"server_error","param":null,"code":null}}`)
	f(UpstreamError("connection reset"), 502, `{"error":{"message":"The inference server failed: connection reset","type":"server_error","param":null,"code":null}}`)
	f(NoHealthyPod([]byte("m")), 503, "{\"error\":{\"message\":\"No healthy inference server is available for model `m`.\",\"type\":\"server_error\",\"param\":null,\"code\":null}}")
	f(UpstreamTimeout(90*time.Second), 504, `{"error":{"message":"The inference server did not answer within 1m30s.","type":"server_error","param":null,"code":null}}`)
}

// TestAppendJSONEscaping checks that every message survives a JSON round
// trip as encoding/json would carry it, invalid UTF-8 included.
func TestAppendJSONEscaping(t *testing.T) {
	f := func(msg string) {
		t.Helper()
		e := &Error{Message: msg, Type: "t\"", Param: "p\n", Code: "c\\"}
		out := e.AppendJSON([]byte("prefix"))[len("prefix"):]
		var got struct {
			Error struct{ Message, Type, Param, Code string }
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("AppendJSON(%q) = %s: %v", msg, out, err)
		}
		ref, _ := json.Marshal(msg)
		var want string
		_ = json.Unmarshal(ref, &want)
		if got.Error.Message != want || got.Error.Type != e.Type || got.Error.Param != e.Param || got.Error.Code != e.Code {
			t.Fatalf("round trip of %q gave %+v", msg, got.Error)
		}
	}
	f("")
	f("plain")
	f(`quote " backslash \ slash /`)
	f("controls \x00\x01\x1f\t\n\r\x7f")
	f("unicode é 😀 \u2028")
	f("invalid \xff\xfe utf-8 \xe2\x82")
	f("<html> & 'single'")
}

func TestCutLongValues(t *testing.T) {
	f := func(raw, want string) {
		t.Helper()
		if got := cut([]byte(raw)); got != want {
			t.Fatalf("cut(%q) = %q, want %q", raw, got, want)
		}
	}
	f(`"short"`, `"short"`)
	forty := strings.Repeat("x", 40)
	f(forty, forty)
	f(forty+"y", forty+"...")
	// a multi-byte rune straddling byte 40 is dropped whole
	f(`"`+"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"+"é"+`x"`, `"`+"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"+`...`)
}
