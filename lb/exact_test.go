package lb_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"pdlb/engines"
	"pdlb/engines/prompt"
	"pdlb/engines/sim"
	"pdlb/internal/testwait"
	"pdlb/internal/tokfiles"
	"pdlb/lb"
	"pdlb/lb/config"
)

// tokenizedCounts reads /admin/index's tokenizer and per-mode counts of
// model m.
func tokenizedCounts(t *testing.T, admin string) (tokenizer string, counts map[string]uint64) {
	t.Helper()
	var out struct {
		Models []struct {
			Model     string
			Tokenizer string
			Tokenized map[string]uint64
		}
	}
	if err := json.Unmarshal([]byte(get(t, "http://"+admin+"/admin/index")), &out); err != nil {
		t.Fatal(err)
	}
	for _, m := range out.Models {
		if m.Model == "m" {
			return m.Tokenizer, m.Tokenized
		}
	}
	t.Fatal("model m not in /admin/index")
	return "", nil
}

// followed waits until the gateway follows pod's KV events, sending the
// pod short prompts of its own until the index holds blocks from it, and
// returns the blocks it holds then. A pod's events published before the
// gateway's subscription connected are replayed only once a later batch
// shows the gap (as with vLLM's publisher), so a test that sends one
// request straight to a pod must know the subscription is up first.
func followed(t *testing.T, s *lb.Server, pod config.Pod) int {
	t.Helper()
	polls := 0
	testwait.For(t, "the gateway to follow "+pod.Name+"'s KV events", func() bool {
		if blocks, _ := indexBlocks(t, s, pod.Name); blocks > 0 {
			return true
		}
		if polls%50 == 0 { // about every 100 ms
			b, _ := json.Marshal(map[string]any{"model": pod.Model, "max_tokens": 1,
				"prompt": fmt.Sprintf("warm-up %d: %s", polls, strings.Repeat("a few words to fill a block ", 8))})
			resp, err := client.Post("http://"+pod.Address+"/v1/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		polls++
		return false
	})
	blocks, _ := indexBlocks(t, s, pod.Name)
	return blocks
}

// direct sends body to path on pod itself, once the gateway follows the
// pod's KV events, waits until the gateway's index holds the blocks of
// the prompt the pod reports, and returns that prompt's length in tokens.
func direct(t *testing.T, s *lb.Server, pod config.Pod, path, body string) int {
	t.Helper()
	before := followed(t, s, pod)
	resp, err := client.Post("http://"+pod.Address+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var usage struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			InputTokens  int `json:"input_tokens"` // the Responses API's
		} `json:"usage"`
	}
	err = json.NewDecoder(resp.Body).Decode(&usage)
	resp.Body.Close()
	if resp.StatusCode != 200 || err != nil {
		t.Fatalf("direct to the pod: %d %v %+v", resp.StatusCode, err, usage)
	}
	n := max(usage.Usage.PromptTokens, usage.Usage.InputTokens)
	testwait.For(t, "the pod's KV events", func() bool { blocks, _ := indexBlocks(t, s, pod.Name); return blocks >= before+n/16 })
	return n
}

// eventFleet starts pods prefix-0 and prefix-1 of model m, engine
// engine's sim pods which tokenize with the reference tokenizer files of
// name and publish real vLLM KV events in blocks of 16, and a gateway
// keying m with the same tokenizer under prefix_cache (edit, if given,
// adjusts the gateway's config); dir is the tokenizer's directory.
func eventFleet(t *testing.T, engine engines.Kind, name, prefix string, edit ...func(*config.Config)) (dir string, m *prompt.Model, pods []config.Pod, s *lb.Server) {
	t.Helper()
	dir = tokfiles.Dir(t, name)
	m, err := prompt.Load(prompt.Config{Tokenizer: dir})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		phys := sim.DefaultPhysics()
		phys.BlockSize = 16
		pods = append(pods, eventPod(t, sim.Config{Name: fmt.Sprintf("%s-%d", prefix, i), Model: "m", Engine: engine, Speedup: 100, Prompt: m, Physics: phys}))
	}
	s = testGateway(t, pods, func(c *config.Config) {
		c.Models = []config.Model{{Name: "m", Policy: "prefix_cache", BlockSize: 16, Tokenizer: dir}}
		for _, e := range edit {
			e(c)
		}
	})
	return dir, m, pods, s
}

