package protocols

import (
	"net"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

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

// TestPrefillInfo: the answer is asked once and kept until forgotten.
func TestPrefillInfo(t *testing.T) {
	var asked atomic.Int32
	ln := fasthttputil.NewInmemoryListener()
	go fasthttp.Serve(ln, func(ctx *fasthttp.RequestCtx) {
		asked.Add(1)
		ctx.SetBodyString("a")
	})
	defer ln.Close()
	client := &fasthttp.HostClient{Addr: "pod", Dial: func(string) (net.Conn, error) { return ln.Dial() }}
	var p PrefillInfo
	get := func(wantAsked int32) {
		t.Helper()
		b, err := p.Get(client, "pod", "/server_info", nil)
		if err != nil || string(b) != "a" || asked.Load() != wantAsked {
			t.Fatalf("Get: %q, %v after %d questions; want %q after %d", b, err, asked.Load(), "a", wantAsked)
		}
	}
	get(1)
	get(1)
	p.Forget()
	get(2)
}
