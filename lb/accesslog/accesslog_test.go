package accesslog

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func metricsOf(l *Log) string {
	var b bytes.Buffer
	l.WritePrometheus(&b)
	return b.String()
}

func TestLinesAndClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := Open(path, quiet())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		l.Write([]byte(`{"n":` + strconv.Itoa(i) + `}`))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, path)
	if len(lines) != 1000 || lines[0] != `{"n":0}` || lines[999] != `{"n":999}` {
		t.Fatalf("%d lines, first %q, last %q", len(lines), lines[0], lines[len(lines)-1])
	}
	if m := metricsOf(l); !strings.Contains(m, MetricLines+" 1000\n") || !strings.Contains(m, MetricDropped+" 0\n") {
		t.Fatalf("metrics:\n%s", m)
	}
	l.Write([]byte("late"))
	if m := metricsOf(l); !strings.Contains(m, MetricDropped+" 1\n") {
		t.Fatalf("a line after Close is not counted as dropped:\n%s", m)
	}
}

// waitWritten waits until the file at path holds want: the writer writes
// within flushEvery without being asked.
func waitWritten(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, _ := os.ReadFile(path); string(b) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not hold %q", path, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestFlushedWithinASecond(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := Open(path, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.Write([]byte("one"))
	waitWritten(t, path, "one\n")
}

// Rotation as logrotate does it: rename, then signal the gateway to reopen.
func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := Open(path, quiet())
	if err != nil {
		t.Fatal(err)
	}
	l.Write([]byte("before"))
	// flush is the writer's own: wait for it rather than race it.
	waitWritten(t, path, "before\n")
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reopen(); err != nil {
		t.Fatal(err)
	}
	l.Write([]byte("after"))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readLines(t, path+".1"); len(got) != 1 || got[0] != "before" {
		t.Fatalf("rotated file holds %q", got)
	}
	if got := readLines(t, path); len(got) != 1 || got[0] != "after" {
		t.Fatalf("new file holds %q", got)
	}
}

func TestReopenFailureKeepsWriting(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	l, err := Open(path, quiet())
	if err != nil {
		t.Fatal(err)
	}
	// The path is now a directory: it cannot be opened for writing.
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := l.Reopen(); err == nil || !strings.Contains(err.Error(), "access_log") {
		t.Fatalf("Reopen onto a directory: %v", err)
	}
	l.Write([]byte("kept"))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readLines(t, path+".1"); len(got) != 1 || got[0] != "kept" {
		t.Fatalf("the old file holds %q", got)
	}
}

// A write that fails (a full disk) loses its batch, counted.
func TestWriteFailureCounted(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	l, err := Open("/dev/full", quiet())
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		l.Write([]byte("x"))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if m := metricsOf(l); !strings.Contains(m, MetricLines+" 0\n") || !strings.Contains(m, MetricDropped+" 10\n") {
		t.Fatalf("metrics:\n%s", m)
	}
}

// A stalled reader (a FIFO nobody drains) never blocks Write: past the
// buffer's cap lines are dropped and counted, and every line is either in
// the output or counted.
func TestStalledWriteDropsInsteadOfBlocking(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skip("no FIFO:", err)
	}
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	l, err := Open(path, quiet())
	if err != nil {
		t.Fatal(err)
	}
	line := bytes.Repeat([]byte("a"), 511)
	const n = 3 * maxPending / 512
	for range n {
		l.Write(line)
	}
	dropped := l.dropped.Load()
	if dropped == 0 {
		t.Fatalf("%d lines of 512 bytes into a stalled FIFO: none dropped", n)
	}
	// Drain, so the writer's blocked write and Close can end.
	if err := syscall.SetNonblock(int(r.Fd()), false); err != nil {
		t.Fatal(err)
	}
	got := make(chan int)
	go func() {
		b, _ := io.ReadAll(r)
		got <- bytes.Count(b, []byte{'\n'})
	}()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	written := l.written.Load()
	// Close does not close a FIFO's reader; the writer's end is closed, so
	// ReadAll sees EOF.
	if lines := <-got; uint64(lines) != written || written+l.dropped.Load() != n {
		t.Fatalf("read %d lines; written %d, dropped %d, of %d", lines, written, l.dropped.Load(), n)
	}
}
