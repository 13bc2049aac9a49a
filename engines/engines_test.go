package engines

import (
	"reflect"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	f := func(k Kind, text string, want Load, wantOK bool) {
		t.Helper()
		got, ok := ParseMetrics(k, []byte(text))
		if ok != wantOK || !reflect.DeepEqual(got, want) {
			t.Fatalf("ParseMetrics(%s) = %+v, %v; want %+v, %v", k, got, ok, want, wantOK)
		}
	}
	f(VLLM, `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{model_name="m"} 7
vllm:kv_cache_usage_perc{model_name="m"} 0.25
vllm:generation_tokens_total{model_name="m"} 1234
`, Load{Running: 5, Waiting: 7, KVUsage: 0.25, GeneratedTokens: 1234, Throughput: -1, Ranks: []RankLoad{{Running: 3}, {Running: 2}}}, true)
	f(VLLM, "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\n", Load{KVUsage: 0.5, GeneratedTokens: -1, Throughput: -1}, true)
	// A data-parallel pod exports one series per engine, each the fraction
	// of that engine's own KV cache: the pod's use is their mean.
	f(VLLM, `vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.75
`, Load{KVUsage: 0.625, GeneratedTokens: -1, Throughput: -1}, true)
	f(VLLM, `vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.75
`, Load{KVUsage: 0.625, GeneratedTokens: -1, Throughput: -1}, true)
	f(SGLang, `sglang:token_usage{model_name="m",tp_rank="0",dp_rank="0"} 0.25
sglang:token_usage{model_name="m",tp_rank="0",dp_rank="1"} 1
`, Load{KVUsage: 0.625, GeneratedTokens: -1, Throughput: -1}, true)
	f(SGLang, `sglang:num_running_reqs{model_name="m"} 4
sglang:num_queue_reqs{model_name="m"} 1
sglang:token_usage{model_name="m"} 0.5
sglang:gen_throughput{model_name="m"} 812.5`, Load{Running: 4, Waiting: 1, KVUsage: 0.5, GeneratedTokens: -1, Throughput: 812.5}, true)
	// With --enable-priority-scheduling SGLang exports the total under
	// priority="" and the same requests again under priority="<n>".
	f(SGLang, `sglang:num_running_reqs{model_name="m",priority=""} 4
sglang:num_running_reqs{model_name="m",priority="0"} 3
sglang:num_running_reqs{model_name="m",priority="1"} 1
sglang:num_queue_reqs{model_name="m",priority="",dp_rank="0"} 2
sglang:num_queue_reqs{model_name="m",priority="7",dp_rank="0"} 2
sglang:num_queue_reqs{model_name="m",priority="",dp_rank="1"} 1
sglang:num_queue_reqs{model_name="m",dp_rank="1",priority="7"} 1
`, Load{Running: 4, Waiting: 3, GeneratedTokens: -1, Throughput: -1, Ranks: []RankLoad{{Waiting: 2}, {Waiting: 1}}}, true)
	// With --enable-metrics-for-all-schedulers every tensor-parallel rank
	// of a data-parallel rank exports that rank's counts again under its
	// own tp_rank (and moe_ep_rank): each is counted once, as its lowest
	// tp_rank's. Here TP 4 without DP, then TP 4 with DP attention over 2.
	f(SGLang, `sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="1"} 3.0
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="1",pp_rank="0",tp_rank="2"} 3.0
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="1",pp_rank="0",tp_rank="3"} 3.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 2.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="1"} 2.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="1",pp_rank="0",tp_rank="2"} 2.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="1",pp_rank="0",tp_rank="3"} 2.0
`, Load{Running: 3, Waiting: 2, GeneratedTokens: -1, Throughput: -1}, true)
	f(SGLang, `sglang:num_running_reqs{dp_rank="0",model_name="m",pp_rank="0",tp_rank="1"} 3.0
sglang:num_running_reqs{dp_rank="0",model_name="m",pp_rank="0",tp_rank="0"} 3.0
sglang:num_running_reqs{dp_rank="1",model_name="m",pp_rank="0",tp_rank="2"} 5.0
sglang:num_running_reqs{dp_rank="1",model_name="m",pp_rank="0",tp_rank="3"} 5.0
sglang:token_usage{dp_rank="0",model_name="m",pp_rank="0",tp_rank="0"} 0.5
sglang:token_usage{dp_rank="0",model_name="m",pp_rank="0",tp_rank="1"} 0.5
sglang:token_usage{dp_rank="1",model_name="m",pp_rank="0",tp_rank="2"} 0.25
sglang:token_usage{dp_rank="1",model_name="m",pp_rank="0",tp_rank="3"} 0.25
sglang:gen_throughput{dp_rank="0",model_name="m",pp_rank="0",tp_rank="0"} 100
sglang:gen_throughput{dp_rank="0",model_name="m",pp_rank="0",tp_rank="1"} 100
sglang:gen_throughput{dp_rank="1",model_name="m",pp_rank="0",tp_rank="2"} 50
sglang:gen_throughput{dp_rank="1",model_name="m",pp_rank="0",tp_rank="3"} 50
`, Load{Running: 8, KVUsage: 0.375, GeneratedTokens: -1, Throughput: 150, Ranks: []RankLoad{{Running: 3}, {Running: 5}}}, true)
	// Without the flag only each DP rank's first attention rank exports:
	// under DP attention its tp_rank is not 0.
	f(SGLang, `sglang:num_running_reqs{dp_rank="0",model_name="m",pp_rank="0",tp_rank="0"} 3.0
sglang:num_running_reqs{dp_rank="1",model_name="m",pp_rank="0",tp_rank="2"} 5.0
`, Load{Running: 8, GeneratedTokens: -1, Throughput: -1, Ranks: []RankLoad{{Running: 3}, {Running: 5}}}, true)
	f(VLLM, "garbage\n{\nvllm:num_requests_running notanumber\n", Load{GeneratedTokens: -1, Throughput: -1}, false)
	f(TRTLLM, `[{"iter":1}]`, Load{}, false)
}

func TestParseKind(t *testing.T) {
	if k, err := ParseKind(""); err != nil || k != VLLM {
		t.Fatalf("ParseKind(\"\") = %v, %v", k, err)
	}
	if _, err := ParseKind("tgi"); err == nil {
		t.Fatal("tgi accepted")
	}
}
