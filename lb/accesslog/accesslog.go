// Package accesslog writes the gateway's access log: one line per request,
// to a file or to standard output.
//
// Requests finish on the event loops, which must never wait for a disk.
// A line is appended to a buffer under a mutex (a copy of a few hundred
// bytes) and a goroutine of the log's own writes the buffer out once a
// second, or at once when 64 KiB wait, as nginx's `access_log ... buffer=64k
// flush=1s` does. If the disk stalls until maxPending bytes wait, further
// lines are dropped and counted rather than held in memory or waited for.
package accesslog

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"pdlb/internal/mono"
	"pdlb/internal/spaced"
	"pdlb/promtext"
)

// Stdout is the path that names standard output.
const Stdout = "-"

const (
	// flushBytes is how much may wait before the writer is woken early.
	flushBytes = 64 << 10
	// flushEvery is the longest a line waits to be written.
	flushEvery = time.Second
	// maxPending bounds the bytes waiting while a write is slow: about
	// 20,000 lines, a few seconds of a busy gateway.
	maxPending = 8 << 20
	// warnEvery spaces out the warnings about lines lost.
	warnEvery = time.Minute
)

// Metric families.
const (
	MetricLines   = "pdlb_access_log_lines_total"
	MetricDropped = "pdlb_access_log_dropped_total"
)

// MetricsDoc documents the families for promtext.Write.
var MetricsDoc = promtext.Doc{
	MetricLines:   {Help: "Access log lines written to the file."},
	MetricDropped: {Help: "Access log lines lost: the buffer was full while a write was slow, or the write failed."},
}

// Log is an open access log. Its methods may be called from any goroutine.
type Log struct {
	path string
	log  *slog.Logger

	mu      sync.Mutex
	pending []byte // lines not yet handed to the writer
	closed  bool

	// fileMu guards file against Reopen while the writer writes.
	fileMu sync.Mutex
	file   *os.File
	// spare is the writer's buffer, swapped with pending at each flush.
	spare []byte

	kick      chan struct{}
	quit      chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	written, dropped atomic.Uint64
	warned           spaced.Lines // on mono's clock
}

// Open opens the access log at path (appending; created 0644 when missing),
// or standard output for Stdout, and starts its writer.
func Open(path string, log *slog.Logger) (*Log, error) {
	f, err := openFile(path)
	if err != nil {
		return nil, err
	}
	l := &Log{path: path, log: log, file: f,
		kick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l, nil
}

func openFile(path string) (*os.File, error) {
	if path == Stdout {
		return os.Stdout, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("access_log: %w", err)
	}
	return f, nil
}

// Write adds one line; the log ends it with a newline. line may be reused
// once Write returns.
func (l *Log) Write(line []byte) {
	l.mu.Lock()
	if l.closed || len(l.pending)+len(line)+1 > maxPending {
		l.mu.Unlock()
		l.lost(1, nil)
		return
	}
	l.pending = append(l.pending, line...)
	l.pending = append(l.pending, '\n')
	full := len(l.pending) >= flushBytes
	l.mu.Unlock()
	if full {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// Reopen opens the log's path anew, for log rotation: after the file was
// renamed, lines go to a new file at the path. On failure the log keeps
// writing where it did.
func (l *Log) Reopen() error {
	if l.path == Stdout {
		return nil
	}
	f, err := openFile(l.path)
	if err != nil {
		return err
	}
	l.fileMu.Lock()
	old := l.file
	l.file = f
	l.fileMu.Unlock()
	return old.Close()
}

// Close writes what waits and closes the file. Lines written after it are
// counted as dropped.
func (l *Log) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		close(l.quit)
	})
	<-l.done
	if l.path == Stdout {
		return nil
	}
	l.fileMu.Lock()
	defer l.fileMu.Unlock()
	return l.file.Close()
}

func (l *Log) run() {
	defer close(l.done)
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-l.kick:
		case <-t.C:
		case <-l.quit:
			l.flush()
			return
		}
		l.flush()
	}
}

// flush hands the pending lines to the file.
func (l *Log) flush() {
	l.mu.Lock()
	l.pending, l.spare = l.spare[:0], l.pending
	l.mu.Unlock()
	if len(l.spare) == 0 {
		return
	}
	l.fileMu.Lock()
	_, err := l.file.Write(l.spare)
	l.fileMu.Unlock()
	n := uint64(bytes.Count(l.spare, []byte{'\n'}))
	if err != nil {
		// What went out is not known; the batch counts as lost.
		l.lost(n, err)
		return
	}
	l.written.Add(n)
}

// lost counts n lines lost, and warns at most once a warnEvery.
func (l *Log) lost(n uint64, err error) {
	l.dropped.Add(n)
	if _, ok := l.warned.Allow(mono.Now(), warnEvery); !ok {
		return
	}
	if err == nil {
		l.log.Warn("access log lines dropped: the buffer is full while a write is slow, or the log is closed ("+MetricDropped+" counts them)",
			"path", l.path, "buffer_bytes", maxPending)
		return
	}
	l.log.Warn("access log write failed; its lines are lost ("+MetricDropped+" counts them)", "path", l.path, "err", err)
}

// WritePrometheus writes the log's families in Prometheus text format.
func (l *Log) WritePrometheus(w io.Writer) {
	metrics.WriteMetadataIfNeeded(w, MetricLines, "counter")
	fmt.Fprintf(w, "%s %d\n", MetricLines, l.written.Load())
	metrics.WriteMetadataIfNeeded(w, MetricDropped, "counter")
	fmt.Fprintf(w, "%s %d\n", MetricDropped, l.dropped.Load())
}
