// Package testwait lets a test wait for what another goroutine or process
// makes true: a stream to end, a pod's index to follow its events, a peer
// to see a charge.
package testwait

import (
	"runtime"
	"testing"
	"time"
)

// Timeout bounds every wait: long enough for a loaded 2-core CI machine,
// short enough that a hang fails its test rather than the test binary.
const Timeout = 10 * time.Second

// poll is how often the condition is asked again.
const poll = 2 * time.Millisecond

// For returns once cond holds, asking every few milliseconds, and fails t
// naming what it waited for if that takes longer than Timeout.
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(Timeout); !cond(); time.Sleep(poll) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", Timeout, what)
		}
	}
}

// Returns calls f and fails t, with every goroutine's stack, if f has not
// returned within Timeout: a hang fails its test and shows where it is.
// The goroutine running f is left behind if it never returns.
func Returns(t testing.TB, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(Timeout):
		buf := make([]byte, 1<<20)
		t.Fatalf("timed out after %v waiting for %s; goroutines:\n%s", Timeout, what, buf[:runtime.Stack(buf, true)])
	}
}
