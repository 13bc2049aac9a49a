// Command splice is the floor of the proxy and SSE benchmarks: a TCP proxy
// on pdlb's event loops (lb/evloop, as the gnet front end runs them: one
// loop per core, SO_REUSEPORT) that reads nothing of HTTP. Each client
// connection gets one connection to the upstream, enrolled on the
// client's loop, and bytes go on as they come, both ways. What a request
// or an event costs through it is what the Go runtime, the loops and the
// kernel's socket work cost any proxy on this stack; the rest of pdlb's
// cost is its own work (parsing, routing, relaying).
//
// Run it with GOMAXPROCS as pdlb's gnet front end raises it while its loops
// hold connections (twice the cores), as the benchmarks do: a loop that
// holds connections keeps its P while it waits.
package main

import (
	"flag"
	"log"
	"net"
	"runtime"
	"time"

	"pdlb/lb/evloop"
)

// pair is a client connection and its upstream one; both belong to the
// client's loop once the upstream one is enrolled.
type pair struct {
	client, up *evloop.Conn
	// early is what the client sent before its upstream connection was
	// open: sent as it opens.
	early []byte
}

// upstreamOf marks an upstream connection's context.
type upstreamOf struct{ p *pair }

type splice struct {
	upstream string
}

func (s *splice) OnBoot(*evloop.Engine) {}

func (s *splice) OnTick() time.Duration { return time.Hour }

func (s *splice) OnOpen(c *evloop.Conn) ([]byte, evloop.Action) {
	if u, ok := c.Context().(upstreamOf); ok {
		if u.p.client == nil {
			return nil, evloop.Close // the client left while it dialed
		}
		u.p.up = c
		early := u.p.early
		u.p.early = nil
		return early, evloop.None
	}
	p := &pair{client: c}
	c.SetContext(p)
	el := c.EventLoop()
	// Dialed off the loop: a connect must not hold up the loop's other
	// connections.
	go func() {
		nc, err := net.DialTimeout("tcp", s.upstream, 5*time.Second)
		if err == nil {
			err = el.Enroll(nc, upstreamOf{p})
		}
		if err != nil {
			log.Printf("splice: upstream %s: %v", s.upstream, err)
			_ = c.Close()
		}
	}()
	return nil, evloop.None
}

func (s *splice) OnTraffic(c *evloop.Conn) evloop.Action {
	b, _ := c.Next(-1)
	if u, ok := c.Context().(upstreamOf); ok {
		if u.p.client != nil {
			_, _ = u.p.client.Write(b)
		}
		return evloop.None
	}
	p := c.Context().(*pair)
	if p.up == nil {
		p.early = append(p.early, b...)
		return evloop.None
	}
	_, _ = p.up.Write(b)
	return evloop.None
}

// OnClose closes the other side: on the same loop, so neither is used
// after it closed.
func (s *splice) OnClose(c *evloop.Conn, _ error) {
	if u, ok := c.Context().(upstreamOf); ok {
		if u.p.client != nil {
			_ = u.p.client.Close()
		}
		return
	}
	p := c.Context().(*pair)
	p.client = nil
	if p.up != nil {
		_ = p.up.Close()
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8090", "address to listen on (an IP literal and port)")
	upstream := flag.String("upstream", "127.0.0.1:8000", "address every connection is spliced to")
	loops := flag.Int("loops", 0, "event loops (0: one per core, as pdlb's gnet front end)")
	noRing := flag.Bool("no-ring", false, "a system call per send and receive, not io_uring batches (as pdlb's io_uring: false)")
	flag.Parse()
	n := *loops
	if n == 0 {
		n = runtime.NumCPU()
	}
	log.Fatal(evloop.Run(&splice{upstream: *upstream}, *listen, evloop.Options{Loops: n, NoRing: *noRing}))
}
