package chaos

import (
	"encoding/json"
	"testing"
	"time"
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

// TestDescribeAt: an error sample names each pod's fault then, or how long
// it had been back and from which fault.
func TestDescribeAt(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	s := schedule{spans: make([][]span, 3)}
	s.begin(0, "hang", at(100))
	s.end(0, at(900))
	s.begin(0, "kill", at(2000))
	s.begin(1, "slow", at(500))
	got := s.describeAt(at(1000), start)
	if want := "0 ok since 900ms (hang), 1 slow since 500ms, 2 ok"; got != want {
		t.Errorf("describeAt = %q, want %q", got, want)
	}
}
