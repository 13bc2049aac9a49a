// Command splice is the floor of the proxy and SSE benchmarks: a TCP proxy
// on gnet, as pdlb's gnet front end runs it (one event loop per core,
// SO_REUSEPORT), that reads nothing of HTTP. Each client connection gets
// one connection to the upstream, enrolled on the client's loop, and bytes
// go on as they come, both ways. What a request or an event costs through
// it is what the Go runtime, gnet and the kernel's socket work cost any
// proxy on this stack; the rest of pdlb's cost is its own work (parsing,
// routing, relaying).
//
// Run it with GOMAXPROCS as pdlb's gnet front end raises it while its loops
// hold connections (the cores plus half of them, rounded up), as the
// benchmarks do: the runtime then wakes threads for idle loops as it does
// for pdlb's.
//
// With --poller epoll the loops are this command's own instead of gnet's
// (epoll.go): the floor of a Go proxy without gnet.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"runtime"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// pair is a client connection and its upstream one; both belong to the
// client's loop once the upstream one is enrolled.
type pair struct {
	client, up gnet.Conn
	// early is what the client sent before its upstream connection was
	// open: sent as it opens.
	early []byte
}

// upstreamOf marks an upstream connection's context.
type upstreamOf struct{ p *pair }

type splice struct {
	gnet.BuiltinEventEngine
	upstream string
}

func (s *splice) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if u, ok := c.Context().(upstreamOf); ok {
		if u.p.client == nil {
			return nil, gnet.Close // the client left while it dialed
		}
		u.p.up = c
		early := u.p.early
		u.p.early = nil
		return early, gnet.None
	}
	p := &pair{client: c}
	c.SetContext(p)
	el := c.EventLoop()
	// Dialed off the loop: a connect must not hold up the loop's other
	// connections.
	go func() {
		nc, err := net.DialTimeout("tcp", s.upstream, 5*time.Second)
		if err == nil {
			var res <-chan gnet.RegisteredResult
			if res, err = el.Enroll(gnet.NewContext(context.Background(), upstreamOf{p}), nc); err == nil {
				err = (<-res).Err
			} else {
				_ = nc.Close()
			}
		}
		if err != nil {
			log.Printf("splice: upstream %s: %v", s.upstream, err)
			_ = c.Close()
		}
	}()
	return nil, gnet.None
}

func (s *splice) OnTraffic(c gnet.Conn) gnet.Action {
	b, _ := c.Next(-1)
	if u, ok := c.Context().(upstreamOf); ok {
		if u.p.client != nil {
			_, _ = u.p.client.Write(b)
		}
		return gnet.None
	}
	p := c.Context().(*pair)
	if p.up == nil {
		p.early = append(p.early, b...)
		return gnet.None
	}
	_, _ = p.up.Write(b)
	return gnet.None
}

// OnClose closes the other side: on the same loop, so neither is used
// after it closed.
func (s *splice) OnClose(c gnet.Conn, _ error) gnet.Action {
	if u, ok := c.Context().(upstreamOf); ok {
		if u.p.client != nil {
			_ = u.p.client.Close()
		}
		return gnet.None
	}
	p := c.Context().(*pair)
	p.client = nil
	if p.up != nil {
		_ = p.up.Close()
	}
	return gnet.None
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8090", "address to listen on")
	upstream := flag.String("upstream", "127.0.0.1:8000", "address every connection is spliced to")
	loops := flag.Int("loops", 0, "event loops (0: one per core, as pdlb's gnet front end)")
	poller := flag.String("poller", "gnet", "event loops: gnet's, or epoll (this command's own, waiting in raw epoll_pwait calls)")
	flag.Parse()
	switch *poller {
	case "gnet":
	case "epoll":
		n := *loops
		if n == 0 {
			n = runtime.NumCPU()
		}
		s, err := startEpoll(*listen, *upstream, n)
		if err != nil {
			log.Fatal(err)
		}
		s.wg.Wait()
		return
	default:
		log.Fatalf("--poller %q: gnet or epoll", *poller)
	}
	opts := []gnet.Option{gnet.WithReusePort(true), gnet.WithReuseAddr(true), gnet.WithMulticore(*loops == 0)}
	if *loops > 0 {
		opts = append(opts, gnet.WithNumEventLoop(*loops))
	}
	log.Fatal(gnet.Run(&splice{upstream: *upstream}, "tcp://"+*listen, opts...))
}
