package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"math/rand/v2"
	"mime/multipart"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestParseForm reads forms Go's multipart.Writer makes, fields in every
// order and the file's bytes full of look-alike delimiters (the boundary
// too, where it delimits nothing), and checks
// the model and stream against what multipart.Reader reads (a field's
// last value winning); then WithModel's body, read again by
// multipart.Reader, holds the new model and every other part unchanged.
func TestParseForm(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 300 {
		var b bytes.Buffer
		w := multipart.NewWriter(&b)
		if err := w.SetBoundary("b" + strconv.FormatUint(rng.Uint64(), 36)); err != nil {
			t.Fatal(err)
		}
		// The boundary itself, not at a delimiter's place or followed by
		// other bytes, is content.
		pieces := []string{"\r\n--", w.Boundary()[:rng.IntN(len(w.Boundary()))], "x", "\r\n\r\n",
			"Content-Disposition: form-data; name=\"model\"\r\n", "\r\n--" + w.Boundary() + "x"}
		var file []byte
		for range rng.IntN(200) {
			file = append(file, pieces[rng.IntN(len(pieces))]...)
		}
		fields := [][2]string{{"model", "whisper-" + string(rune('a'+i%26))}, {"stream", []string{"true", "0", "Yes", "off"}[i%4]}, {"language", "en"}, {"model", "m2"}}
		rng.Shuffle(len(fields), func(a, b int) { fields[a], fields[b] = fields[b], fields[a] })
		fields = fields[:1+rng.IntN(len(fields))]
		at := rng.IntN(len(fields) + 1)
		for j, f := range fields {
			if j == at {
				fw, _ := w.CreateFormFile("file", "a.wav")
				fw.Write(file)
			}
			w.WriteField(f[0], f[1])
		}
		if at == len(fields) {
			fw, _ := w.CreateFormFile("file", "a.wav")
			fw.Write(file)
		}
		w.Close()
		body := b.Bytes()

		var r Request
		if err := r.ParseForm(body, []byte(w.FormDataContentType())); err != nil {
			t.Fatalf("form %d: %v", i, err)
		}
		want := readForm(t, body, w.Boundary())
		if string(r.Model) != want["model"] || r.Kind != KindAudio {
			t.Fatalf("form %d: model %q, want %q", i, r.Model, want["model"])
		}
		if s, ok := want["stream"]; ok && r.Stream != (s == "true" || s == "Yes") || !ok && r.Stream {
			t.Fatalf("form %d: stream %v, the form says %q", i, r.Stream, s)
		}
		if _, ok := want["model"]; !ok {
			continue
		}
		out := r.WithModel(body, "renamed")
		got := readForm(t, out, w.Boundary())
		if got["model"] != "renamed" || got["file"] != want["file"] || got["stream"] != want["stream"] || got["language"] != want["language"] {
			t.Fatalf("form %d: WithModel's form reads %q", i, got)
		}
	}
}

// readForm reads body's parts with Go's multipart.Reader: the last value
// of each field.
func readForm(t *testing.T, body []byte, boundary string) map[string]string {
	t.Helper()
	out := map[string]string{}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		v, _ := io.ReadAll(p)
		out[p.FormName()] = string(v)
	}
}

