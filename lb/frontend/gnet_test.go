package frontend

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestEngineStoppedOnItsOwn: gnet stops its engine on an event loop's
// error (an accept that failed) and gnet.Run then returns nil; Done must
// say so, or the process runs on with its port closed. A shutdown asked
// for is no failure.
func TestEngineStoppedOnItsOwn(t *testing.T) {
	h := Handler{Serve: func(*fasthttp.RequestCtx) {}, Error: func(*fasthttp.RequestCtx, error) {}}
	s, err := StartGNet("127.0.0.1:0", h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.eng.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.Done():
		if err == nil || !strings.Contains(err.Error(), "stopped on its own") {
			t.Fatalf("Done: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an engine that stopped on its own was not reported")
	}

	s, err = StartGNet("127.0.0.1:0", h, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ShutdownWithContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-s.stopped
	select {
	case err := <-s.Done():
		t.Fatalf("a shutdown reported as a failure: %v", err)
	default:
	}
}
