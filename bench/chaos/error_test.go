package chaos

import (
	"encoding/json"
	"testing"
)

// TestIsOpenAIError: vLLM nests its error object under "error"; SGLang and
// TensorRT-LLM answer a flat ErrorResponse (object "error"); both are clean.
func TestIsOpenAIError(t *testing.T) {
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`, true},
		{`{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}`, true},
		{`{"object":"error","message":"","type":"BadRequestError","code":400}`, false},
		{`{"message":"bad","type":"BadRequestError","code":400}`, false},
		{`{"error":{"message":"bad"}}`, false},
		{`{"choices":[]}`, false},
		{`not json`, false},
	} {
		if got := isOpenAIError([]byte(tc.body)); got != tc.want {
			t.Errorf("isOpenAIError(%s) = %v, want %v", tc.body, got, tc.want)
		}
	}
}

// TestOrigin: an error after retries is "retries spent" only once the
// attempts spent them as the gateway counts them: a move off a pod found
// dead on the request's first attempt there spends none, a return to a
// pod found dead again does.
func TestOrigin(t *testing.T) {
	const left = "retries left: no pod left, or not retried"
	f := func(line string, retries int, want string) {
		t.Helper()
		var l accessLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		if got := origin(l, retries); got != want {
			t.Errorf("origin(%s, %d) = %q, want %q", line, retries, got, want)
		}
	}
	const failed = `"error":"The inference server failed: connection refused"`
	f(`{"status":503,"attempts":0,"error":"No healthy inference server for model m"}`, 2, "gateway: no pod available")
	f(`{"status":500,"pod":"m-1","attempts":1}`, 2, "pod m-1's own 500")
	f(`{"status":502,"attempts":1,`+failed+`}`, 2, left)
	f(`{"status":502,"attempts":3,`+failed+`,"retried":[{"pod":"m-0","reason":"refused"},{"pod":"m-1","reason":"reset"}]}`, 2, "retries spent")
	// Two free moves: one retry spent of two.
	f(`{"status":502,"attempts":4,`+failed+`,"retried":[{"pod":"m-0","reason":"down"},{"pod":"m-1","reason":"down"},{"pod":"m-2","reason":"refused"}]}`, 2, left)
	// m-0 found dead again after the request went back to it: a retry.
	f(`{"status":502,"attempts":4,`+failed+`,"retried":[{"pod":"m-0","reason":"down"},{"pod":"m-1","reason":"refused"},{"pod":"m-0","reason":"down"}]}`, 2, "retries spent")
}
