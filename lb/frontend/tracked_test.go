package frontend

import (
	"errors"
	"net"
	"testing"
)

// handingListener hands out conns, one an Accept, as the kernel would.
type handingListener struct {
	net.Listener
	conns chan net.Conn
}

func (l handingListener) Accept() (net.Conn, error) { return <-l.conns, nil }

// TestTrackedClosesLateAccepts: a connection Accept took from the kernel
// as a shutdown's closeAll looked (it was not yet tracked) is closed, not
// left serving after the shutdown returned.
func TestTrackedClosesLateAccepts(t *testing.T) {
	ln := handingListener{conns: make(chan net.Conn, 1)}
	tr := track(ln)
	server, client := net.Pipe()
	defer client.Close()
	tr.closeAll()
	ln.conns <- server
	if c, err := tr.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after closeAll: %v, %v; want net.ErrClosed", c, err)
	}
	if _, err := client.Write([]byte("x")); err == nil {
		t.Error("the connection accepted after closeAll is open")
	}
}