// Pods and gateway both tokenize as Qwen3 does; the pods publish real
// vLLM KV events. The gateway's keys for a request must equal those the
// index built from the events, so a second request sharing the first's
// long system prompt is predicted cached on the pod that holds it, and
// the pod's own prefix cache agrees.
func TestExactTokensMatchTheEnginesEvents(t *testing.T) {
	dir, m, pods, s := eventFleet(t, engines.VLLM, "qwen3", "q")
	system := strings.Repeat("You answer questions about the geography of East Asia, briefly and accurately. ", 40)
	// The first request goes to a pod directly: the gateway learns of its
	// blocks only from the pod's KV events, in the pod's own token ids.
	home := "q-1"
	prompted := direct(t, s, pods[1], "/v1/chat/completions", chat(system, "Where is the capital of China?", 2, false))
	if prompted < 500 {
		t.Fatalf("the first prompt is %d tokens; want the long system prompt's", prompted)
	}

	// The second request shares the system prompt: its blocks are the
	// events' blocks only if both sides computed the same ids.
	resp, b := post(t, s, "/v1/chat/completions", chat(system, "And of Japan?", 2, false))
	if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != home {
		t.Fatalf("second turn on %s (%d %s), its prefix is on %s", resp.Header.Get("x-pdlb-pod"), resp.StatusCode, b, home)
	}
	metrics := get(t, "http://"+s.AdminAddr()+"/metrics")
	var prompt, cached float64
	for _, line := range strings.Split(metrics, "\n") {
		fmt.Sscanf(line, `pdlb_prompt_tokens_total{model="m"} %g`, &prompt)
		fmt.Sscanf(line, `pdlb_prefix_cached_tokens_total{model="m"} %g`, &cached)
	}
	// The system prompt is most of the prompt: the gateway must have
	// predicted nearly all of it cached, as blocks of 16.
	if cached < float64(prompted)*0.9-16 {
		t.Fatalf("gateway predicted %g cached tokens of %g prompted; the first prompt alone was %d tokens", cached, prompt, prompted)
	}
	tok, counts := tokenizedCounts(t, s.AdminAddr())
	if tok != dir || counts["exact"] != 1 || counts["stand_in"] != 0 || counts["unindexed"] != 0 {
		t.Fatalf("/admin/index: tokenizer %q, counts %v", tok, counts)
	}
	if !strings.Contains(metrics, `pdlb_prompt_tokenized_total{model="m",mode="exact"} 1`) {
		t.Fatal("pdlb_prompt_tokenized_total does not count the exact requests")
	}

	// A message vLLM refuses is refused by the gateway, naming the field.
	resp, b = post(t, s, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":null}]}`)
	if resp.StatusCode != 400 || !strings.Contains(b, `"param":"messages[0].content"`) {
		t.Fatalf("null content: %d %s", resp.StatusCode, b)
	}
	// Media content cannot be keyed as the engine keys it: it is routed
	// without the index, and counted so.
	resp, b = post(t, s, "/v1/chat/completions", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("media: %d %s", resp.StatusCode, b)
	}
	if _, counts = tokenizedCounts(t, s.AdminAddr()); counts["unindexed"] != 1 {
		t.Fatalf("a media request was not counted unindexed: %v", counts)
	}

	// pdlb tokenize --admin's query: the index holds the system prompt's
	// blocks on home, and nothing elsewhere.
	ids, err := m.Chat(nil, []byte(chat(system, "And of Korea?", 2, false)), false)
	if err != nil {
		t.Fatal(err)
	}
	match := indexMatch(t, s, "m", ids)
	if len(match) != 2 {
		t.Fatalf("/admin/index/match: %v", match)
	}
	for pod, cached := range match {
		if (pod == home) != (cached >= prompted*9/10-16) {
			t.Fatalf("/admin/index/match: %v (home %s, first prompt %d tokens)", match, home, prompted)
		}
	}
}

// A Responses request runs on vLLM as the chat its instructions and
// input make: the gateway keys it by that chat's ids, so a client that
// resends the whole conversation each turn (store false) is sent to the
// pod holding it, as a chat client is.
func TestResponsesMatchTheEnginesEvents(t *testing.T) {
	_, _, pods, s := eventFleet(t, engines.VLLM, "qwen3", "r")
	system := strings.Repeat("You answer questions about the geography of East Asia, briefly and accurately. ", 40)
	instructions, _ := json.Marshal(system)
	first := `{"model":"m","instructions":` + string(instructions) + `,"input":"Where is the capital of China?","max_output_tokens":2,"store":false}`
	home := "r-1"
	prompted := direct(t, s, pods[1], "/v1/responses", first)
	if prompted < 500 {
		t.Fatalf("the first prompt is %d tokens; want the long instructions'", prompted)
	}
	next := `{"model":"m","instructions":` + string(instructions) + `,"store":false,"max_output_tokens":2,"input":[
		{"role":"user","content":"Where is the capital of China?"},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Beijing.","annotations":[]}]},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"And of Japan?"}]}]}`
	// Again and again: by load alone, idle pods are a coin's toss.
	for range 5 {
		resp, b := post(t, s, "/v1/responses", next)
		if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != home {
			t.Fatalf("second turn on %s (%d %.200s), its prefix is on %s", resp.Header.Get("x-pdlb-pod"), resp.StatusCode, b, home)
		}
	}
	metrics := get(t, "http://"+s.AdminAddr()+"/metrics")
	var cached float64
	for _, line := range strings.Split(metrics, "\n") {
		fmt.Sscanf(line, `pdlb_prefix_cached_tokens_total{model="m"} %g`, &cached)
	}
	if cached < 5*(float64(prompted)*0.9-16) {
		t.Fatalf("gateway predicted %g cached tokens in 5 requests; the first prompt alone was %d tokens", cached, prompted)
	}
	if _, counts := tokenizedCounts(t, s.AdminAddr()); counts["exact"] != 5 || counts["unindexed"] != 0 {
		t.Fatalf("/admin/index counts %v", counts)
	}
	// Tools shape vLLM's prompt in ways not followed here: such a request
	// is routed without the index, and counted so.
	resp, b := post(t, s, "/v1/responses", `{"model":"m","input":"hi","max_output_tokens":1,"store":false,"tools":[{"type":"function","name":"f","parameters":{}}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("tools: %d %s", resp.StatusCode, b)
	}
	if _, counts := tokenizedCounts(t, s.AdminAddr()); counts["unindexed"] != 1 {
		t.Fatalf("a request with tools was not counted unindexed: %v", counts)
	}
}

// A Messages request (Claude Code's) runs on vLLM as the chat vLLM makes
// of it, tool_use and tool_result blocks as tool calls and tool
// messages: the gateway keys it by that chat's ids, so each turn of an
// agent's loop, resent whole, goes to the pod holding the turns before,
// as the pod's own KV events say, and counts the prompt the pod prefilled.
func TestMessagesMatchTheEnginesEvents(t *testing.T) {
	_, _, pods, s := eventFleet(t, engines.VLLM, "qwen3", "a")
	system, _ := json.Marshal(strings.Repeat("You are a coding agent. Read before you edit, and test after. ", 40))
	tools := `"tools":[{"name":"Read","description":"Reads a file.","input_schema":{"type":"object","properties":{"file_path":{"type":"string"}},"required":["file_path"]}},` +
		`{"name":"Bash","input_schema":{"properties":{"command":{"type":"string"},"timeout":{"type":"number"}}}}]`
	head := `{"model":"m","max_tokens":2,"system":[{"type":"text","text":"x-anthropic-billing-header: cch=%d;"},{"type":"text","text":` + string(system) + `}],` + tools + `,"messages":[` +
		`{"role":"user","content":[{"type":"text","text":"Why does make test fail?"}]},` +
		`{"role":"assistant","content":[{"type":"thinking","thinking":"Run it.","signature":"s"},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"make test","timeout":600000}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"FAIL TestX"}%s]}`
	home := "a-1"
	prompted := direct(t, s, pods[1], "/v1/messages", fmt.Sprintf(head, 1, "")+`]}`)
	if prompted < 500 {
		t.Fatalf("the first prompt is %d tokens; want the long system prompt's", prompted)
	}
	next := fmt.Sprintf(head, 2, `,{"type":"text","text":"Look at x_test.go.","cache_control":{"type":"ephemeral"}}`) +
		`,{"role":"assistant","content":[{"type":"tool_use","id":"toolu_2","name":"Read","input":{"file_path":"/r/x_test.go"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"1\tpackage x"}]}]}]}`
	for range 5 {
		before := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`)
		resp, b := post(t, s, "/v1/messages", next)
		var a struct {
			Usage struct {
				InputTokens int `json:"input_tokens"`
			}
		}
		if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &a) != nil || resp.Header.Get("x-pdlb-pod") != home {
			t.Fatalf("next turn on %s (%d %.200s), its prefix is on %s", resp.Header.Get("x-pdlb-pod"), resp.StatusCode, b, home)
		}
		if n := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`) - before; n != float64(a.Usage.InputTokens) {
			t.Fatalf("the gateway counted %v prompt tokens, the pod prefilled %d", n, a.Usage.InputTokens)
		}
	}
	var prompt, cached float64
	for _, line := range strings.Split(get(t, "http://"+s.AdminAddr()+"/metrics"), "\n") {
		fmt.Sscanf(line, `pdlb_prompt_tokens_total{model="m"} %g`, &prompt)
		fmt.Sscanf(line, `pdlb_prefix_cached_tokens_total{model="m"} %g`, &cached)
	}
	if cached < 5*(float64(prompted)*0.9-16) {
		t.Fatalf("gateway predicted %g cached tokens of %g in 5 requests; the first prompt alone was %d tokens", cached, prompt, prompted)
	}
	if _, counts := tokenizedCounts(t, s.AdminAddr()); counts["exact"] != 5 || counts["unindexed"] != 0 {
		t.Fatalf("/admin/index counts %v", counts)
	}
	// A system-role message in messages is placed otherwise by each vLLM
	// release: routed without the index, and counted so.
	resp, b := post(t, s, "/v1/messages", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},{"role":"system","content":"note"},{"role":"user","content":"b"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("inline system: %d %s", resp.StatusCode, b)
	}
	if _, counts := tokenizedCounts(t, s.AdminAddr()); counts["unindexed"] != 1 {
		t.Fatalf("a request with an inline system message was not counted unindexed: %v", counts)
	}
}

// Newer Claude Code sends a system-role message inside messages most
// turns, which a newer vLLM keeps in place (the sim does): with
// messages_inline_system preserve the gateway keys such a request by the
// engine's ids, so it counts the prompt the pod prefills and its turns
// stay on the pod the KV events show holding them.
func TestMessagesInlineSystemMatchesTheEngine(t *testing.T) {
	_, _, pods, s := eventFleet(t, engines.VLLM, "qwen3", "i", func(c *config.Config) { c.Models[0].MessagesInlineSystem = "preserve" })
	system, _ := json.Marshal(strings.Repeat("You are a coding agent. Read before you edit, and test after. ", 40))
	turn := func(n int) string {
		msgs := []string{`{"role":"system","content":"Session start."}`, `{"role":"user","content":"Why does make test fail?"}`}
		for i := range n {
			msgs = append(msgs, fmt.Sprintf(`{"role":"system","content":"<system-reminder>turn %d</system-reminder>"}`, i),
				fmt.Sprintf(`{"role":"assistant","content":[{"type":"tool_use","id":"toolu_%d","name":"Bash","input":{"command":"make test"}}]}`, i),
				fmt.Sprintf(`{"role":"system","content":"held %d"}`, i),
				fmt.Sprintf(`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_%d","content":"FAIL %d"}]}`, i, i))
		}
		return `{"model":"m","max_tokens":2,"system":` + string(system) + `,"messages":[` + strings.Join(msgs, ",") + `]}`
	}
	home := "i-1"
	prompted := direct(t, s, pods[1], "/v1/messages", turn(1))
	for n := 2; n <= 4; n++ {
		before := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`)
		resp, b := post(t, s, "/v1/messages", turn(n))
		var a struct {
			Usage struct {
				InputTokens int `json:"input_tokens"`
			}
		}
		if resp.StatusCode != 200 || json.Unmarshal([]byte(b), &a) != nil || resp.Header.Get("x-pdlb-pod") != home {
			t.Fatalf("turn %d on %s (%d %.200s), its prefix is on %s", n, resp.Header.Get("x-pdlb-pod"), resp.StatusCode, b, home)
		}
		if got := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`) - before; got != float64(a.Usage.InputTokens) || a.Usage.InputTokens <= prompted {
			t.Fatalf("turn %d: the gateway counted %v prompt tokens, the pod prefilled %d (the first turn %d)", n, got, a.Usage.InputTokens, prompted)
		}
	}
	if _, counts := tokenizedCounts(t, s.AdminAddr()); counts["exact"] != 3 || counts["unindexed"] != 0 {
		t.Fatalf("/admin/index counts %v", counts)
	}
}

