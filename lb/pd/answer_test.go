package pd

import (
	"testing"
)

func TestAppendAnswerSSE(t *testing.T) {
	f := func(body string, chat, usage bool, want string) {
		t.Helper()
		got, err := AppendAnswerSSE(nil, []byte(body), chat, usage)
		if err != nil || string(got) != want {
			t.Fatalf("%s:\n got %q, %v\nwant %q", body, got, err, want)
		}
	}
	usage := `"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}`
	f(`{"id":"c1","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop","disaggregated_params":{"x":1}}],`+usage+`}`, true, true,
		`data: {"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}]}`+"\n\n"+
			`data: {"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[],`+usage+`}`+"\n\n"+
			"data: [DONE]\n\n")
	f(`{"id":"c2","object":"text_completion","created":6,"model":"m","choices":[{"index":0,"text":"","finish_reason":"stop"}],`+usage+`}`, false, false,
		`data: {"id":"c2","object":"text_completion","created":6,"model":"m","choices":[{"index":0,"text":"","finish_reason":"stop"}]}`+"\n\n"+
			"data: [DONE]\n\n")
	if _, err := AppendAnswerSSE(nil, []byte(`{"choices":`), true, false); err == nil {
		t.Fatal("a broken answer converted")
	}
}
