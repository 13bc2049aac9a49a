package fail

import (
	"testing"

	"pdlb/lb/openai"
	"pdlb/lb/pool"
)

func TestMayRetry(t *testing.T) {
	pod := &pool.Pod{}
	e := openai.UpstreamError("boom")
	f := func(name string, fl *Failure, want bool) {
		t.Helper()
		if got := fl.MayRetry(); got != want {
			t.Errorf("%s: MayRetry = %v, want %v", name, got, want)
		}
	}
	f("not sent to a pod", &Failure{E: e, Pod: pod}, true)
	f("sent to a pod", &Failure{E: e, Pod: pod, Sent: true}, false)
	f("no pod to blame", &Failure{E: e}, false)
	f("client left", ClientLeft, false)
}

func TestIsFault(t *testing.T) {
	f := func(status int, want bool) {
		t.Helper()
		if got := IsFault(status); got != want {
			t.Errorf("IsFault(%d) = %v, want %v", status, got, want)
		}
	}
	f(200, false)
	f(429, false)
	f(500, true)
	f(502, true)
	f(503, false) // load shed, not a fault
	f(504, true)
}
