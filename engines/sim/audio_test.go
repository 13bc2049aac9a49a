package sim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"pdlb/engines"
	"pdlb/internal/testaudio"
)

// TestSpeechToText: vLLM's transcription and translation APIs: a whole
// answer's text and the audio's duration (a translation's without it), a
// stream of transcription.chunk events with the usage chunk asked for and
// [DONE], max_completion_tokens bounding the text, and vLLM's refusals.
func TestSpeechToText(t *testing.T) {
	p := testPod(t, Config{Model: "whisper", Speedup: 100})
	c := testClient(t)
	sendAudio := func(path string, audio []byte, fields ...string) (int, string) {
		t.Helper()
		body, ct := testaudio.Form(audio, fields...)
		resp, err := c.Post("http://"+p.Addr()+path, ct, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	send := func(path string, seconds int, fields ...string) (int, string) {
		t.Helper()
		return sendAudio(path, testaudio.WAV(seconds, 0), fields...)
	}
	var whole struct {
		Text  string
		Usage *struct {
			Type    string
			Seconds int
		}
	}
	code, b := send("/v1/audio/transcriptions", 4, "model", "whisper")
	if code != 200 || json.Unmarshal([]byte(b), &whole) != nil || whole.Text == "" || whole.Usage == nil || *whole.Usage != (struct {
		Type    string
		Seconds int
	}{"duration", 4}) {
		t.Fatalf("transcription: %d %s", code, b)
	}
	// About speechTokensPerSecond words a second of audio: the stand-in
	// makes a token of each word.
	if n := len(strings.Fields(whole.Text)); n != 4*speechTokensPerSecond+1 {
		t.Errorf("a 4 s transcription of %d words: %q", n, whole.Text)
	}
	// A WAV written to a pipe declares the largest size: its samples run
	// to the file's end.
	if code, b := sendAudio("/v1/audio/transcriptions", testaudio.WAV(3, 0xFFFFFFFF)); code != 200 || !strings.HasSuffix(b, `"usage":{"seconds":3,"type":"duration"}}`) {
		t.Errorf("a piped WAV: %d %s", code, b)
	}
	if code, b := send("/v1/audio/transcriptions", 4, "max_completion_tokens", "2"); code != 200 || json.Unmarshal([]byte(b), &whole) != nil || len(strings.Fields(whole.Text)) != 2 {
		t.Errorf("max_completion_tokens 2: %d %s", code, b)
	}
	if code, b := send("/v1/audio/translations", 1, "model", "whisper"); code != 200 || !strings.HasPrefix(b, `{"text":`) || strings.Contains(b, "usage") {
		t.Errorf("translation: %d %s", code, b)
	}
	code, b = send("/v1/audio/transcriptions", 2, "model", "whisper", "stream", "true", "stream_include_usage", "true")
	events := strings.Split(strings.TrimSuffix(b, "\n\n"), "\n\n")
	if code != 200 || len(events) < 3 || events[len(events)-1] != "data: [DONE]" {
		t.Fatalf("stream: %d %q", code, events)
	}
	var text strings.Builder
	for i, ev := range events[:len(events)-1] {
		var ch struct {
			Object  string
			Choices []struct {
				Delta        struct{ Content string }
				FinishReason *string `json:"finish_reason"`
			}
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &ch) != nil || ch.Object != "transcription.chunk" {
			t.Fatalf("event %d: %s", i, ev)
		}
		switch last := i == len(events)-2; {
		case last && (ch.Usage == nil || ch.Usage.CompletionTokens != 2*speechTokensPerSecond+1 || len(ch.Choices) != 0):
			t.Errorf("the usage chunk: %s", ev)
		case !last && len(ch.Choices) == 1:
			text.WriteString(ch.Choices[0].Delta.Content)
			if f := ch.Choices[0].FinishReason; f != nil && (*f != "stop" || i != len(events)-3) {
				t.Errorf("event %d finishes %q", i, *f)
			}
		}
	}
	if text.Len() == 0 {
		t.Error("the stream carried no text")
	}
	for _, c := range []struct {
		fields []string
		code   int
		want   string
	}{
		{[]string{"model", "other"}, 404, "The model `other` does not exist."},
		{[]string{"stream_include_usage", "true"}, 400, "Stream options can only be defined when `stream=True`."},
		{[]string{"response_format", "srt"}, 400, "Currently only support response_format"},
		{[]string{"stream", "maybe"}, 400, "stream"},
	} {
		if code, b := send("/v1/audio/transcriptions", 1, c.fields...); code != c.code || !strings.Contains(b, c.want) {
			t.Errorf("%q: %d %s", c.fields, code, b)
		}
	}
	resp, err := c.Post("http://"+p.Addr()+"/v1/audio/transcriptions", "application/json", strings.NewReader(`{"model":"whisper"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnprocessableEntity {
		t.Errorf("a JSON body: %d, want FastAPI's 422", resp.StatusCode)
	}
	// vLLM serves them; SGLang and TensorRT-LLM do not.
	other := testPod(t, Config{Model: "whisper", Speedup: 100, Engine: engines.SGLang})
	body, ct := testaudio.Form(testaudio.WAV(1, 0))
	if resp, err := c.Post("http://"+other.Addr()+"/v1/audio/transcriptions", ct, bytes.NewReader(body)); err != nil || resp.StatusCode != 404 {
		t.Errorf("SGLang: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}
