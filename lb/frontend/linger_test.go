package frontend_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestLingerIsBounded: after a 413 for a body it will not read, a front
// end half-closes (the client reads the answer, then EOF) and discards
// what the client goes on sending, but only up to its bound: a client
// that never stops is cut off.
func TestLingerIsBounded(t *testing.T) {
	forEach(t, func(t *testing.T, addr string, _ *app) {
		c := dial(t, addr)
		c.send(t, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1099511627776\r\n\r\n")
		sent := make(chan int64, 1)
		go func() {
			// Far past the bound (64 MiB), in 1 MiB writes.
			chunk := []byte(strings.Repeat("x", 1<<20))
			var n int64
			for range 1024 {
				if _, err := c.Write(chunk); err != nil {
					break
				}
				n += int64(len(chunk))
			}
			sent <- n
		}()
		resp, b := c.response(t)
		expectError(t, resp, b, http.StatusRequestEntityTooLarge)
		if n, err := c.br.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
			t.Fatalf("after the answer: %d bytes, %v; want EOF (a half-close)", n, err)
		}
		// It lingered (took far more than socket buffers hold), then cut
		// the client off.
		if n := <-sent; n < 32<<20 || n >= 1<<30 {
			t.Fatalf("the front end took %d MiB; want it to discard up to its bound, then close", n>>20)
		}
	})
}
