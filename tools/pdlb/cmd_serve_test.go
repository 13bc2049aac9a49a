package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/internal/tokfiles"
	"pdlb/lb"
	"pdlb/lb/config"
)

// TestServeSignals: what an operator's signals do to `pdlb serve`, as the
// README, the systemd unit of docs/tuning.md and the Kubernetes manifest
// rely on. SIGUSR1 (logrotate's postrotate) reopens the access log at its
// path; SIGHUP reloads the config file's fleet; SIGTERM drains for
// --shutdown-delay, then closes the port, finishes what is in flight and
// returns. The signals go to the test process itself, which serve catches
// as it would in its own.
func TestServeSignals(t *testing.T) {
	pods := modelPods(t, "m", "n")
	dir := t.TempDir()
	path, accessLog := filepath.Join(dir, "pdlb.yaml"), filepath.Join(dir, "access.log")
	writeConfig := func(models ...string) {
		t.Helper()
		writeFleet(t, path, "access_log: "+accessLog+"\n", pods, models...)
	}
	writeConfig("m")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	// The file serve watches never changes, so only SIGHUP reloads.
	watched := filepath.Join(dir, "unchanged.yaml")
	if err := os.WriteFile(watched, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	started := make(chan *lb.Server, 1)
	done := make(chan error, 1)
	go func() {
		done <- serveUntilSignal(cfg, stopping{delay: 2 * time.Second, grace: 10 * time.Second}, io.Discard, func(s *lb.Server) { started <- s },
			func() (config.Config, error) { return config.Load(path) }, watched)
	}()
	var srv *lb.Server
	select {
	case srv = <-started:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	api := "http://" + srv.Addr()
	models := func() string {
		resp, err := http.Get(api + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// until polls what the request before it changed, for up to 10 s.
	until := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s", what)
			}
		}
	}
	signal := func(s syscall.Signal) {
		t.Helper()
		if err := syscall.Kill(os.Getpid(), s); err != nil {
			t.Fatal(err)
		}
	}
	logged := func(file string) func() bool {
		return func() bool {
			b, _ := os.ReadFile(file)
			return strings.Contains(string(b), "/v1/models")
		}
	}

	models()
	until("the first access log line", logged(accessLog))
	if err := os.Rename(accessLog, accessLog+".1"); err != nil {
		t.Fatal(err)
	}
	signal(syscall.SIGUSR1)
	until("a line in the access log reopened on SIGUSR1", func() bool {
		models()
		return logged(accessLog)()
	})

	if got := models(); !strings.Contains(got, `"m"`) || strings.Contains(got, `"n"`) {
		t.Fatalf("models before the reload: %s", got)
	}
	// A reload that fails (a file that does not parse) keeps the running
	// configuration and says so on /metrics until one succeeds.
	reloadOK := func(want string) func() bool {
		return func() bool {
			resp, err := http.Get("http://" + srv.AdminAddr() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return strings.Contains(string(b), "\npdlb_config_last_reload_successful "+want+"\n")
		}
	}
	if err := os.WriteFile(path, []byte("pods: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	signal(syscall.SIGHUP)
	until("pdlb_config_last_reload_successful 0 after a SIGHUP with a broken file", reloadOK("0"))
	if got := models(); !strings.Contains(got, `"m"`) {
		t.Fatalf("models after a failed reload: %s", got)
	}
	writeConfig("m", "n")
	signal(syscall.SIGHUP)
	until("model n served after SIGHUP", func() bool { return strings.Contains(models(), `"n"`) })
	until("pdlb_config_last_reload_successful 1 after it", reloadOK("1"))

	// SIGTERM: first a drain (--shutdown-delay), in which requests are
	// served, each answer closing its connection, and /ready says 503.
	signal(syscall.SIGTERM)
	until("/ready answering 503 while draining", func() bool {
		resp, err := http.Get(api + "/ready")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	// logrotate's SIGUSR1 does not cut the drain short.
	signal(syscall.SIGUSR1)
	time.Sleep(50 * time.Millisecond)
	resp, err := http.Post(api+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"n","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatalf("a request while draining: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("a request while draining: %d, connection close %v; want 200 closing its connection", resp.StatusCode, resp.Close)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not return after SIGTERM")
	}
	if c, err := net.Dial("tcp", srv.Addr()); err == nil {
		c.Close()
		t.Fatal("the port still accepts after serve returned")
	}
}

// A negative --shutdown-delay or --shutdown-timeout is refused, naming the
// flag and the value, before serve or demo starts anything: it would
// otherwise pass for none.
func TestGatewayFlagsNegative(t *testing.T) {
	for _, cmd := range []struct {
		name string
		run  func([]string, io.Writer) error
		args []string
	}{
		{"serve", cmdServe, []string{"--pod", "model=m,address=127.0.0.1:1", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}},
		{"demo", cmdDemo, []string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}},
	} {
		for _, flag := range []string{"--shutdown-delay", "--shutdown-timeout"} {
			// A command that took the flag would serve until a signal.
			done := make(chan error, 1)
			go func() { done <- cmd.run(append(cmd.args, flag, "-5s"), io.Discard) }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), flag+" -5s: must not be negative") {
					t.Errorf("%s %s -5s: %v", cmd.name, flag, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s %s -5s started serving", cmd.name, flag)
			}
		}
	}
}

// TestEmptyFlagsTurnOff: an empty --admin, --metrics or --access-log
// turns off what the config file turned on, as the file's "" does; a
// flag not given leaves the file's value. They were ignored when empty.
func TestEmptyFlagsTurnOff(t *testing.T) {
	file := func() config.Config {
		c := config.Default()
		c.Admin, c.Metrics, c.AccessLog = "127.0.0.1:9901", "127.0.0.1:9902", "/var/log/pdlb.log"
		return c
	}
	parse := func(args ...string) config.Config {
		t.Helper()
		var gf gatewayFlags
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		gf.register(fs, true)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		c := file()
		gf.apply(&c)
		return c
	}
	if c := parse("--admin", "", "--metrics=", "--access-log", ""); c.Admin != "" || c.Metrics != "" || c.AccessLog != "" {
		t.Errorf("empty flags: admin %q, metrics %q, access log %q; want all off", c.Admin, c.Metrics, c.AccessLog)
	}
	if c, f := parse("--listen", "127.0.0.1:8000"), file(); c.Admin != f.Admin || c.Metrics != f.Metrics || c.AccessLog != f.AccessLog || !c.IOURing {
		t.Errorf("flags not given: admin %q, metrics %q, access log %q, io_uring %v; want the file's", c.Admin, c.Metrics, c.AccessLog, c.IOURing)
	}
	if c := parse("--io-uring=false"); c.IOURing {
		t.Error("--io-uring=false left io_uring on")
	}
}

// pdlb demo --tokenizer loads the files before it starts anything, and a
// directory without them is refused naming the flag.
func TestDemoTokenizerRefused(t *testing.T) {
	dir := t.TempDir()
	err := cmdDemo([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--tokenizer", dir}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--tokenizer "+strconv.Quote(dir)) || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Fatalf("demo --tokenizer %s: %v", dir, err)
	}
}

// TestDemoSpeedupZeroRefused: the simulated pods take a speedup of 0 for
// unset and run at 1, so "pdlb demo --speedup 0" ran in real time; it is
// refused, as a negative one is, before anything starts.
func TestDemoSpeedupZeroRefused(t *testing.T) {
	for _, v := range []string{"0", "-1"} {
		done := make(chan error, 1)
		go func() {
			done <- cmdDemo([]string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--speedup", v}, io.Discard)
		}()
		select {
		case err := <-done:
			if want := "--speedup " + v + ": must be positive (default 1)"; err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("demo --speedup %s: %v; want %q", v, err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("demo --speedup %s started serving", v)
		}
	}
}

// TestStrayArgumentsRefused: a word after the flags is refused, as serve
// does, rather than ignored. "pdlb demo --tls false" parses --tls as true
// and leaves "false" over: ignored, the demo serves TLS the user turned
// off.
func TestStrayArgumentsRefused(t *testing.T) {
	for _, cmd := range []struct {
		name string
		run  func([]string, io.Writer) error
		args []string
	}{
		{"demo", cmdDemo, []string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--tls", "false"}},
		{"fleet", cmdFleet, []string{"--config", "../../engines/sim/testdata/fleet.yaml", "--speedup", "10", "false"}},
	} {
		// A command that ignored the word would serve until a signal.
		done := make(chan error, 1)
		go func() { done <- cmd.run(cmd.args, io.Discard) }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "unexpected arguments: false") {
				t.Errorf("%s %s: %v", cmd.name, strings.Join(cmd.args, " "), err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s %s started serving, ignoring %q", cmd.name, strings.Join(cmd.args, " "), "false")
		}
	}
}

// TestDemoHelpNamesNoConfigFile: demo takes no config file, so its --help
// must not offer one as the source of a default; serve's does.
func TestDemoHelpNamesNoConfigFile(t *testing.T) {
	var demo, serve bytes.Buffer
	if err := cmdDemo([]string{"--help"}, &demo); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	if err := cmdServe([]string{"--help"}, &serve); !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	if strings.Contains(demo.String(), "config file") {
		t.Errorf("demo --help mentions a config file:\n%s", demo.String())
	}
	if !strings.Contains(serve.String(), "or the config file's") {
		t.Errorf("serve --help lost the config file's defaults:\n%s", serve.String())
	}
}

// TestConfigChangeDuringStart: the config file changed while the gateway
// starts (read before, watched only after) is applied once it has
// started; the change became the watch's baseline and was never applied.
func TestConfigChangeDuringStart(t *testing.T) {
	pods := modelPods(t, "m", "n")
	path := filepath.Join(t.TempDir(), "pdlb.yaml")
	write := func(models ...string) { writeFleet(t, path, "", pods, models...) }
	write("m")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	started, done := make(chan *lb.Server, 1), make(chan error, 1)
	go func() {
		done <- serveUntilSignal(cfg, stopping{grace: 2 * time.Second}, io.Discard,
			func(s *lb.Server) { write("m", "n"); started <- s },
			func() (config.Config, error) { return config.Load(path) }, path)
	}()
	srv := <-started
	defer func() {
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
		<-done
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get("http://" + srv.Addr() + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), `"n"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the config file changed during the start was never applied")
		}
	}
}

// modelPods starts a simulated pod per model, stopped when the test ends,
// and returns their addresses by model.
func modelPods(t *testing.T, models ...string) map[string]string {
	t.Helper()
	pods := map[string]string{}
	for _, model := range models {
		p, err := sim.Start(sim.Config{Name: model + "-0", Model: model, Listen: "127.0.0.1:0", Speedup: 100, DefaultMaxTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		pods[model] = p.Addr()
	}
	return pods
}

// writeFleet writes a config file at path with loopback listeners, extra,
// and one pod of each of models (addresses from pods).
func writeFleet(t *testing.T, path, extra string, pods map[string]string, models ...string) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\n%spods:\n", extra)
	for _, m := range models {
		fmt.Fprintf(&b, "  - {model: %s, address: %q}\n", m, pods[m])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestServeTokenizerRefused: a model's tokenizer or chat template that
// does not load stops serve with the path of the setting in the config
// file, as the other config errors name theirs (a fleet file's too).
func TestServeTokenizerRefused(t *testing.T) {
	pods := modelPods(t, "m", "n")
	dir := t.TempDir()
	broken, path := filepath.Join(dir, "broken"), filepath.Join(dir, "pdlb.yaml")
	if err := os.Mkdir(broken, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, "tokenizer.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	qwen := strconv.Quote(tokfiles.Dir(t, "qwen3"))
	for _, tc := range []struct{ models, want string }{
		{"models: [{name: m}, {name: n, tokenizer: " + strconv.Quote(broken) + "}]\n",
			"models[1].tokenizer = " + strconv.Quote(broken) + " cannot be loaded: hf: "},
		{"models: [{name: m, tokenizer: " + qwen + ", chat_template: '{% if %}'}]\n",
			`models[0].chat_template = "{% if %}" cannot be loaded: prompt: chat template of `},
	} {
		writeFleet(t, path, tc.models, pods, "m", "n")
		err := cmdServe([]string{"--config", path}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: serve: %v; want %q", tc.models, err, tc.want)
		}
	}
}