// A completion with truncate_prompt_tokens is cached by a vLLM or
// TensorRT-LLM pod as the ids it keeps (Llama 3.1's BOS and the text's
// last k-1). The gateway must key the request by those ids, so a second
// prompt that differs only in the part the engine cuts is predicted
// cached on the pod holding them.
func TestTruncatedPromptMatchesTheEnginesEvents(t *testing.T) {
	for _, e := range []engines.Kind{engines.VLLM, engines.TRTLLM} {
		t.Run(string(e), func(t *testing.T) { truncatedPromptMatches(t, e) })
	}
}

func truncatedPromptMatches(t *testing.T, engine engines.Kind) {
	_, _, pods, s := eventFleet(t, engine, "llama3.1", "l")
	const keep = 256
	tail := strings.Repeat("The river runs north past the old mill, the stone bridge and the church. ", 30)
	body := func(head string) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "prompt": head + "\n" + tail, "max_tokens": 2, "truncate_prompt_tokens": keep})
		return string(b)
	}
	home := "l-1"
	if n := direct(t, s, pods[1], "/v1/completions", body(strings.Repeat("alpha beta ", 200))); n != keep {
		t.Fatalf("the pod kept %d prompt tokens; want %d", n, keep)
	}

	resp, b := post(t, s, "/v1/completions", body(strings.Repeat("gamma delta epsilon ", 150)))
	if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != home {
		t.Fatalf("second prompt on %s (%d %s), its kept part is on %s", resp.Header.Get("x-pdlb-pod"), resp.StatusCode, b, home)
	}
	var prompted, cached float64
	for _, line := range strings.Split(get(t, "http://"+s.AdminAddr()+"/metrics"), "\n") {
		fmt.Sscanf(line, `pdlb_prompt_tokens_total{model="m"} %g`, &prompted)
		fmt.Sscanf(line, `pdlb_prefix_cached_tokens_total{model="m"} %g`, &cached)
	}
	if prompted != keep || cached < keep-16 {
		t.Fatalf("gateway counted %g prompt tokens and predicted %g cached; the engine keeps %d, all cached", prompted, cached, keep)
	}
}