// TestParseFormErrors: what is no form, or cut short, is the client's
// 400, naming what is wrong.
func TestParseFormErrors(t *testing.T) {
	const ct = "multipart/form-data; boundary=XyZ"
	part := "--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n"
	field := func(name, value string) string {
		return "--XyZ\r\nContent-Disposition: form-data; name=\"" + name + "\"\r\n\r\n" + value + "\r\n"
	}
	for _, c := range []struct {
		body, ct, want string
	}{
		{`{"model":"m"}`, "application/json", "must be multipart/form-data"},
		{part + "--XyZ--", "multipart/form-data", "must be multipart/form-data"},
		{part + "--XyZ--", "multipart/form-data; boundary=", "must be multipart/form-data"},
		{part, ct, "could not parse"},
		{part + "--XyZ", ct, "could not parse"},
		{"--XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\nm\r\n--XyZ--", ct, "could not parse"},
		{"no delimiter", ct, "could not parse"},
		{field("stream", "maybe") + "--XyZ--", ct, `"stream" must be a boolean, got maybe`},
		{field("stream", "true") + field("stream", "maybe") + "--XyZ--", ct, "got maybe"},
		{strings.Repeat(field("language", "en"), 1001) + "--XyZ--", ct, "more than 1000 fields"},
		// Transport padding after a boundary: the engine's parser finds
		// no line's end there either.
		{"--XyZ \r\n" + part[7:] + "--XyZ--", ct, "could not parse"},
		// The first delimiter is at the body's first '-'.
		{"pre-amble\r\n" + part + "--XyZ--", ct, "could not parse"},
	} {
		var r Request
		err := r.ParseForm([]byte(c.body), []byte(c.ct))
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || !strings.Contains(e.Message, c.want) {
			t.Errorf("%.80q (%s): %v, want a 400 saying %q", c.body, c.ct, err, c.want)
		}
	}
	file := "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF....\r\n"
	for _, c := range []struct {
		what, body string
		model      string
		stream     bool
		text       int
	}{
		{"a preamble and an epilogue", "preamble\r\n" + part + "--XyZ--\r\nepilogue", "m", false, 1},
		{"a line's end, then the form", "\n" + part + "--XyZ--", "m", false, 1},
		{"other bytes, then the form", "\r\nxx" + part + "--XyZ--", "m", false, 1},
		// Only a field's last value counts, a bad one before it too; an
		// empty one is absent.
		{"stream maybe, then ON", field("stream", "maybe") + field("stream", "ON") + "--XyZ--", "", true, 7},
		{"stream empty", field("stream", "") + part + "--XyZ--", "m", false, 1},
		// A file's bytes are not the form's text.
		{"a file", file + field("prompt", "Hello") + part + "--XyZ--", "m", false, 6},
		// A part without headers, or whose name cannot be read, is the
		// engine's to judge.
		{"a part without headers", "--XyZ\r\n\r\nheaderless\r\n" + part + "--XyZ--", "m", false, 11},
		{"a file part Go's parser refuses", "--XyZ\r\nContent-Disposition: form-data; filename=a b.wav\r\n\r\nx\r\n" + part + "--XyZ--", "m", false, 1},
		// Content-Disposition read as python-multipart reads it: its type
		// is not looked at, a repeated key's last value wins, a word
		// without '=' and an extended (starred) key are skipped.
		{"attachment", strings.Replace(part, "form-data", "attachment", 1) + "--XyZ--", "m", false, 1},
		{"two names", strings.Replace(part, `name="model"`, `name="x"; name="model"`, 1) + "--XyZ--", "m", false, 1},
		{"a bare word", strings.Replace(part, `name="model"`, `name="model"; junk`, 1) + "--XyZ--", "m", false, 1},
		{"filename*", strings.Replace(part, `name="model"`, `name="model"; filename*=UTF-8''a.wav`, 1) + "--XyZ--", "m", false, 1},
		{"name*", strings.Replace(part, `name="model"`, `name="prompt"; name*=UTF-8''model`, 1) + "--XyZ--", "", false, 1},
		{"a quoted ';'", strings.Replace(part, `name="model"`, `filename="a;b.wav"; name="model"`, 1) + "--XyZ--", "", false, 0},
		// The last Content-Disposition names the part.
		{"two headers", "--XyZ\r\nContent-Disposition: form-data; name=\"prompt\"\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm2\r\n--XyZ--", "m2", false, 2},
	} {
		var r Request
		if err := r.ParseForm([]byte(c.body), []byte(ct)); err != nil || string(r.Model) != c.model || r.Stream != c.stream || r.FormTextBytes != c.text {
			t.Errorf("%s: %v, model %q, stream %v, %d bytes of text", c.what, err, r.Model, r.Stream, r.FormTextBytes)
		}
	}
	// The boundary is unquoted as python-multipart unquotes it: only \\
	// and \" are escapes, so X\=Z keeps its backslash.
	var r Request
	body := "--X\\=Z\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--X\\=Z--"
	if err := r.ParseForm([]byte(body), []byte(`multipart/form-data; boundary="X\=Z"`)); err != nil || string(r.Model) != "m" {
		t.Errorf("boundary X\\=Z: %v, model %q", err, r.Model)
	}
}

// BenchmarkParseForm reads the model and stream of a 1 MiB audio form
// (the file first, as the OpenAI Node SDK sends it): ParseForm against
// mime/multipart's Reader, which must copy the file's bytes to reach
// the fields after it.
func BenchmarkParseForm(b *testing.B) {
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	fw, _ := w.CreateFormFile("file", "speech.wav")
	audio := make([]byte, 1<<20)
	for i := range audio {
		audio[i] = byte(i * 7)
	}
	fw.Write(audio)
	w.WriteField("model", "whisper-large-v3")
	w.WriteField("stream", "true")
	w.Close()
	body, ct := buf.Bytes(), []byte(w.FormDataContentType())
	b.Run("ParseForm", func(b *testing.B) {
		var r Request
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if err := r.ParseForm(body, ct); err != nil || !r.Stream {
				b.Fatal(err)
			}
		}
	})
	b.Run("multipart.Reader", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			mr := multipart.NewReader(bytes.NewReader(body), w.Boundary())
			var model, stream []byte
			for {
				p, err := mr.NextPart()
				if err == io.EOF {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
				switch p.FormName() {
				case "model":
					model, _ = io.ReadAll(p)
				case "stream":
					stream, _ = io.ReadAll(p)
				}
			}
			if len(model) == 0 || string(stream) != "true" {
				b.Fatal("fields not read")
			}
		}
	})
}

// TestOptionsHeader: header parameters read as python-multipart reads
// them, header by header as its parse_options_header read them
// (testdata/options_header.json, written by options_header.py).
func TestOptionsHeader(t *testing.T) {
	raw, err := os.ReadFile("testdata/options_header.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Header, Type string
		Params       map[string]string
	}
	if err := json.Unmarshal(raw, &cases); err != nil || len(cases) == 0 {
		t.Fatalf("options_header.json: %v", err)
	}
	for _, c := range cases {
		var typ string
		params := map[string]string{}
		optionsHeader([]byte(c.Header), func(s string) { typ = s }, func(k, v string) { params[k] = v })
		if typ != c.Type || !maps.Equal(params, c.Params) {
			t.Errorf("%s: %q %q, want %q %q", c.Header, typ, params, c.Type, c.Params)
		}
	}
}
