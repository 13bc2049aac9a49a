package lb_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"pdlb/internal/testaudio"
	"pdlb/lb"
	"pdlb/lb/config"
	"pdlb/lb/limits"
)

// postForm posts a form to path on s.
func postForm(t *testing.T, s *lb.Server, path string, body []byte, contentType string, headers ...string) (*http.Response, string) {
	t.Helper()
	return send(t, client, s, "POST", path, string(body), append(headers, "Content-Type", contentType)...)
}

// TestAudioAPIs: vLLM's speech-to-text APIs (transcriptions, translations)
// go to a pod of the model the form names, on either front end: whole
// answers with the audio's duration, streams of chunks through [DONE], an
// alias's model rewritten in the form (the pod refuses any other name),
// and the gateway's own 400 and 404 for what it cannot route.
func TestAudioAPIs(t *testing.T) {
	pods := podsOf("whisper", testFleet(t, "whisper", 2, 1000)...)
	audio := testaudio.WAV(2, 0)
	for _, fe := range []string{"fasthttp", "gnet"} {
		t.Run(fe, func(t *testing.T) {
			s := testGateway(t, pods, func(c *config.Config) {
				c.Frontend = fe
				c.Aliases = []config.Alias{{Name: "whisper-1", Targets: []config.AliasTarget{{Model: "whisper"}}}}
			})
			for _, model := range []string{"whisper", "whisper-1"} {
				body, ct := testaudio.Form(audio, "model", model, "response_format", "json")
				resp, b := postForm(t, s, "/v1/audio/transcriptions", body, ct)
				var got struct {
					Text  string
					Usage struct {
						Type    string
						Seconds int
					}
				}
				if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &got) != nil {
					t.Fatalf("%s: %d %s", model, resp.StatusCode, b)
				}
				if got.Text == "" || got.Usage.Type != "duration" || got.Usage.Seconds != 2 {
					t.Errorf("%s: answer %s", model, b)
				}
				if !strings.HasPrefix(resp.Header.Get("x-pdlb-pod"), "whisper-") {
					t.Errorf("%s: x-pdlb-pod %q", model, resp.Header.Get("x-pdlb-pod"))
				}
			}
			// A translation has no usage; the form's last model wins, as
			// in the engine's form parser.
			body, ct := testaudio.Form(audio, "model", "nothing", "model", "whisper-1")
			if resp, b := postForm(t, s, "/v1/audio/translations", body, ct); resp.StatusCode != 200 || !strings.HasPrefix(b, `{"text":`) || strings.Contains(b, "usage") {
				t.Errorf("translation: %d %s", resp.StatusCode, b)
			}
			body, ct = testaudio.Form(audio, "stream", "true", "model", "whisper", "stream_include_usage", "True")
			resp, b := postForm(t, s, "/v1/audio/transcriptions", body, ct)
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("stream: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
			}
			events := strings.Split(strings.TrimSuffix(b, "\n\n"), "\n\n")
			if len(events) < 3 || events[len(events)-1] != "data: [DONE]" ||
				!strings.Contains(events[0], `"object":"transcription.chunk"`) || !strings.Contains(events[len(events)-2], `"usage":{`) {
				t.Errorf("stream: %q", events)
			}
			for _, c := range []struct {
				body   []byte
				ct     string
				status int
				want   string
			}{
				{[]byte(`{"model":"whisper"}`), "application/json", 400, "multipart/form-data"},
				{body, "multipart/form-data", 400, "multipart/form-data"},
				{body[:len(body)-10], ct, 400, "multipart/form-data body"},
			} {
				if resp, b := postForm(t, s, "/v1/audio/transcriptions", c.body, c.ct); resp.StatusCode != c.status || !strings.Contains(b, c.want) {
					t.Errorf("%.40q (%s): %d %s, want %d with %q", c.body, c.ct, resp.StatusCode, b, c.status, c.want)
				}
			}
			for _, c := range []struct {
				fields []string
				status int
				want   string
			}{
				{[]string{"model", "whisper", "stream", "maybe"}, 400, `must be a boolean, got maybe`},
				{[]string{"model", "nope"}, 404, "The model `nope` does not exist."},
			} {
				body, ct := testaudio.Form(audio, c.fields...)
				if resp, b := postForm(t, s, "/v1/audio/transcriptions", body, ct); resp.StatusCode != c.status || !strings.Contains(b, c.want) {
					t.Errorf("%q: %d %s, want %d with %q", c.fields, resp.StatusCode, b, c.status, c.want)
				}
			}
		})
	}
}

// TestAudioBudget: an upload charges its key's tokens_per_minute for its
// form's text, not for its audio: 15 s of WAV (480 KB, 120,000 tokens at
// the stand-in's 4 bytes a token) passes a key of 1,000 a minute, a
// prompt over it does not.
func TestAudioBudget(t *testing.T) {
	const key = "sk-audio-0123456789abcdef0123456789"
	s := testGateway(t, podsOf("whisper", testFleet(t, "whisper", 1, 1000)...), func(c *config.Config) {
		c.Access.APIKeys = []limits.APIKey{{Name: "k", SHA256: limits.HashKey(key), TokensPerMinute: 1000}}
	})
	for _, c := range []struct {
		prompt string
		status int
	}{{"Names: pdlb.", 200}, {strings.Repeat("word ", 1000), 429}} {
		body, ct := testaudio.Form(testaudio.WAV(15, 0), "model", "whisper", "prompt", c.prompt)
		if resp, b := postForm(t, s, "/v1/audio/transcriptions", body, ct, "Authorization", "Bearer "+key); resp.StatusCode != c.status {
			t.Errorf("a prompt of %d bytes: %d %s, want %d", len(c.prompt), resp.StatusCode, b, c.status)
		}
	}
}
