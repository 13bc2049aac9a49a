package frontend_test

import (
	"testing"

	"golang.org/x/net/http2"

	"pdlb/lb/frontend"
)

// TestHTTP2InvalidSettings: a SETTINGS value out of its range is a
// connection error (RFC 9113 6.5.2), whichever place it has in its frame;
// a SETTINGS_MAX_FRAME_SIZE of 0 taken as the frame size would have every
// header block written as endless empty CONTINUATION frames.
func TestHTTP2InvalidSettings(t *testing.T) {
	f := func(t *testing.T, addr string, code http2.ErrCode, settings ...http2.Setting) {
		t.Helper()
		fr := rawH2(t, addr, nil)
		_ = fr.WriteSettings(settings...)
		_ = fr.WritePing(false, [8]byte{1})
		h2Until(t, fr, "GOAWAY", func(f http2.Frame) bool {
			if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
				t.Fatalf("SETTINGS %v taken", settings)
			}
			ga, ok := f.(*http2.GoAwayFrame)
			if ok && ga.ErrCode != code {
				t.Fatalf("GOAWAY %v; want %v", ga.ErrCode, code)
			}
			return ok
		})
	}
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			addr := serve(t, name, newApp().handler())
			f(t, addr, http2.ErrCodeProtocol, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 0})
			f(t, addr, http2.ErrCodeProtocol, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 24})
			f(t, addr, http2.ErrCodeProtocol, http2.Setting{ID: http2.SettingEnablePush, Val: 2})
			// The framer checks the first INITIAL_WINDOW_SIZE alone.
			f(t, addr, http2.ErrCodeFlowControl, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 31})
		})
	}
}

// TestHTTP2FrameTooShort: a padded DATA or HEADERS frame too short to
// hold its pad length is a connection error FRAME_SIZE_ERROR (RFC 9113
// 4.2), sent in a GOAWAY, not a silent close.
func TestHTTP2FrameTooShort(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			for _, typ := range []http2.FrameType{http2.FrameData, http2.FrameHeaders} {
				fr, c := rawH2Conn(t, serveWith(t, name, newApp().handler(), frontend.Options{MaxBodyBytes: testMaxBody}), nil)
				if typ == http2.FrameData {
					h2Open(fr, 1, "POST", "/", false)
				}
				// Length 0, the PADDED flag, stream 1.
				_, _ = c.Write([]byte{0, 0, 0, byte(typ), 0x8, 0, 0, 0, 1})
				if got := h2Outcome(fr, 1); got != "GOAWAY FRAME_SIZE_ERROR" {
					t.Errorf("an empty padded %v frame: %s, want GOAWAY FRAME_SIZE_ERROR", typ, got)
				}
			}
		})
	}
}
