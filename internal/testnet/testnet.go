// Package testnet serves a test's listener: the fake pods and proxies
// tests stand up on loopback.
package testnet

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// Serve accepts ln's connections until t ends, each served by serve on a
// goroutine of its own and closed when serve returns; it returns ln's
// address. The accepting has stopped when t's cleanup returns.
func Serve(t testing.TB, ln net.Listener, serve func(net.Conn)) string {
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// Listen is a loopback listener on a port of the kernel's choosing.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// Refusing returns a loopback address whose connections are refused while
// t runs: a socket holds its port bound without listening, so no other
// test's listener or dial takes the port meanwhile, as one merely closed
// again can be under go test ./... (the dial then reaches that test's
// server instead of a refusal).
func Refusing(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}