// A completion batch runs on a vLLM pod as its prompts' own requests, each
// cut to truncate_prompt_tokens and cached as its own chain of blocks. The
// gateway keys each prompt by its kept ids, from the root, so a second
// batch that differs only in the parts the engine cuts is predicted
// cached whole on the pod whose KV events reported the first batch, goes
// there, and that pod finds every prompt's blocks cached.
func TestBatchPromptsMatchTheEnginesEvents(t *testing.T) {
	_, _, pods, s := eventFleet(t, engines.VLLM, "llama3.1", "b")
	const keep = 128
	tails := []string{
		strings.Repeat("The river runs north past the old mill, the stone bridge and the church. ", 20),
		strings.Repeat("A train leaves the harbour at dawn with coal, timber and letters. ", 20),
	}
	body := func(head string) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2, "truncate_prompt_tokens": keep,
			"prompt": []string{head + "\n" + tails[0], head + " again\n" + tails[1]}})
		return string(b)
	}
	home := pods[1]
	if n := direct(t, s, home, "/v1/completions", body(strings.Repeat("alpha beta ", 200))); n != 2*keep {
		t.Fatalf("the pod kept %d prompt tokens of the batch; want %d of each of its 2 prompts", n, keep)
	}
	hits := adminMetric(t, home.Address, "vllm:prefix_cache_hits_total")

	resp, b := post(t, s, "/v1/completions", body(strings.Repeat("gamma delta epsilon ", 150)))
	if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != home.Name {
		t.Fatalf("second batch on %s (%d %s), its kept prompts are on %s", resp.Header.Get("x-pdlb-pod"), resp.StatusCode, b, home.Name)
	}
	var prompted, cached float64
	for _, line := range strings.Split(get(t, "http://"+s.AdminAddr()+"/metrics"), "\n") {
		fmt.Sscanf(line, `pdlb_prompt_tokens_total{model="m"} %g`, &prompted)
		fmt.Sscanf(line, `pdlb_prefix_cached_tokens_total{model="m"} %g`, &cached)
	}
	if prompted != 2*keep || cached < 2*(keep-16) {
		t.Fatalf("gateway counted %g prompt tokens and predicted %g cached; the engine keeps %d of each prompt", prompted, cached, keep)
	}
	if hit := adminMetric(t, home.Address, "vllm:prefix_cache_hits_total") - hits; hit < 2*(keep-16) {
		t.Fatalf("the pod found %g tokens of the second batch cached; want most of both prompts' %d", hit, 2*keep)
	}
}

