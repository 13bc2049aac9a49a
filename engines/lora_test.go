package engines

import (
	"fmt"
	"testing"
)

func TestParseLoRAInfo(t *testing.T) {
	f := func(text string, want LoRAInfo, wantOK bool) {
		t.Helper()
		got, ok := ParseLoRAInfo([]byte(text))
		if ok != wantOK || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%q: got %+v %v, want %+v %v", text, got, ok, want, wantOK)
		}
	}
	f("vllm:num_requests_running 3\n", LoRAInfo{}, false)
	f(`# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters=""} 1.7e9
`, LoRAInfo{MaxLoras: 4, Running: []string{"sql", "chat"}}, true)
	// The latest sample wins, in any order.
	f(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="new",waiting_lora_adapters="w\"x"} 20
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 10
`, LoRAInfo{MaxLoras: 2, Running: []string{"new"}, Waiting: []string{`w"x`}}, true)
	f(`vllm:lora_requests_info{max_lora="2",running_lora_adapters="a} 1`, LoRAInfo{}, false)
}

func FuzzParseLoRAInfo(f *testing.F) {
	f.Add([]byte(`vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters=""} 1.7e9`))
	f.Add([]byte(`vllm:lora_requests_info{max_lora="4",running_lora_adapters="a\\\"",waiting_lora_adapters=""} x`))
	f.Fuzz(func(t *testing.T, b []byte) {
		info, ok := ParseLoRAInfo(b)
		if !ok && (info.MaxLoras != 0 || info.Running != nil || info.Waiting != nil) {
			t.Fatalf("no sample but %+v", info)
		}
	})
}

func TestAdapterLoaded(t *testing.T) {
	f := func(k Kind, status int, body string, ok bool) {
		t.Helper()
		if err := AdapterLoaded(k, status, []byte(body)); (err == nil) != ok {
			t.Errorf("%s %d %s: err = %v", k, status, body, err)
		}
	}
	f(VLLM, 200, "Success: LoRA adapter 'sql' added successfully.", true)
	f(VLLM, 400, `{"object":"error","message":"The lora adapter 'sql' has already been loaded.","type":"InvalidUserInput","code":400}`, true)
	f(VLLM, 404, `{"object":"error","message":"No adapter found for /x","type":"NotFoundError","code":404}`, false)
	f(SGLang, 200, `{"success":true,"error_message":"","loaded_adapters":{"sql":"/x"}}`, true)
	f(SGLang, 200, `{"success":false,"error_message":"bad path"}`, false)
	if _, _, err := AdapterPaths(TRTLLM); err == nil {
		t.Error("trtllm has a load endpoint")
	}
}

func TestParseModelList(t *testing.T) {
	cards, err := ParseModelList([]byte(`{"object":"list","data":[{"id":"m","root":"/m"},{"id":"sql","root":"/loras/sql","parent":"m"}]}`))
	if err != nil || fmt.Sprint(cards) != "[{m /m } {sql /loras/sql m}]" {
		t.Errorf("%v %v", cards, err)
	}
}
