// Package testaudio makes what tests of the speech-to-text APIs send: a
// WAV file and the multipart form that carries it.
package testaudio

import (
	"bytes"
	"encoding/binary"
	"mime/multipart"
)

// WAV is a silent 16 kHz, 16-bit mono WAV file of the given seconds whose
// data chunk declares size bytes (0: its own).
func WAV(seconds int, size uint32) []byte {
	data := 32000 * seconds
	if size == 0 {
		size = uint32(data)
	}
	var b bytes.Buffer
	b.WriteString("RIFF")
	_ = binary.Write(&b, binary.LittleEndian, uint32(36+data))
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(16000), uint32(32000), uint16(2), uint16(16)} {
		_ = binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("data")
	_ = binary.Write(&b, binary.LittleEndian, size)
	b.Write(make([]byte, data))
	return b.Bytes()
}

// Form is a speech-to-text form: audio as its file first, as the OpenAI
// Node SDK sends it, then fields in the given order (name, value pairs);
// and its Content-Type.
func Form(audio []byte, fields ...string) (body []byte, contentType string) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	// Writes to a bytes.Buffer do not fail.
	f, _ := w.CreateFormFile("file", "speech.wav")
	_, _ = f.Write(audio)
	for i := 0; i+1 < len(fields); i += 2 {
		_ = w.WriteField(fields[i], fields[i+1])
	}
	_ = w.Close()
	return b.Bytes(), w.FormDataContentType()
}
