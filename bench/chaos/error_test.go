package chaos

import "testing"

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
