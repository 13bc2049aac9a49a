package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"pdlb/lb/evloop"
)

// booting is the splice, handing its engine over once it boots.
type booting struct {
	*splice
	booted chan<- *evloop.Engine
}

func (b *booting) OnBoot(e *evloop.Engine) { b.booted <- e }

// TestSplice: requests on kept connections reach the upstream and their
// answers come back whole, and a client's close closes its upstream
// connection.
func TestSplice(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("the loop's wait would hold the only P")
	}
	closed := make(chan struct{}, 1)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(append([]byte("echo:"), b...))
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			select {
			case closed <- struct{}{}:
			default:
			}
		}
	}
	up.Start()
	defer up.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	// One loop: while it holds connections its wait holds a P, and the
	// upstream and the client need the other.
	s := &splice{upstream: up.Listener.Addr().String()}
	booted, ran := make(chan *evloop.Engine, 1), make(chan error, 1)
	go func() { ran <- evloop.Run(&booting{s, booted}, addr, evloop.Options{Loops: 1}) }()
	select {
	case eng := <-booted:
		defer func() {
			eng.Stop()
			if err := <-ran; err != nil {
				t.Error(err)
			}
		}()
	case err := <-ran:
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if i == 100 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The probe's connection closed its upstream one.
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("a client's close left its upstream connection open")
	}

	tr := &http.Transport{MaxIdleConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	body := strings.Repeat("x", 64<<10) // several reads and writes each way
	for i := 0; i < 20; i++ {
		resp, err := client.Post("http://"+addr+"/", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(got) != "echo:"+body {
			t.Fatalf("request %d: %d bytes back (%v), want the %d-byte echo", i, len(got), err, len(body)+5)
		}
	}
	tr.CloseIdleConnections()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the client's close left its upstream connection open")
	}
}
