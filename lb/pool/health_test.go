package pool

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"pdlb/internal/testnet"
	"pdlb/lb/config"
)

// TestCheckUnhealthyAfter: failed checks take a pod out only when
// UnhealthyAfter of them come in a row; a refused connection takes it out
// at once; one passing check brings it back.
func TestCheckUnhealthyAfter(t *testing.T) {
	var status atomic.Int32
	status.Store(http.StatusInternalServerError)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	c := &Checker{cfg: config.Health{Timeout: time.Second, UnhealthyAfter: 3}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	check := func(p *Pod) bool {
		client := &fasthttp.HostClient{Addr: p.Config.Address}
		defer client.CloseIdleConnections()
		c.check(client, p)
		return p.Healthy()
	}
	p := &Pod{Config: config.Pod{Address: strings.TrimPrefix(srv.URL, "http://")}, podState: &podState{}}
	p.set(flagHealthy, true)
	for i, want := range []bool{true, true, false, false} {
		if got := check(p); got != want {
			t.Fatalf("after %d failed checks in a row: healthy %v, want %v", i+1, got, want)
		}
	}
	status.Store(http.StatusOK)
	if !check(p) {
		t.Fatal("a passing check did not bring the pod back")
	}
	// Two failures, a pass, two failures: never three in a row.
	for i, s := range []int32{500, 500, 200, 500, 500} {
		status.Store(s)
		if !check(p) {
			t.Fatalf("check %d: unhealthy without three failures in a row", i+1)
		}
	}

	closed := testnet.Refusing(t)
	dead := &Pod{Config: config.Pod{Address: closed}, podState: &podState{}}
	dead.set(flagHealthy, true)
	if check(dead) {
		t.Fatal("a refused connection did not mark the pod unhealthy at once")
	}

	// No descriptor for the check's connection: the gateway's limit, no
	// verdict on the pod, however often.
	status.Store(http.StatusOK)
	check(p)
	full := &fasthttp.HostClient{Addr: p.Config.Address, Dial: func(string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}
	}}
	for range 5 {
		c.check(full, p)
	}
	if !p.Healthy() || p.checkFails.Load() != 0 {
		t.Fatalf("checks without a descriptor: healthy %v after %d failures counted", p.Healthy(), p.checkFails.Load())
	}
}

// TestCheckTimeoutWhileAnswering: a saturated engine's /health answers
// late. A check that timed out does not count against a pod that answered
// a request since the previous check; it does once the pod answers
// nothing, and a failing status counts whatever the pod answers.
func TestCheckTimeoutWhileAnswering(t *testing.T) {
	var slow atomic.Bool
	var status atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if slow.Load() {
			time.Sleep(300 * time.Millisecond)
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	c := &Checker{cfg: config.Health{Timeout: 50 * time.Millisecond, UnhealthyAfter: 2}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	client := &fasthttp.HostClient{Addr: strings.TrimPrefix(srv.URL, "http://")}
	defer client.CloseIdleConnections()
	p := &Pod{Config: config.Pod{Address: client.Addr}, podState: &podState{}}
	p.set(flagHealthy, true)

	slow.Store(true)
	for i := range 4 {
		p.ReportSuccess() // a request answered between two checks
		if c.check(client, p); !p.Healthy() || p.checkFails.Load() != 0 {
			t.Fatalf("check %d timed out while the pod answered requests: healthy %v, %d failures counted", i+1, p.Healthy(), p.checkFails.Load())
		}
	}
	for i, want := range []bool{true, false} {
		if c.check(client, p); p.Healthy() != want {
			t.Fatalf("timeout %d with no request answered: healthy %v, want %v", i+1, p.Healthy(), want)
		}
	}

	slow.Store(false)
	c.check(client, p)
	status.Store(http.StatusServiceUnavailable)
	for i, want := range []bool{true, false} {
		p.ReportSuccess()
		if c.check(client, p); p.Healthy() != want {
			t.Fatalf("503 %d while the pod answered requests: healthy %v, want %v", i+1, p.Healthy(), want)
		}
	}
}

func TestLate(t *testing.T) {
	timeout := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ETIMEDOUT)}
	for err, want := range map[error]bool{
		fasthttp.ErrTimeout:     true,
		fasthttp.ErrDialTimeout: true,
		fasthttp.ErrNoFreeConns: true, // the earlier checks still wait
		timeout:                 true,
		io.EOF:                  false,
		&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}: false,
	} {
		if late(err) != want {
			t.Errorf("late(%v) = %v, want %v", err, !want, want)
		}
	}
}

// TestCheckFailForgetsPrefillInfo: a pod that fails a check may come back
// as another process, whose PD info (TensorRT-LLM's /server_info, its KV
// transceiver's endpoint) is another: the pod asks for it anew.
func TestCheckFailForgetsPrefillInfo(t *testing.T) {
	var status atomic.Int32
	var infos atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/server_info" {
			infos.Add(1)
			return
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	c := &Checker{cfg: config.Health{Timeout: time.Second, UnhealthyAfter: 3}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	client := &fasthttp.HostClient{Addr: strings.TrimPrefix(srv.URL, "http://")}
	defer client.CloseIdleConnections()
	p := &Pod{Config: config.Pod{Address: client.Addr}, podState: &podState{}}
	p.set(flagHealthy, true)
	info := func(want int32) {
		t.Helper()
		if _, err := p.PrefillInfo.Get(client, client.Addr, "/server_info", nil); err != nil || infos.Load() != want {
			t.Fatalf("asked %d times (%v), want %d", infos.Load(), err, want)
		}
	}
	info(1)
	c.check(client, p)
	info(1)
	// One failure, short of UnhealthyAfter, is enough.
	status.Store(http.StatusInternalServerError)
	c.check(client, p)
	info(2)
}
