package vllm

import (
	"strings"
	"testing"
	"time"

	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
)

// A banner that is not ZeroMQ's: what sshd sends first, on a wrong port.
var sshBanner = []byte("SSH-2.0-OpenSSH_9.6\r\n")

// TestSubscriberCloseWhileHandshaking: a subscriber whose pod accepts the
// connection and never greets must still close.
func TestSubscriberCloseWhileHandshaking(t *testing.T) {
	for _, c := range []struct {
		name   string
		banner []byte
	}{{"silent", nil}, {"ssh", sshBanner}} {
		t.Run(c.name, func(t *testing.T) {
			addr, taken := testnet.Mute(t, testnet.Listen(t), c.banner)
			s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://" + addr, ReplayEndpoint: "tcp://127.0.0.1:1", RedialInterval: 5 * time.Millisecond}, &recorder{})
			if err != nil {
				t.Fatal(err)
			}
			testwait.For(t, "the connection", func() bool { return taken.Load() > 0 })
			testwait.Returns(t, "Subscriber.Close", func() { s.Close() })
		})
	}
}

// TestSubscriberGivesUpAMuteHandshake: a pod whose old process still holds
// the subscriber's connection, unanswered, and whose new publisher listens
// on the same port is followed: the handshake is given up and redialed.
func TestSubscriberGivesUpAMuteHandshake(t *testing.T) {
	ln := testnet.Listen(t)
	addr, taken := testnet.Mute(t, ln, nil)
	rec := &recorder{}
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://" + addr, ReplayEndpoint: "tcp://127.0.0.1:1", RedialInterval: 5 * time.Millisecond}, rec)
	if err != nil {
		t.Fatal(err)
	}
	defer testwait.Returns(t, "Subscriber.Close", func() { s.Close() })
	testwait.For(t, "the connection", func() bool { return taken.Load() > 0 })
	if s.Connected() {
		t.Fatal("connected to a peer that never greeted")
	}
	ln.Close() // the connection it took stays open, unanswered
	p := manualPublisher(t, "tcp://"+addr, "tcp://127.0.0.1:0", 0)
	defer p.Close()
	joined(t, p, rec)
	if n := s.Counters.Reconnects.Load(); n == 0 || !s.Connected() {
		t.Fatalf("followed the publisher after %d reconnections, connected %v; want some, true", n, s.Connected())
	}
}

// TestReplayMutePeer: a replay port that accepts and never greets costs a
// replay its ReplayTimeout, as an unreachable one does, and the gap is lost.
func TestReplayMutePeer(t *testing.T) {
	p := manualPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 0)
	defer p.Close()
	storeEvent(p, 0)
	p.flush()
	rec := &recorder{}
	s := subscriberAt(t, p, rec, 3)
	addr, taken := testnet.Mute(t, testnet.Listen(t), nil)
	s.cfg.ReplayEndpoint = "tcp://" + addr
	s.cfg.ReplayTimeout = 200 * time.Millisecond
	p.ringMu.Lock()
	live := p.ring[0].payload
	p.ringMu.Unlock()
	testwait.Returns(t, "a replay from a mute peer", func() { s.onBatch(7, live) })
	if got := rec.snapshot(); len(got) != 2 || got[0] != "cleared" || !strings.HasPrefix(got[1], "stored") {
		t.Fatalf("got %q, want a clear then the live batch", got)
	}
	if s.Counters.Lost.Load() != 1 || taken.Load() != 1 {
		t.Fatalf("lost = %d, replay connections %d, want 1 1", s.Counters.Lost.Load(), taken.Load())
	}
}
