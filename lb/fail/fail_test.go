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
	f("refused", &Failure{E: e, Pod: pod, Reason: Refused}, true)
	f("reset before the answer", &Failure{E: e, Pod: pod, Reason: Reset}, true)
	f("hung", &Failure{E: e, Pod: pod, Reason: Hung}, true)
	f("answer began", &Failure{E: e, Pod: pod}, false)
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
