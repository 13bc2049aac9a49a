package main

import (
	"bytes"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/internal/testlog"
)

func TestRunFleet(t *testing.T) {
	fc, err := sim.LoadFleet("../../engines/sim/testdata/fleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out testlog.Buffer
	stop := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() { done <- runFleet(fc, &out, stop) }()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), "Serving") {
		if time.Now().After(deadline) {
			t.Fatalf("no pod listing: %q", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
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
	stop <- syscall.SIGTERM
	if err := <-done; err != nil {
		t.Fatal(err)
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
	f([]string{"--config", "../../engines/sim/testdata/fleet.yaml", "--speedup", "-2"}, `speedup = "-2"`)
}
