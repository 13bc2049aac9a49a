#!/usr/bin/env bash
# In-place upgrade under load (docs/tuning.md, "Upgrading in place"): wrk
# keeps CONNS keep-alive connections busy on pdlb's port while a second
# pdlb starts with the same configuration beside it and the first gets
# SIGTERM. What the upgrade cost the clients is wrk's socket errors and
# non-2xx answers. One row per --shutdown-delay of the first pdlb (DELAYS)
# and round (ROUNDS). Prints a markdown table on stdout; progress goes to
# stderr. KEEP=1 keeps the scratch directory.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-32}
DELAYS=${DELAYS:-0s 1s}

NAME=upgrade
# shellcheck source=../proxy/harness.sh
. "$ROOT/bench/proxy/harness.sh"

command -v wrk >/dev/null || { log "wrk is required (bench/proxy/run.sh installs it)"; exit 1; }
log "building pdlb and the stub"
(cd "$ROOT" && go build -o "$DIR/pdlb" ./tools/pdlb && go build -o "$DIR/stub" ./bench/proxy/stub)
take_port STUB
"$DIR/stub" --listen "$STUB" 2>"$DIR/stub.log" &
started
wait_port "$STUB"

# serving waits until the pdlb logging to $1 says it serves (10 s at most).
serving() {
	local i
	for i in $(seq 100); do
		grep -q 'msg="pdlb serving"' "$1" && return 0
		sleep 0.1
	done
	log "no 'pdlb serving' in $1: $(tail -1 "$1")"
	return 1
}

echo "wrk -t2 -c$CONNS -d6s (keep-alive) on the port; the second pdlb starts 1.5 s in, the first gets SIGTERM 1 s later."
echo
echo "| first pdlb's --shutdown-delay | round | requests | socket errors | non-2xx | first pdlb's exit |"
echo "| --- | --- | --- | --- | --- | --- |"
for delay in $DELAYS; do
	for round in $(seq "$ROUNDS"); do
		take_port API
		take_port ADMIN
		args=(serve --pod "model=bench,address=$STUB" --listen "$API" --admin "$ADMIN")
		"$DIR/pdlb" "${args[@]}" --shutdown-delay "$delay" 2>"$DIR/first.log" &
		first=$!
		started
		serving "$DIR/first.log"
		(cd "$ROOT" && wrk -t2 -c"$CONNS" -d6s -s bench/proxy/post.lua "http://$API/v1/chat/completions" >"$DIR/wrk.txt") &
		load=$!
		sleep 1.5
		"$DIR/pdlb" "${args[@]}" 2>"$DIR/second.log" &
		second=$!
		started
		serving "$DIR/second.log"
		sleep 1
		log "delay $delay, round $round: SIGTERM to the first pdlb"
		kill -TERM "$first"
		wait "$load"
		status=0
		wait "$first" || status=$?
		requests=$(awk '/requests in/{print $1}' "$DIR/wrk.txt")
		errors=$(awk '/Socket errors/{gsub(",", ""); print $4 + $6 + $8 + $10}' "$DIR/wrk.txt")
		bad=$(awk '/Non-2xx/{print $NF}' "$DIR/wrk.txt")
		echo "| $delay | $round | $requests | ${errors:-0} | ${bad:-0} | $status |"
		kill "$second"
		wait "$second" || true
	done
done
echo
echo "Measured $(machine)."
