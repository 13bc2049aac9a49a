package protocols

import (
	"testing"

	"pdlb/engines"
)

func TestFor(t *testing.T) {
	f := func(k engines.Kind, o engines.PDOptions, concurrent bool) {
		t.Helper()
		p := For(k, o)
		if p.Kind() != k || p.Concurrent() != concurrent {
			t.Errorf("For(%s, %+v) = %s concurrent %v, want %s concurrent %v", k, o, p.Kind(), p.Concurrent(), k, concurrent)
		}
	}
	f(engines.VLLM, engines.PDOptions{}, false)
	f(engines.SGLang, engines.PDOptions{}, true)
	f(engines.TRTLLM, engines.PDOptions{TRTScheduleStyle: "context_first"}, false)
	f(engines.TRTLLM, engines.PDOptions{TRTScheduleStyle: "generation_first", TRTMachineID: engines.TRTMachineIDLimit - 1}, true)
}

// One TRT protocol per style and machine id: two would draw colliding ids.
func TestForSharesTRTIDs(t *testing.T) {
	o := engines.PDOptions{TRTScheduleStyle: "context_first", TRTMachineID: 7}
	if For(engines.TRTLLM, o) != For(engines.TRTLLM, o) {
		t.Fatal("two TRT protocols for one style and machine id")
	}
}
