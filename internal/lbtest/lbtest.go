// Package lbtest starts gateways for end-to-end tests: on loopback, with
// health checks fast enough for a test to see a pod die, and stopped when
// the test ends.
package lbtest

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"pdlb/lb"
	"pdlb/lb/config"
)

// LeakOptions are what goleak must ignore in a package that runs gateways:
// goroutines that outlive any one server by design.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		// Started when packages load.
		goleak.IgnoreCurrent(),
		// fasthttp's package-level date ticker and client, dialer and
		// worker-pool cleaners.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		// zmq4's PUB sockets never stop their writer (see engines/vllm).
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
		// go-redis's probe of a server its pool failed to dial, which
		// sleeps a second between dials and ends at the first one after
		// the client closed.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
	}
}

// StartGateway starts a gateway on loopback over pods; edit, if set,
// adjusts the configuration first.
func StartGateway(t testing.TB, pods []config.Pod, edit func(*config.Config)) *lb.Server {
	t.Helper()
	return StartGatewayLog(t, pods, edit, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// StartGatewayLog is StartGateway logging to log.
func StartGatewayLog(t testing.TB, pods []config.Pod, edit func(*config.Config), log *slog.Logger) *lb.Server {
	t.Helper()
	cfg := config.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Health.Interval = 50 * time.Millisecond
	cfg.Health.MetricsInterval = 100 * time.Millisecond
	cfg.Pods = pods
	if edit != nil {
		edit(&cfg)
	}
	s, err := lb.Start(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s
}

// Proxy serves a reverse proxy to the pod at addr on a loopback port until
// t ends, and returns its address. Each request goes to hook first, when
// set, which may answer it itself (true). The proxy reads a request's body
// while it answers (full duplex): a pod answers once it has the body,
// maybe before the proxy read its end, and half duplex net/http would
// close the body at the answer's head, the proxy then dropping the pod's
// answer.
func Proxy(t testing.TB, addr string, hook func(w http.ResponseWriter, r *http.Request) bool) string {
	t.Helper()
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: addr})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hook != nil && hook(w, r) {
			return
		}
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			t.Error(err)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}
