package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"pdlb/engines"
)

// cpuTime is the process's user plus system CPU time.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStreams64 runs rounds of 64 concurrent streaming chats of 256
// tokens on one pod at speedup 100, the load the pod must carry without
// burning a core. cpu-cores is the process's CPU time over wall time,
// clients included (they share the process).
func BenchmarkStreams64(b *testing.B) {
	const streams, tokens = 64, 256
	p, err := Start(Config{Listen: "127.0.0.1:0", Speedup: 100})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams}}
	defer c.CloseIdleConnections()
	body, _ := json.Marshal(chatBody("benchmark prompt", map[string]any{"stream": true, "max_tokens": tokens}))
	url := "http://" + p.Addr() + "/v1/chat/completions"
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime(b)
	for range b.N {
		var wg sync.WaitGroup
		for range streams {
			wg.Go(func() {
				resp, err := c.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				defer resp.Body.Close()
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
				}
			})
		}
		wg.Wait()
	}
	wall, cpu := time.Since(start), cpuTime(b)-cpu0
	b.ReportMetric(cpu.Seconds()/wall.Seconds(), "cpu-cores")
	b.ReportMetric(float64(b.N*streams*tokens)/wall.Seconds(), "tokens/s")
}

// BenchmarkAppendDelta is the per-delivery cost of building a chat chunk.
func BenchmarkAppendDelta(b *testing.B) {
	w := newSSEWriter(engines.VLLM, true, "chatcmpl-0123456789abcdef", 1700000000, "meta-llama/Llama-3.1-8B-Instruct", true, false, false, []int{100}, 1)
	text := newTextStream(1, []uint32{1, 2, 3})
	var buf, piece []byte
	buf = w.appendDelta(buf, 0, nil, 0, finishNone) // the role chunk, once
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		piece = text.appendText(piece[:0], i, i+1)
		buf = w.appendDelta(buf[:0], 0, piece, i+1, finishNone)
	}
}
