package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/internal/testlog"
	"pdlb/internal/testwait"
	"pdlb/lb/config"
)

func TestRunFleet(t *testing.T) {
	fc, err := sim.LoadFleet("../../engines/sim/testdata/fleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, stop := startFleet(t, fc)
	lines := strings.Split(out.String(), "\n")
	if !strings.HasPrefix(lines[0], "NAME") || len(lines) < 1+len(fc.Pods) {
		t.Fatalf("listing:\n%s", out.String())
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for i, c := range fc.Pods {
		f := strings.Fields(lines[1+i])
		if len(f) != 6 || f[0] != c.Name || f[1] != c.Model || f[2] != string(c.Engine) {
			t.Fatalf("line %q for pod %+v", lines[1+i], c)
		}
		resp, err := client.Get("http://" + f[3] + "/health")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s /health: %v %v", f[0], err, resp)
		}
		resp.Body.Close()
	}
	stop()
}

// startFleet runs fc's pods as pdlb fleet does until stop, which sends
// it SIGTERM and waits for it; out holds what it printed, the pod
// listing (its "Serving" line) already.
func startFleet(t *testing.T, fc sim.FleetConfig) (out *testlog.Buffer, stop func()) {
	t.Helper()
	out = new(testlog.Buffer)
	signals := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() { done <- runFleet(fc, out, signals) }()
	testwait.For(t, "the pod listing", func() bool { return strings.Contains(out.String(), "Serving") })
	return out, func() {
		t.Helper()
		signals <- syscall.SIGTERM
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func TestCmdFleetErrors(t *testing.T) {
	var out bytes.Buffer
	f := func(args []string, want string) {
		t.Helper()
		err := cmdFleet(args, &out)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%v: error %v, want %q", args, err, want)
		}
	}
	f(nil, "--config is required")
	f([]string{"--config", "missing.yaml"}, "no such file")
	f([]string{"--config", "../../engines/sim/testdata/fleet.yaml", "--speedup", "-2"}, "--speedup -2: must be positive")
}

// TestFleetSpeedupZeroRefused: --speedup left out runs each pod at the
// file's speedup; written 0, which the flag took for left out, it is
// refused rather than silently ignored.
func TestFleetSpeedupZeroRefused(t *testing.T) {
	done := make(chan error, 1)
	go func() {
		done <- cmdFleet([]string{"--config", "../../engines/sim/testdata/fleet.yaml", "--speedup", "0"}, io.Discard)
	}()
	select {
	case err := <-done:
		if want := "--speedup 0: must be positive (leave it out for each pod's from the file)"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("fleet --speedup 0: %v; want %q", err, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("fleet --speedup 0 started serving")
	}
}

// TestRunFleetListsDialableAddresses: a pod listening and publishing on
// every interface (listen 0.0.0.0:port, kv_events tcp://*:port, as vLLM's
// default endpoint) is listed at addresses a serve config takes for the
// pod's address and kv_events, which refuses every-interface hosts.
func TestRunFleetListsDialableAddresses(t *testing.T) {
	fc, err := sim.ParseFleet([]byte("pods:\n  - listen: 0.0.0.0:0\n    kv_events: tcp://*:0\n"))
	if err != nil {
		t.Fatal(err)
	}
	out, stop := startFleet(t, fc)
	stop()
	f := strings.Fields(strings.Split(out.String(), "\n")[1])
	cfg := config.Default()
	cfg.Pods = []config.Pod{{Model: "m", Address: f[3], KVEvents: f[5]}}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("listing %q: %v", f, err)
	}
}
