package vllm

import (
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pdlb/internal/testlog"
	"pdlb/internal/testnet"
	"pdlb/internal/testwait"
)

// TestSubscriberLogsFailuresOnce: a port that takes connections and never
// greets fails one handshake after another, and a replay port that refuses
// fails every gap's replay, each gap clearing the pod's blocks; each is
// logged once, not once per try (the losses at most once a minute); a
// publisher that restarts at every batch is logged once a minute too, and
// a replay port that works again says so, once.
func TestSubscriberLogsFailuresOnce(t *testing.T) {
	count := func(logged *testlog.Buffer, msg string) int {
		return strings.Count(logged.String(), `msg="`+msg+`"`)
	}
	t.Run("handshake", func(t *testing.T) {
		addr, taken := testnet.Mute(t, testnet.Listen(t), sshBanner)
		var logged testlog.Buffer
		s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://" + addr, ReplayEndpoint: "tcp://" + testnet.Refusing(t),
			RedialInterval: 5 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&logged, nil))}, &recorder{})
		if err != nil {
			t.Fatal(err)
		}
		defer testwait.Returns(t, "Subscriber.Close", func() { s.Close() })
		testwait.For(t, "a third handshake", func() bool { return taken.Load() >= 3 })
		if n := count(&logged, "KV-event feed unreachable"); n != 1 || strings.Count(logged.String(), "\n") != 1 {
			t.Fatalf("%d handshakes given up logged %d times, want once and nothing else:\n%s", taken.Load()-1, n, logged.String())
		}
	})
	t.Run("replay", func(t *testing.T) {
		p := manualPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 0)
		s, _, logged := followed(t, p, "tcp://"+testnet.Refusing(t))
		for i := range 3 {
			lost := s.Counters.Lost.Load()
			p.dropSeq(p.nextSeq)
			storeEvent(p, 2*i)
			p.flush()
			storeEvent(p, 2*i+1)
			p.flush()
			testwait.For(t, "the gap lost", func() bool { return s.Counters.Lost.Load() > lost })
		}
		if n := count(logged, "KV-event replay failed"); n != 1 {
			t.Fatalf("3 gaps whose replay failed logged %d times, want once:\n%s", n, logged.String())
		}
		// Each gap cleared the pod's blocks: said, once for the three.
		if n := count(logged, "KV-event batches lost: the pod's blocks are cleared"); n != 1 || !strings.Contains(logged.String(), "losses=1") {
			t.Fatalf("3 gaps lost logged %d times, want once, naming one loss:\n%s", n, logged.String())
		}
	})
	t.Run("replay back", func(t *testing.T) {
		p := manualPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 0)
		// The replay port as a proxy that, until up, closes each
		// connection at once.
		var up atomic.Bool
		replay := strings.TrimPrefix(p.ReplayEndpoint(), "tcp://")
		addr := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
			if !up.Load() {
				return
			}
			pc, err := net.Dial("tcp", replay)
			if err != nil {
				return
			}
			defer pc.Close()
			go func() { _, _ = io.Copy(pc, c); pc.Close() }()
			_, _ = io.Copy(c, pc)
		})
		_, rec, logged := followed(t, p, "tcp://"+addr)
		// gap publishes a batch the subscriber misses and one after it,
		// and waits for that one: delivered after the gap's replay.
		gap := func(i int) {
			p.dropSeq(p.nextSeq)
			storeEvent(p, 2*i)
			p.flush()
			after := storeEvent(p, 2*i+1)
			p.flush()
			testwait.For(t, "the batch after the gap", func() bool { return slices.Contains(rec.snapshot(), after) })
		}
		gap(0)
		up.Store(true)
		gap(1)
		gap(2)
		if n := count(logged, "KV-event replay failed"); n != 1 {
			t.Fatalf("a failed replay logged %d times, want once:\n%s", n, logged.String())
		}
		if n := count(logged, "KV-event replay works again"); n != 1 {
			t.Fatalf("a replay port back after a failure logged %d times, want once:\n%s", n, logged.String())
		}
	})
	t.Run("restart", func(t *testing.T) {
		p := manualPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0", 0)
		s, _, logged := followed(t, p, p.ReplayEndpoint())
		for i := range 3 {
			restarts := s.Counters.Restarts.Load()
			// A publisher counts from 0 again when it starts.
			p.mu.Lock()
			p.nextSeq = 0
			p.mu.Unlock()
			storeEvent(p, i)
			p.flush()
			testwait.For(t, "the restart seen", func() bool { return s.Counters.Restarts.Load() > restarts })
		}
		if n := count(logged, "KV-event publisher restarted: the pod's blocks are cleared"); n != 1 || !strings.Contains(logged.String(), "restarts=1") {
			t.Fatalf("3 restarts logged %d times, want once, naming one restart:\n%s", n, logged.String())
		}
	})
}

// followed is a Subscriber of p's feed, asking replay for its replays and
// logging to the buffer it returns, once p's batches reach its recorder;
// it closes as t ends, and then p.
func followed(t *testing.T, p *Publisher, replay string) (*Subscriber, *recorder, *testlog.Buffer) {
	t.Helper()
	t.Cleanup(func() { p.Close() })
	logged, rec := &testlog.Buffer{}, &recorder{}
	s, err := NewSubscriber(SubscriberConfig{Endpoint: p.Endpoint(), ReplayEndpoint: replay,
		Log: slog.New(slog.NewTextHandler(logged, nil))}, rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testwait.Returns(t, "Subscriber.Close", func() { s.Close() }) })
	joined(t, p, rec)
	return s, rec, logged
}
