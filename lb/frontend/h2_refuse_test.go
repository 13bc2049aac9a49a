package frontend_test

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"pdlb/lb/frontend"
)

// h2Request is a request's header block: method, path and fields.
func h2Request(method, path string, fields ...hpack.HeaderField) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range append([]hpack.HeaderField{{Name: ":method", Value: method}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: path}, {Name: ":authority", Value: "x"}}, fields...) {
		_ = enc.WriteField(f)
	}
	return b.Bytes()
}

// h2Outcome reads fr until stream id is answered: "status N", "RST
// CODE", or the connection's end ("GOAWAY CODE", a read error).
func h2Outcome(fr *http2.Framer, id uint32) string {
	if fr.ReadMetaHeaders == nil {
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return "read error: " + err.Error()
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			return "GOAWAY " + f.ErrCode.String()
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				return "RST " + f.ErrCode.String()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == id {
				return "status " + f.PseudoValue("status")
			}
		}
	}
}

func echoBody(ctx *fasthttp.RequestCtx) { ctx.SetBody(ctx.Request.Body()) }

// TestHTTP2RefusedStreamClosed: a stream whose HEADERS the framer refuses
// (a name in upper case) is reset and closed; the DATA or RST_STREAM its
// client sent on it meanwhile is dropped (RFC 9113 5.1), and the
// connection serves the next stream.
func TestHTTP2RefusedStreamClosed(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			for _, then := range []string{"DATA", "RST_STREAM"} {
				fr := rawH2(t, serveWith(t, name, frontend.Handler{Serve: echoBody, Error: writeFrontError}, frontend.Options{MaxBodyBytes: testMaxBody}), nil)
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: h2Request("POST", "/", hpack.HeaderField{Name: "Content-Type", Value: "text/plain"}), EndHeaders: true})
				if then == "DATA" {
					_ = fr.WriteData(1, true, []byte("hello"))
				} else {
					_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
				}
				h2Open(fr, 3, "GET", "/", true)
				if got := h2Outcome(fr, 3); got != "status 200" {
					t.Errorf("%s on the refused stream, then stream 3: %s, want status 200", then, got)
				}
			}
		})
	}
}

// TestHTTP2ContentLengthMismatch: a request whose DATA disagrees with its
// content-length is malformed (RFC 9113 8.1.1): its stream is reset with
// PROTOCOL_ERROR and its handler does not run.
func TestHTTP2ContentLengthMismatch(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			for _, tc := range []struct {
				length, body string
				want         string
			}{
				{"10", "12345", "RST PROTOCOL_ERROR"},
				{"2", "12345", "RST PROTOCOL_ERROR"},
				{"3", "", "RST PROTOCOL_ERROR"}, // HEADERS ends the stream
				{"+5", "12345", "RST PROTOCOL_ERROR"},
				{"5", "12345", "status 200"},
			} {
				fr := rawH2(t, serveWith(t, name, frontend.Handler{Serve: echoBody, Error: writeFrontError}, frontend.Options{MaxBodyBytes: testMaxBody}), nil)
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: h2Request("POST", "/", hpack.HeaderField{Name: "content-length", Value: tc.length}),
					EndHeaders: true, EndStream: tc.body == ""})
				if tc.body != "" {
					_ = fr.WriteData(1, true, []byte(tc.body))
				}
				if got := h2Outcome(fr, 1); got != tc.want {
					t.Errorf("content-length %s, %d bytes of DATA: %s, want %s", tc.length, len(tc.body), got, tc.want)
				}
			}
		})
	}
}

// TestHTTP2TrailerPseudoHeader: trailers that carry a pseudo-header make
// the request malformed (RFC 9113 8.1).
func TestHTTP2TrailerPseudoHeader(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			fr := rawH2(t, serveWith(t, name, frontend.Handler{Serve: echoBody, Error: writeFrontError}, frontend.Options{MaxBodyBytes: testMaxBody}), nil)
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: h2Request("POST", "/"), EndHeaders: true})
			_ = fr.WriteData(1, false, []byte("hi"))
			// A literal never indexed: the server's table stays as the
			// first block left it.
			var b bytes.Buffer
			_ = hpack.NewEncoder(&b).WriteField(hpack.HeaderField{Name: ":method", Value: "GET", Sensitive: true})
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b.Bytes(), EndHeaders: true, EndStream: true})
			if got := h2Outcome(fr, 1); got != "RST PROTOCOL_ERROR" {
				t.Errorf("trailers with :method: %s, want RST PROTOCOL_ERROR", got)
			}
		})
	}
}