// TestBatchPromptsEachMatchTheEnginesEvents: vLLM runs each prompt of a
// completion batch as a request of its own and hashes its blocks from
// the root, so a batch whose second prompt (as text, or as token ids) a
// pod holds counts that prompt cached there, and goes there.
func TestBatchPromptsEachMatchTheEnginesEvents(t *testing.T) {
	_, m, pods, s := eventFleet(t, engines.VLLM, "llama3.1", "e")
	const first = "First, a question of another kind."
	held := strings.Repeat("A train leaves the harbour at dawn with coal, timber and letters. ", 20)
	body := func(prompt any) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2, "prompt": prompt})
		return string(b)
	}
	home := pods[1]
	n := direct(t, s, home, "/v1/completions", body(held))
	ids := m.Completion(nil, []byte(held), true)
	if len(ids) != n {
		t.Fatalf("the pod counted %d prompt tokens, the tokenizer %d", n, len(ids))
	}
	full := n / 16 * 16 // the tokens of the held prompt's whole blocks
	for _, batch := range []any{
		[]string{first, held},
		[][]uint32{m.Completion(nil, []byte(first), true), ids},
	} {
		before := metricValue(t, s, `pdlb_prefix_cached_tokens_total{model="m"}`)
		resp, b := post(t, s, "/v1/completions", body(batch))
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		if cached := metricValue(t, s, `pdlb_prefix_cached_tokens_total{model="m"}`) - before; cached < float64(full) {
			t.Errorf("%T batch: predicted %v tokens cached; its second prompt's %d are on %s", batch, cached, full, home.Name)
		}
		if pod := resp.Header.Get("x-pdlb-pod"); pod != home.Name {
			t.Errorf("%T batch went to %s; its second prompt is on %s", batch, pod, home.Name)
		}
	}
}

