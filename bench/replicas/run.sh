#!/usr/bin/env bash
# bench/replicas/run.sh: two pdlb replicas active-active (make bench's
# 'replicas' scenario, issue 26).
#
# A sim PD fleet (fleet.yaml: 4 prefill pods publishing KV events, 2 decode
# pods, real time) and one Redis; gateway replicas over it (gateway.yaml),
# each following the pods' KV events and sharing its ledger (decode and
# prefill charges, the pods' requests in flight) through Redis. Three
# phases, each on a fresh fleet, Redis and replicas (cold caches), the
# same workload (seed-chat, the same seed):
#   1. one replica:  pdlb load --target A
#   2. two replicas: pdlb load --target A,B (round robin); meanwhile both
#      replicas' decode ledgers are read back to back every 0.5 s
#   3. two replicas, B killed (SIGKILL) halfway: A's requests must all be
#      answered
# It prints each load report and a summary, and exits 1 if a check fails.
# PDLB (default ./bin/pdlb) is the binary; RATE and DURATION the load.
set -u
cd "$(dirname "$0")/../.."
PDLB=${PDLB:-./bin/pdlb}
RATE=${RATE:-6}
DURATION=${DURATION:-60}
DIR=bench/replicas
REDIS_PORT=19599
A=127.0.0.1:19590 A_ADMIN=127.0.0.1:19591
B=127.0.0.1:19592 B_ADMIN=127.0.0.1:19593
PODS_METRICS=http://127.0.0.1:19600/metrics,http://127.0.0.1:19601/metrics,http://127.0.0.1:19602/metrics,http://127.0.0.1:19603/metrics
TMP=$(mktemp -d)
PIDS=()
FAILED=0

stop_all() {
	local p
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
	PIDS=()
}
trap 'stop_all; rm -rf "$TMP"' EXIT

