package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"pdlb/engines"
	"pdlb/internal/testwait"
)

// sharedPrefixPod starts a pod of 16-token blocks whose decode steps take a
// simulated second, so what requests hold does not move while a test looks.
func sharedPrefixPod(t *testing.T, engine engines.Kind, cacheBlocks int) *Pod {
	t.Helper()
	phys := DefaultPhysics()
	phys.BlockSize = 16
	phys.CacheBlocks = cacheBlocks
	phys.DecodeBaseSec = 1
	return testPod(t, Config{Model: "m", Engine: engine, Physics: phys, Speedup: 1, MaxModelLen: 1600})
}

// sharedPrefixPrompt is 64 blocks every request shares and 8 tokens of
// request i's own: 65 blocks, 64 of them a possible hit.
func sharedPrefixPrompt(i int) []uint32 {
	tokens := make([]uint32, 64*16+8)
	for j := range tokens {
		tokens[j] = uint32(j)
	}
	for j := 64 * 16; j < len(tokens); j++ {
		tokens[j] = uint32(100000 + 8*i + j)
	}
	return tokens
}

// startStream posts a streaming completion of prompt that lives until
// the test ends and returns once its first chunk came: the prompt's blocks
// are then held.
func startStream(t *testing.T, c *http.Client, p *Pod, prompt []uint32) {
	t.Helper()
	startStreamWith(t, c, p, prompt, nil)
}

// startStreamWith is startStream with the request's headers set to hdr.
func startStreamWith(t *testing.T, c *http.Client, p *Pod, prompt []uint32, hdr http.Header) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"prompt": prompt, "stream": true, "max_tokens": 100})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+p.Addr()+"/v1/completions", bytes.NewReader(b))
	for k, v := range hdr {
		req.Header[k] = v
	}
	first, done := make(chan string, 1), make(chan struct{})
	go func() {
		defer close(done)
		resp, err := c.Do(req)
		if err != nil {
			first <- err.Error()
			return
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		line, _ := br.ReadString('\n')
		first <- line
		io.Copy(io.Discard, br)
	}()
	t.Cleanup(func() { <-done })
	if line := <-first; !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q", line)
	}
}

// TestSharedPrefixCountsOnce: six running requests whose prompts share 64
// blocks hold those blocks once, as the engines count them: vLLM's usage
// is 1 - free/total blocks of its pool (BlockPool.get_usage), a shared
// block one block with ref_cnt 6; SGLang's radix tree and TensorRT-LLM's
// block reuse share the same way.
func TestSharedPrefixCountsOnce(t *testing.T) {
	for _, engine := range []engines.Kind{engines.VLLM, engines.SGLang, engines.TRTLLM} {
		t.Run(string(engine), func(t *testing.T) {
			p := sharedPrefixPod(t, engine, 1000)
			c := testClient(t)
			for i := range 6 {
				startStream(t, c, p, sharedPrefixPrompt(i))
			}
			// 64 shared blocks, each request's partial block, and a
			// block of its answer at most.
			s := p.Stats()
			if s.Running != 6 || s.UsedBlocks < 64+6 || s.UsedBlocks > 64+2*6 || s.KVUsage != float64(s.UsedBlocks)/1000 {
				t.Fatalf("stats %+v: want 6 running holding 70 to 76 blocks", s)
			}
		})
	}
}

// TestSharedPrefixAdmission: a request needs KV room only for the blocks
// past those of its prefix that running requests hold, as vLLM's
// allocate_slots asks the pool for blocks past the request's hit, a hit
// block in use (ref_cnt > 0) costing none. A pod of 100 blocks admits
// five requests of 71 blocks (prompt and answer) sharing 64.
func TestSharedPrefixAdmission(t *testing.T) {
	p := sharedPrefixPod(t, engines.VLLM, 100)
	c := testClient(t)
	startStream(t, c, p, sharedPrefixPrompt(0))
	for i := 1; i < 6; i++ {
		b, _ := json.Marshal(map[string]any{"prompt": sharedPrefixPrompt(i), "stream": true, "max_tokens": 100})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+p.Addr()+"/v1/completions", bytes.NewReader(b))
		go func() {
			if resp, err := c.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	// Nothing frees room for a second: each is admitted when it arrives or not at all.
	testwait.For(t, "six requests", func() bool { s := p.Stats(); return s.Running+s.Waiting == 6 })
	if s := p.Stats(); s.Running != 5 || s.Waiting != 1 || s.UsedBlocks > 100 {
		t.Fatalf("stats %+v: want 5 running within 100 blocks, 1 waiting", s)
	}
}