// TestLargeBodyReadOffTheLoop: a body over 64 KiB is read on a worker
// whatever its model, one without a tokenizer too (its parse and its
// stand-in keys would hold up the loop), answered whole and streamed and
// counted off the loop; one that does not parse or names no model gets
// the same 400 and 404 as on the loop, counted nowhere; a small body
// stays on the loop.
func TestLargeBodyReadOffTheLoop(t *testing.T) {
	s := testGateway(t, podsOf("m", testFleet(t, "m", 1, 100)...), nil)
	offLoop := func() float64 { return metricValue(t, s, `pdlb_prompt_tokenized_off_loop_total{model="m"}`) }
	long := strings.Repeat("Summarise the design document below; keep every figure it gives. ", 1100)
	for i, stream := range []bool{false, true} {
		resp, b := post(t, s, "/v1/chat/completions", chat(long, "Begin.", 2, stream))
		if resp.StatusCode != 200 || (stream && !streamWhole(b)) || offLoop() != float64(i+1) {
			t.Fatalf("stream %v: %d %.200s, %v read off the loop, want %d", stream, resp.StatusCode, b, offLoop(), i+1)
		}
	}
	for _, c := range []struct{ body, want string }{
		{`{"model":"m","messages":[{"role":"user","content":"` + long + `"}],"max_tokens":"two"}`, "max_tokens"},
		{strings.Replace(chat(long, "Begin.", 2, false), `"model":"m"`, `"model":"nope"`, 1), "nope"},
	} {
		if resp, b := post(t, s, "/v1/chat/completions", c.body); resp.StatusCode/100 != 4 || !strings.Contains(b, c.want) || offLoop() != 2 {
			t.Errorf("%d %.300s, %v read off the loop; want a 4xx naming %s, 2", resp.StatusCode, b, offLoop(), c.want)
		}
	}
	// /tokenize reads a prompt but generates nothing: read off the loop,
	// not counted as a generation's prompt.
	tok := `{"model":"m","prompt":"` + long + `"}`
	if resp, b := post(t, s, "/tokenize", tok); resp.StatusCode != 200 || offLoop() != 2 {
		t.Errorf("/tokenize: %d %.200s, %v read off the loop, want 2", resp.StatusCode, b, offLoop())
	}
	if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 || offLoop() != 2 {
		t.Fatalf("a small request: %d %s, %v read off the loop, want 2", resp.StatusCode, b, offLoop())
	}
}