// TestRapidResetByServer: a client that has the server reset its streams
// (a zero WINDOW_UPDATE on each it opens, CVE-2025-8671) is charged as one
// that resets them itself: each such stream frees its place while its
// handler runs on, and the client is throttled, then cut off, before it
// has more handlers running than the streams it may have open. Another
// client is served meanwhile.
func TestRapidResetByServer(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			const maxStreams = 250
			var held atomic.Int32
			release := make(chan struct{})
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) {
				if string(ctx.Path()) == "/hold" {
					held.Add(1)
					<-release
				}
				echoBody(ctx)
			}, Error: writeFrontError}
			o := frontend.Options{MaxBodyBytes: testMaxBody, HTTP2: frontend.HTTP2{MaxResetsPerSecond: 10, MaxConcurrentStreams: maxStreams}}
			addr := serveWith(t, name, h, o)
			t.Cleanup(func() { close(release) }) // before the server's shutdown
			fr := rawH2(t, addr, nil)
			fr.AllowIllegalWrites = true
			closed := make(chan error, 1)
			go func() {
				for {
					if _, err := fr.ReadFrame(); err != nil {
						closed <- err
						return
					}
				}
			}()
			done := make(chan struct{})
			go func() {
				defer close(done)
				block := h2Request("GET", "/hold")
				for id := uint32(1); ; id += 2 {
					if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true, EndStream: true}) != nil ||
						fr.WriteWindowUpdate(id, 0) != nil {
						return
					}
				}
			}()
			othersServed(t, "http://"+addr+"/")
			select {
			case err := <-closed:
				t.Logf("the offender's connection ended (%v) with %d handlers running", err, held.Load())
			case <-time.After(12 * time.Second):
				t.Fatal("the offender is still connected")
			}
			<-done
			if n := held.Load(); n >= maxStreams {
				t.Errorf("%d handlers ran for streams the server reset, more than the %d streams a connection may have open", n, maxStreams)
			}
		})
	}
}

// TestHTTP2BodyBudget: the request bodies one connection holds add up to
// at most four of the largest (MaxBodyBytes), or to
// MaxBodyBytesPerConnection; a stream whose DATA would go past that is
// refused (REFUSED_STREAM, which a client may send again), and the budget
// comes back as answers end.
func TestHTTP2BodyBudget(t *testing.T) {
	const maxBody = 1000
	part := bytes.Repeat([]byte("x"), 900)
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			// By default four bodies of 900 bytes are held, the fifth
			// would make 4,500; max_body_bytes_per_connection at 6,300
			// holds seven.
			for _, tc := range []struct {
				perConn int64
				held    uint32
			}{{0, 4}, {6300, 7}} {
				o := frontend.Options{MaxBodyBytes: maxBody, HTTP2: frontend.HTTP2{MaxBodyBytesPerConnection: tc.perConn}}
				fr := rawH2(t, serveWith(t, name, frontend.Handler{Serve: echoBody, Error: writeFrontError}, o), nil)
				over := 2*tc.held + 1
				for id := uint32(1); id <= over; id += 2 {
					h2Open(fr, id, "POST", "/", false)
					_ = fr.WriteData(id, false, part)
				}
				if got := h2Outcome(fr, over); got != "RST REFUSED_STREAM" {
					t.Fatalf("per connection %d: body %d held on one connection: %s, want RST REFUSED_STREAM", tc.perConn, tc.held+1, got)
				}
				for id := uint32(1); id < over; id += 2 {
					_ = fr.WriteData(id, true, nil)
					if got := h2Outcome(fr, id); got != "status 200" {
						t.Fatalf("per connection %d: stream %d, within the budget: %s", tc.perConn, id, got)
					}
				}
				h2Open(fr, over+2, "POST", "/", false)
				_ = fr.WriteData(over+2, true, part)
				if got := h2Outcome(fr, over+2); got != "status 200" {
					t.Errorf("per connection %d: a body after the others were answered: %s, want status 200", tc.perConn, got)
				}
			}
		})
	}
}

