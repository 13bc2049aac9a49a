package lb_test

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"pdlb/engines/sim"
	"pdlb/lb"
	"pdlb/lb/config"
)

// laterAnswer is what a client got: the status, the pod that answered
// (a PD pair's decode pod) and a pair's prefill pod, and the body, or the
// error.
type laterAnswer struct {
	code     int
	pod, pre string
	body     string
}

// postLater posts body to s's chat completions, with headers (name,
// value, ...), on a goroutine; its answer comes on the channel.
func postLater(s *lb.Server, body string, headers ...string) <-chan laterAnswer {
	done := make(chan laterAnswer, 1)
	go func() {
		req, _ := newPost(s, body)
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			done <- laterAnswer{body: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- laterAnswer{resp.StatusCode, resp.Header.Get("x-pdlb-pod"), resp.Header.Get("x-pdlb-prefill-pod"), string(b)}
	}()
	return done
}

// TestPDRetryAfterReloadSeesTheNewFleet is TestRetryAfterReloadSeesTheNewFleet
// for a model of prefill and decode pods: a rolling update replaces the
// pair while the old prefill pod holds the request's prefill leg, which
// it then resets. The retry is decided among the new pair.
func TestPDRetryAfterReloadSeesTheNewFleet(t *testing.T) {
	e := pdEngines[0]
	got, release := make(chan struct{}, 1), make(chan struct{})
	oldPre := fakePod(t, func(c net.Conn, _ *http.Request) {
		got <- struct{}{}
		<-release
		resetPod(c, nil)
	})
	oldDec := startSim(t, e, "old-dec", sim.RoleDecode, nil)
	pre, dec := startSim(t, e, "pre", sim.RolePrefill, nil), startSim(t, e, "dec", sim.RoleDecode, nil)
	s := pdGateway(t, e, []config.Pod{{Name: "old-pre", Model: "m", Address: oldPre, Engine: string(e.engine), Role: config.RolePrefill, Roleset: "rs0"},
		pdPod(oldDec, oldDec.Addr(), "rs0")}, func(c *config.Config) { c.Health.Interval = time.Hour })
	done := postLater(s, pdBody("/v1/chat/completions", false, 4))
	<-got
	cfg := s.Gateway.Config()
	cfg.Pods = []config.Pod{pdPod(pre, pre.Addr(), "rs0"), pdPod(dec, dec.Addr(), "rs0")}
	if err := s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	close(release)
	if a := <-done; a.code != 200 || a.pre != "pre" || a.pod != "dec" {
		t.Fatalf("the request the old prefill pod reset after the reload: %d from %q/%q: %s; want 200 from the new pair", a.code, a.pre, a.pod, a.body)
	}
	ledgerSettles(t, s)
}