// TestFallbackTokenizedOffTheLoop: a request its model's pod answers 503
// to, moved to a fallback model whose tokenizer the gateway runs, is
// tokenized for it on a worker when the event loop it came on would be
// held up (much new text, a prompt the template's Jinja engine renders),
// on the loop when it is small; its ids are that model's engine's. (A
// body over 64 KiB is read on a worker from the start.)
func TestFallbackTokenizedOffTheLoop(t *testing.T) {
	dir := tokfiles.Dir(t, "llama3.1")
	llama, err := prompt.Load(prompt.Config{Tokenizer: dir})
	if err != nil {
		t.Fatal(err)
	}
	n, err := sim.Start(sim.Config{Name: "n-0", Model: "n", Listen: "127.0.0.1:0", Speedup: 100, Prompt: llama})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(busy.Close)
	pods := append(podsOf("n", n), config.Pod{Name: "m-0", Model: "m", Address: strings.TrimPrefix(busy.URL, "http://")})
	s := testGateway(t, pods, func(c *config.Config) {
		c.Models = []config.Model{{Name: "m", LoRA: config.LoRA{Fallback: []string{"n"}}}, {Name: "n", Tokenizer: dir}}
	})
	offLoop := func() float64 { return metricValue(t, s, `pdlb_prompt_tokenized_off_loop_total{model="n"}`) }
	f := func(what, body string, want float64) {
		t.Helper()
		ids, err := llama.Chat(nil, []byte(body), false)
		if err != nil {
			t.Fatal(err)
		}
		before := metricValue(t, s, `pdlb_prompt_tokens_total{model="n"}`)
		resp, b := post(t, s, "/v1/chat/completions", body)
		var answer struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			}
		}
		_ = json.Unmarshal([]byte(b), &answer)
		if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-model") != "n" || answer.Usage.PromptTokens != len(ids) {
			t.Fatalf("%s: %d from model %q, %d prompt tokens, want 200 from n, %d: %.200s", what, resp.StatusCode, resp.Header.Get("x-pdlb-model"), answer.Usage.PromptTokens, len(ids), b)
		}
		if got := metricValue(t, s, `pdlb_prompt_tokens_total{model="n"}`) - before; got != float64(len(ids)) {
			t.Errorf("%s: the gateway counted %v prompt tokens, the engine's are %d", what, got, len(ids))
		}
		if offLoop() != want {
			t.Errorf("%s: %v requests tokenized off the loop, want %v", what, offLoop(), want)
		}
	}
	f("40 KB of new text", chat(strings.Repeat("Summarise the design document below; keep every figure it gives. ", 600), "Begin.", 2, false), 1)
	tools, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2, "messages": []any{map[string]string{"role": "user", "content": strings.Repeat("Keep every figure. ", 1000)}},
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "read", "parameters": map[string]any{"type": "object"}}}}})
	f("20 KB with tools", string(tools), 2)
	f("a short prompt", chatBody, 2)
	if got := metricValue(t, s, `pdlb_fallback_requests_total{model="n"}`); got != 3 {
		t.Errorf("pdlb_fallback_requests_total{model=\"n\"} = %v, want 3", got)
	}
}