// TestHTTP2FramesOutOfState: a WINDOW_UPDATE on a stream the client never
// opened is a connection error (RFC 9113 5.1, idle), a zero one too (the
// framer refuses it, and no RST_STREAM may answer a frame on an idle
// stream), and HEADERS on a
// stream whose client side ended is a stream error STREAM_CLOSED (5.1,
// half-closed (remote)) while its handler runs.
func TestHTTP2FramesOutOfState(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			release := make(chan struct{})
			h := frontend.Handler{Serve: func(ctx *fasthttp.RequestCtx) {
				<-release
				echoBody(ctx)
			}, Error: writeFrontError}
			addr := serveWith(t, name, h, frontend.Options{MaxBodyBytes: testMaxBody})
			t.Cleanup(func() { close(release) }) // before the server's shutdown

			fr := rawH2(t, addr, nil)
			_ = fr.WriteWindowUpdate(5, 100)
			if got := h2Outcome(fr, 5); got != "GOAWAY PROTOCOL_ERROR" {
				t.Errorf("WINDOW_UPDATE on an idle stream: %s, want GOAWAY PROTOCOL_ERROR", got)
			}

			fr = rawH2(t, addr, nil)
			fr.AllowIllegalWrites = true
			_ = fr.WriteWindowUpdate(5, 0) // which the framer refuses
			if got := h2Outcome(fr, 5); got != "GOAWAY PROTOCOL_ERROR" {
				t.Errorf("a zero WINDOW_UPDATE on an idle stream: %s, want GOAWAY PROTOCOL_ERROR", got)
			}

			fr = rawH2(t, addr, nil)
			h2Open(fr, 1, "GET", "/", true)
			h2Open(fr, 1, "GET", "/", true)
			if got := h2Outcome(fr, 1); got != "RST STREAM_CLOSED" {
				t.Errorf("HEADERS after the client's side ended: %s, want RST STREAM_CLOSED", got)
			}
		})
	}
}

// h2Trailers is a trailer block of one field.
func h2Trailers() []byte {
	var b bytes.Buffer
	_ = hpack.NewEncoder(&b).WriteField(hpack.HeaderField{Name: "x-checksum", Value: "abc"})
	return b.Bytes()
}

// TestHTTP2FramesAfterServerReset: the DATA and trailers a client sent on
// a stream before it saw the server reset it (a 413 answered early, a
// stream over the body budget refused) are dropped (RFC 9113 5.1): the
// connection and its other streams go on.
func TestHTTP2FramesAfterServerReset(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			for _, why := range []string{"413", "budget"} {
				const maxBody = 1000
				fr := rawH2(t, serveWith(t, name, frontend.Handler{Serve: echoBody, Error: writeFrontError}, frontend.Options{MaxBodyBytes: maxBody}), nil)
				// Streams 1 to 7 wait for the ends of their bodies.
				for id := uint32(1); id <= 7; id += 2 {
					h2Open(fr, id, "POST", "/", false)
					_ = fr.WriteData(id, false, make([]byte, 900))
				}
				want := "RST REFUSED_STREAM" // a fifth body of 900 bytes is over the budget
				if why == "413" {
					_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 9, BlockFragment: h2Request("POST", "/", hpack.HeaderField{Name: "content-length", Value: "5000"}), EndHeaders: true})
					want = "status 413"
				} else {
					h2Open(fr, 9, "POST", "/", false)
					_ = fr.WriteData(9, false, make([]byte, 900))
				}
				if got := h2Outcome(fr, 9); got != want {
					t.Fatalf("%s: stream 9: %s, want %s", why, got, want)
				}
				_ = fr.WriteData(9, false, []byte("more"))
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 9, BlockFragment: h2Trailers(), EndHeaders: true, EndStream: true})
				for id := uint32(1); id <= 7; id += 2 {
					_ = fr.WriteData(id, true, nil)
					if got := h2Outcome(fr, id); got != "status 200" {
						t.Fatalf("%s: stream %d after DATA and trailers on the reset stream 9: %s, want status 200", why, id, got)
					}
				}
			}
		})
	}
}

// TestHTTP2BodyBudgetBackWithAnswer: the connection's body budget gets a
// request's body back once its answer ended, so a client that uploads the
// next bodies as soon as it read the answers is never refused at the
// budget's edge.
func TestHTTP2BodyBudgetBackWithAnswer(t *testing.T) {
	for _, name := range frontEnds {
		t.Run(name, func(t *testing.T) {
			const maxBody = 1000 // a budget of four bodies of 900 bytes
			fr := rawH2(t, serveWith(t, name, frontend.Handler{Serve: echoBody, Error: writeFrontError}, frontend.Options{MaxBodyBytes: maxBody}), nil)
			id := uint32(1)
			for round := range 1000 {
				for k := range uint32(4) {
					h2Open(fr, id+2*k, "POST", "/", false)
					_ = fr.WriteData(id+2*k, true, make([]byte, 900))
				}
				for ended := 0; ended < 4; {
					f, err := fr.ReadFrame()
					if err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
					switch f := f.(type) {
					case *http2.RSTStreamFrame:
						t.Fatalf("round %d, stream %d: RST %v", round, f.StreamID, f.ErrCode)
					case *http2.DataFrame:
						if n := len(f.Data()); n > 0 {
							_ = fr.WriteWindowUpdate(0, uint32(n))
						}
						if f.StreamEnded() {
							ended++
						}
					}
				}
				id += 8
			}
		})
	}
}
