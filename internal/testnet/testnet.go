// Package testnet serves a test's listener: the fake pods and proxies
// tests stand up on loopback.
package testnet

import (
	"net"
	"strconv"
	"sync/atomic"
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

// Mute serves ln as a peer that accepts connections, writes banner (if
// any) on each and then neither reads nor closes them until t ends: a
// frozen process, or another service behind the port than the one
// dialed. It returns ln's address and the count of connections taken.
func Mute(t testing.TB, ln net.Listener, banner []byte) (string, *atomic.Int32) {
	var taken atomic.Int32
	quit := make(chan struct{})
	addr := Serve(t, ln, func(c net.Conn) {
		taken.Add(1)
		_, _ = c.Write(banner)
		<-quit
	})
	// Registered after Serve's, so run before it: the connections close.
	t.Cleanup(func() { close(quit) })
	return addr, &taken
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