// A prompt over 64 KiB, or 16 KiB that its template's Jinja engine
// renders or with 16 KiB new to the tokenizer, is tokenized on a worker,
// not the event loop, which meanwhile serves its other connections: the request is keyed and counted as on
// the loop, answered whole or streamed, kept-alive or not, and a refusal
// made on the worker reaches its client.
func TestLargePromptTokenizedOffTheLoop(t *testing.T) {
	_, _, pods, s := eventFleet(t, engines.VLLM, "qwen3", "w")
	system := strings.Repeat("Summarise the design document below; keep every figure it gives. ", 1100)
	home := "w-1"
	prompted := direct(t, s, pods[1], "/v1/chat/completions", chat(system, "Begin.", 2, false))
	offLoop := func() float64 { return metricValue(t, s, `pdlb_prompt_tokenized_off_loop_total{model="m"}`) }
	n := 0
	bothClients(t, func(t *testing.T, via *http.Client) {
		for _, stream := range []bool{false, true} {
			before := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`)
			resp, b := postVia(t, via, s, "/v1/chat/completions", chat(system, "Begin.", 2, stream))
			if resp.StatusCode != 200 || resp.Header.Get("x-pdlb-pod") != home {
				t.Fatalf("stream %v: on %s (%d %.200s), its prefix is on %s", stream, resp.Header.Get("x-pdlb-pod"), resp.StatusCode, b, home)
			}
			if stream && !streamWhole(b) {
				t.Fatalf("the stream ends %q", b[max(len(b)-60, 0):])
			}
			if got := metricValue(t, s, `pdlb_prompt_tokens_total{model="m"}`) - before; got != float64(prompted) {
				t.Fatalf("the gateway counted %v prompt tokens, the pod prefilled %d", got, prompted)
			}
			if n++; offLoop() != float64(n) {
				t.Fatalf("%v requests tokenized off the loop, want %d", offLoop(), n)
			}
		}
	})
	if _, counts := tokenizedCounts(t, s.AdminAddr()); counts["exact"] != 4 {
		t.Fatalf("/admin/index counts %v", counts)
	}
	if resp, b := post(t, s, "/v1/chat/completions", chatBody); resp.StatusCode != 200 || offLoop() != float64(n) {
		t.Fatalf("a small request: %d %s, %v tokenized off the loop, want %d", resp.StatusCode, b, offLoop(), n)
	}
	// 20 KB without tools: new to the tokenizer, encoded on a worker;
	// seen, the loop renders and keys it (microseconds). With tools the
	// Jinja engine renders it, on a worker.
	medium := strings.Repeat("Keep every figure. ", 1000)
	for i, want := range []float64{float64(n + 1), float64(n + 1)} {
		if resp, b := post(t, s, "/v1/chat/completions", chat(medium, "Begin.", 2, false)); resp.StatusCode != 200 || offLoop() != want {
			t.Fatalf("20 KB without tools, time %d: %d %.200s, %v tokenized off the loop, want %v", i+1, resp.StatusCode, b, offLoop(), want)
		}
	}
	n++
	tools, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2, "messages": []any{map[string]string{"role": "user", "content": medium}},
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "read", "parameters": map[string]any{"type": "object"}}}}})
	if resp, b := post(t, s, "/v1/chat/completions", string(tools)); resp.StatusCode != 200 || offLoop() != float64(n+1) {
		t.Fatalf("20 KB with tools: %d %.200s, %v tokenized off the loop, want %d", resp.StatusCode, b, offLoop(), n+1)
	}
	n++
	// So are an agent's history of tool calls and results, no tools
	// listed, and a plain one the fast path refuses: an assistant turn
	// echoing Qwen3's <think>, a trigger of its template.
	// (Its 20 KB system prompt was seen above: only Jinja moves it.)
	echo, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2, "messages": []any{map[string]string{"role": "system", "content": medium},
		map[string]string{"role": "user", "content": "Begin."},
		map[string]string{"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello!"}, map[string]string{"role": "user", "content": "More."}}})
	if resp, b := post(t, s, "/v1/chat/completions", string(echo)); resp.StatusCode != 200 || offLoop() != float64(n+1) {
		t.Fatalf("20 KB echoing <think>: %d %.200s, %v tokenized off the loop, want %d", resp.StatusCode, b, offLoop(), n+1)
	}
	n++
	history := []any{map[string]string{"role": "user", "content": "Why does the build fail?"}}
	for i := range 20 {
		id := fmt.Sprint("call_", i)
		history = append(history,
			map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{"id": id, "type": "function",
				"function": map[string]any{"name": "read", "arguments": fmt.Sprintf(`{"path":"/src/f%d.go"}`, i)}}}},
			map[string]any{"role": "tool", "tool_call_id": id, "content": strings.Repeat(fmt.Sprint("func f() { return g(x) } // line ", i, "\n"), 25)})
	}
	calls, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2, "messages": history})
	if resp, b := post(t, s, "/v1/chat/completions", string(calls)); resp.StatusCode != 200 || offLoop() != float64(n+1) {
		t.Fatalf("%d bytes of tool calls: %d %.200s, %v tokenized off the loop, want %d", len(calls), resp.StatusCode, b, offLoop(), n+1)
	}
	n++
	// A prompt of token ids is not tokenized: under 64 KiB it stays on
	// the loop; over, it is read on a worker, as any body is.
	for _, c := range []struct {
		ids  int
		want float64
	}{{6000, float64(n)}, {12000, float64(n + 1)}} {
		ids := `{"model":"m","max_tokens":2,"prompt":[` + strings.TrimSuffix(strings.Repeat("1234, ", c.ids), ", ") + `]}`
		if resp, b := post(t, s, "/v1/completions", ids); resp.StatusCode != 200 || offLoop() != c.want {
			t.Fatalf("%d bytes of token ids: %d %.200s, %v tokenized off the loop, want %v", len(ids), resp.StatusCode, b, offLoop(), c.want)
		}
	}
	n++
	// More large requests at once than the cores tokenize them: each
	// waits for a slot, and all are answered.
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			if resp, b := post(t, s, "/v1/chat/completions", chat(system, fmt.Sprint("Part ", i), 2, i%2 == 0)); resp.StatusCode != 200 {
				t.Errorf("concurrent request %d: %d %.200s", i, resp.StatusCode, b)
			}
		})
	}
	wg.Wait()
	if n += 12; offLoop() != float64(n) {
		t.Fatalf("%v requests tokenized off the loop, want %d", offLoop(), n)
	}
	// vLLM refuses a message without content before rendering: the
	// worker answers the gateway's 400, naming the field.
	big, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{
		map[string]string{"role": "system", "content": system}, map[string]any{"role": "user", "content": nil}}})
	resp, b := post(t, s, "/v1/chat/completions", string(big))
	if resp.StatusCode != 400 || !strings.Contains(b, "content") || offLoop() != float64(n+1) {
		t.Fatalf("a refused large request: %d %s, %v tokenized off the loop", resp.StatusCode, b, offLoop())
	}
}