# wait_for WHAT CMD...: retry CMD for up to 30 s.
wait_for() {
	local what=$1 i
	shift
	for i in $(seq 300); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "replicas: $what did not come up; logs:" >&2
	tail -n 5 "$TMP"/*.log >&2
	return 1
}

# start_fleet: fresh Redis and sim fleet.
start_fleet() {
	redis-server --port $REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no >"$TMP/redis.log" 2>&1 &
	PIDS+=($!)
	"$PDLB" fleet --config $DIR/fleet.yaml >"$TMP/fleet.log" 2>&1 &
	PIDS+=($!)
	wait_for redis redis-cli -p $REDIS_PORT ping &&
		wait_for "the fleet" grep -q 'dec-1' "$TMP/fleet.log"
}

# start_replica NAME LISTEN ADMIN: a gateway replica; its pid in $LAST.
start_replica() {
	sed "s/REPLICA/$1/" $DIR/gateway.yaml >"$TMP/gateway-$1.yaml"
	"$PDLB" serve --config "$TMP/gateway-$1.yaml" --listen "$2" --admin "$3" >"$TMP/gateway-$1.log" 2>&1 &
	LAST=$!
	PIDS+=($LAST)
	# /ready counts combined pods only; a PD model is ready once it answers.
	wait_for "replica $1" curl -sf "http://$2/v1/completions" -H 'Content-Type: application/json' \
		-d '{"model":"m","prompt":"ready?","max_tokens":1}'
}

# load OUT TARGETS: pdlb load over TARGETS (comma-separated host:port),
# its JSON report in OUT, its table on stdout.
load() {
	local out=$1 targets
	targets=$(echo "$2" | sed 's|\([^,]*\)|http://\1|g')
	"$PDLB" load --target "$targets" --model m --workload seed-chat --seed 1 --rate "$RATE" \
		--duration "${DURATION}s" --output-tokens 16 --metrics "$PODS_METRICS" --json >"$out"
	jq -r '"requests \(.requests)  ok \(.ok)  lost \(.lost)  errors \(.errors)  hit rate \(.prefix_cache_hit_rate // "?")  same pod \(.same_pod // "?")",
		(.targets // [] | .[] | "  \(.target): requests \(.requests) ok \(.ok) errors \(.errors) lost \(.lost)")' "$out"
}

# sample_ledgers OUT: each replica's decode tokens over the decode pods
# (its own charges plus the other replica's, shared) and its own requests
# in flight on them, read by one curl back to back every 0.5 s until
# killed: "decode_A decode_B in_flight_A in_flight_B".
sample_ledgers() {
	while :; do
		curl -sf "http://$A_ADMIN/admin/pods" "http://$B_ADMIN/admin/pods" |
			jq -rs 'map(.pods | map(select(.role == "decode"))) | (map(map(.token_load.decode) | add) + map(map(.in_flight) | add)) | join(" ")' >>"$1"
		sleep 0.5
	done
}

check() {
	if [ "$1" = ok ]; then
		echo "PASS: $2"
	else
		echo "FAIL: $2"
		FAILED=1
	fi
}

echo "== phase 1: one replica (A) =="
start_fleet && start_replica a $A $A_ADMIN || exit 1
load "$TMP/one.json" $A
stop_all

echo "== phase 2: two replicas (A, B), round robin =="
start_fleet && start_replica a $A $A_ADMIN && start_replica b $B $B_ADMIN || exit 1
sample_ledgers "$TMP/ledgers" &
SAMPLER=$!
load "$TMP/two.json" "$A,$B"
kill $SAMPLER
wait $SAMPLER 2>/dev/null
stop_all

echo "== phase 3: two replicas, B killed after $((DURATION / 2)) s =="
start_fleet && start_replica a $A $A_ADMIN && start_replica b $B $B_ADMIN || exit 1
B_PID=$LAST
disown $B_PID # its SIGKILL is the point, not worth a shell notice
(sleep $((DURATION / 2)) && kill -9 $B_PID) &
KILLER=$!
load "$TMP/kill.json" "$A,$B"
wait $KILLER
stop_all

echo "== summary =="
one=$(jq '.prefix_cache_hit_rate // -1' "$TMP/one.json")
two=$(jq '.prefix_cache_hit_rate // -1' "$TMP/two.json")
printf 'hit rate: one replica %.1f%%, two replicas %.1f%%\n' "$(jq -n "100*$one")" "$(jq -n "100*$two")"
check "$(jq -n "$one >= 0 and $two >= 0 and ($one - $two | fabs) <= 0.02" | sed 's/true/ok/')" \
	"two replicas' hit rate within 2 points of one replica's"
printf 'same pod as the session'"'"'s previous turn: one replica %.1f%%, two replicas %.1f%%\n' \
	"$(jq '100 * (.same_pod // 0)' "$TMP/one.json")" "$(jq '100 * (.same_pod // 0)' "$TMP/two.json")"
# Ledgers: the mean |A - B| of back-to-back reads, against one request's
# decode charge (the decode tokens both ledgers hold over the requests in
# flight through both): what one refresh's arrivals or departures move.
ledgers='split("\n") | map(select(length > 0) | split(" ") | map(tonumber)) | map(select(.[2] + .[3] > 0))
	| length as $n | {n: $n, a: (map(.[0]) | add / $n), b: (map(.[1]) | add / $n),
	  diff: (map(.[0] - .[1] | fabs) | add / $n), max: (map(.[0] - .[1] | fabs) | max),
	  charge: ((map((.[0] + .[1]) / 2) | add) / (map(.[2] + .[3]) | add))}'
jq -Rrs "$ledgers"' | "decode ledgers: \(.n) samples under load; mean A \(.a | floor) tokens, mean B \(.b | floor), mean |A-B| \(.diff | floor), max |A-B| \(.max | floor); one request'"'"'s charge \(.charge | floor)"' "$TMP/ledgers"
check "$(jq -Rrs "$ledgers"' | if .n >= 5 and .diff <= .charge then "ok" else "far" end' "$TMP/ledgers")" \
	"decode ledgers agree within one refresh: mean |A-B| below one request's charge (both read every 0.5 s, sync every 20 ms)"
check "$(jq -r '.targets[0] | if .requests > 0 and .ok == .requests then "ok" else "lost" end' "$TMP/kill.json")" \
	"B killed mid-load: every request sent to A answered ($(jq -r '.targets[0] | "\(.ok) of \(.requests)"' "$TMP/kill.json"); B's: $(jq -r '.targets[1] | "\(.ok) ok, \(.errors) errors, \(.lost) lost of \(.requests)"' "$TMP/kill.json"))"
exit $FAILED
