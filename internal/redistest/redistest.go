// Package redistest runs a real redis-server for tests, on a loopback port
// and without persistence, so a restart comes back empty as a crashed
// server would.
package redistest

import (
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// Server is a redis-server the test started.
type Server struct {
	t    *testing.T
	Port int
	cmd  *exec.Cmd
}

// Start runs redis-server on port (0: a free one) until the test ends, and
// skips the test with the install hint when the binary is missing.
func Start(t *testing.T, port int) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not on PATH (apt-get install -y redis-server; make test installs it)")
	}
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, Port: port, cmd: cmd}
	t.Cleanup(s.Stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond)
		if err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not come up: %v", s.Addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// Stop kills the server, as a crash would; it is safe to call again.
func (s *Server) Stop() {
	if s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}
