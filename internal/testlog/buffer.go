// Package testlog lets tests read what the code under test logs while it
// runs.
package testlog

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer a logger and a test may use at once.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
