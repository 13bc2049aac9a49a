#!/usr/bin/env bash
# SSE scale benchmark (issue 8, item 3c): many concurrent long streams
# through pdlb from the proxy benchmark's stub, which stamps every event
# with its send time. Prints one markdown table on stdout:
#   - the relay latency each event gets, directly from the stub and through
#     pdlb at a moderate load, and the difference (what pdlb adds): the
#     median of LAT_ROUNDS rounds, each taking both at once, with nginx's
#     round after pdlb's when it is installed, then all three at once (the
#     head to head p99), then a TCP splice's on pdlb's event loops
#     (bench/proxy/splice: what any proxy on pdlb's stack spends);
#   - pdlb's resident memory per held stream, (VmRSS with N streams − idle
#     VmRSS) / N, with the goroutine stacks and live heap behind it.
# Progress goes to stderr.
#
# Knobs (environment): STREAMS (10000; capped by the open-files limit, since
# pdlb holds two sockets per stream), HOLD_EVENTS (30) and HOLD_INTERVAL (1s)
# per held stream, DIAL_RATE (2000 streams/s), LAT_STREAMS (64), LAT_EVENTS
# (200), LAT_INTERVAL (10ms) and LAT_ROUNDS (3) for the latency runs
# (through pdlb, and through nginx when it is installed, for reference), FRONTEND (pdlb's
# --frontend; empty: its default), PDLB_ARGS (more of pdlb's flags, e.g.
# --io-uring=false), KEEP (1: keep the scratch directory).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STREAMS=${STREAMS:-10000}
HOLD_EVENTS=${HOLD_EVENTS:-30}
HOLD_INTERVAL=${HOLD_INTERVAL:-1s}
DIAL_RATE=${DIAL_RATE:-2000}
LAT_STREAMS=${LAT_STREAMS:-64}
LAT_EVENTS=${LAT_EVENTS:-200}
LAT_INTERVAL=${LAT_INTERVAL:-10ms}
LAT_ROUNDS=${LAT_ROUNDS:-5}
FRONTEND=${FRONTEND:-}

NAME=ssebench
# shellcheck source=../proxy/harness.sh
. "$ROOT/bench/proxy/harness.sh"
take_port STUB
take_port PDLB
take_port PDLB_ADMIN
API=/v1/chat/completions

# field prints a number of the client's "result {json}" line in file $1.
field() { sed -n "s/^result .*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1"; }

rss_kib() { awk '/^VmRSS:/{print $2}' "/proc/$1/status"; }
goroutines() { curl -s "http://$PDLB_ADMIN/debug/pprof/goroutine?debug=1" | awk 'NR==1{print $NF}'; }
# heap_stat prints a runtime.MemStats figure (bytes) after a GC, so it
# counts what is live; Stack prints StackInuse.
heap_stat() { curl -s "http://$PDLB_ADMIN/debug/pprof/heap?debug=1&gc=1" | awk -v k="$1" '$1=="#" && $2==k {print $4}'; }

# pdlb holds a client socket and an upstream socket per stream, the client
# one socket per stream: the open-files limit caps the streams.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
FD_LIMIT=$(ulimit -n)
N=$STREAMS
CAP=$(((FD_LIMIT - 512) / 2))
if [ "$N" -gt "$CAP" ]; then
	log "open-files limit $FD_LIMIT allows $CAP streams through pdlb, not $STREAMS (raise the hard nofile limit for all $STREAMS)"
	N=$CAP
fi

log "building pdlb, the stub and the client"
(cd "$ROOT" && go build -o "$DIR/pdlb" ./tools/pdlb && go build -o "$DIR/stub" ./bench/proxy/stub &&
	go build -o "$DIR/client" ./bench/sse/client && go build -o "$DIR/splice" ./bench/proxy/splice)

"$DIR/stub" --listen "$STUB" 2>"$DIR/stub.log" &
started
PDLB_CMD=(serve --config bench/sse/pdlb.yaml --pod "model=bench,address=$STUB" --listen "$PDLB" --admin "$PDLB_ADMIN")
[ -n "$FRONTEND" ] && PDLB_CMD+=(--frontend "$FRONTEND")
# shellcheck disable=SC2206 # flags, split on spaces
PDLB_CMD+=(${PDLB_ARGS:-})
(cd "$ROOT" && exec "$DIR/pdlb" "${PDLB_CMD[@]}") 2>"$DIR/pdlb.log" &
PDLB_PID=$!
started
wait_port "$STUB"
wait_port "$PDLB"

us() { awk -v v="$1" 'BEGIN{printf "%.0f", v}'; }
diff_us() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.0f", b - a}'; }

# nginx's relay, measured the same way in every round, as the floor this
# machine sets: nginx with response buffering off, as SSE is proxied.
NGINX_BIN=$(command -v nginx || echo /usr/sbin/nginx)
NGINX_ROW=
if [ -x "$NGINX_BIN" ]; then
	take_port NGINX
	sed -e "s|@WORKERS@|$(nproc)|" -e "s|@DIR@|$DIR|g" -e "s|@UPSTREAM@|$STUB|" -e "s|@LISTEN@|$NGINX|" \
		-e "s|@EXTRA@|proxy_buffering off;|" "$ROOT/bench/proxy/nginx.conf.tmpl" >"$DIR/nginx.conf"
	"$NGINX_BIN" -p "$DIR" -c "$DIR/nginx.conf" 2>"$DIR/nginx.log" &
	NGINX_PID=$!
	started
	if wait_port "$NGINX"; then
		NGINX_PIDS=("$NGINX_PID" $(pgrep -P "$NGINX_PID"))
		NGINX_ROW=1
	fi
fi

# The floor: a TCP splice on pdlb's event loops (bench/proxy/splice),
# which relays the events as bytes, on the stack pdlb's gnet front end
# runs on.
start_splice SPLICE splice.log
SPLICE_PID=$SPLICED_PID
SPLICE_ROW=
wait_port "$SPLICE" && SPLICE_ROW=1

# Latency: the same moderate load directly and through the proxy, both at
# once, so the two see the same moments of the shared cores and their
# difference is what the relay adds (one after the other, a noisy second in
# either run swung the difference by hundreds of µs, below zero at times).
# lat_pair TAG URL ROUND PID... runs one round and adds its figures to
# TAG's lists: direct and through p50/p99, their differences, and the CPU
# the PIDs spent per relayed event, and the syscalls they made.
LAT_ARGS="--streams $LAT_STREAMS --events $LAT_EVENTS --interval $LAT_INTERVAL"
declare -A D50 D99 T50 T99 ADD50 ADD99 CPUEV USEREV SYSEV VCSEV ICSEV CALLSEV
lat_pair() {
	local tag=$1 url=$2 round=$3
	shift 3
	# The syscalls are counted over a run through the proxy alone before
	# the round, not over the round: perf's counter adds kernel time to
	# every call, which the round's CPU figures must not carry.
	log "round $round: $LAT_ARGS through $tag, counting its syscalls"
	syscalls_start "$@"
	"$DIR/client" --url "$url" $LAT_ARGS >"$DIR/calls-$tag-$round.txt"
	syscalls_stop
	[ -n "$SYSCALLS" ] && CALLSEV[$tag]+="$(per_req 0 "$SYSCALLS" "$(field "$DIR/calls-$tag-$round.txt" events)") "
	log "latency round $round: $LAT_ARGS, directly and through $tag at the same time"
	"$DIR/client" --url "http://$STUB$API" $LAT_ARGS >"$DIR/lat-direct-$tag-$round.txt" &
	local direct=$!
	started
	local t0 t1 k0 k1 cs0 cs1 n0 n1
	t0=$(cpu_ticks "$@") k0=$(kernel_ticks "$@") cs0=$(ctx_switches "$@") n0=$(cpu_ns "$@")
	"$DIR/client" --url "$url" $LAT_ARGS >"$DIR/lat-$tag-$round.txt"
	n1=$(cpu_ns "$@") t1=$(cpu_ticks "$@") k1=$(kernel_ticks "$@") cs1=$(ctx_switches "$@")
	wait "$direct"
	local d50 d99 p50 p99
	d50=$(field "$DIR/lat-direct-$tag-$round.txt" p50_us) d99=$(field "$DIR/lat-direct-$tag-$round.txt" p99_us)
	p50=$(field "$DIR/lat-$tag-$round.txt" p50_us) p99=$(field "$DIR/lat-$tag-$round.txt" p99_us)
	D50[$tag]+="$d50 " D99[$tag]+="$d99 " T50[$tag]+="$p50 " T99[$tag]+="$p99 "
	ADD50[$tag]+="$(diff_us "$d50" "$p50") " ADD99[$tag]+="$(diff_us "$d99" "$p99") "
	local events
	events=$(field "$DIR/lat-$tag-$round.txt" events)
	CPUEV[$tag]+="$(ns_us_per "$n0" "$n1" "$events") "
	USEREV[$tag]+="$(cpu_us_per $((t0 - k0)) $((t1 - k1)) "$events") " SYSEV[$tag]+="$(cpu_us_per "$k0" "$k1" "$events") "
	VCSEV[$tag]+="$(per_req "${cs0% *}" "${cs1% *}" "$events") " ICSEV[$tag]+="$(per_req "${cs0#* }" "${cs1#* }" "$events") "
}
# cost_cell TAG: "user µs / kernel µs / voluntary / involuntary context
# switches / syscalls" per relayed event, medians of TAG's rounds (the
# syscalls left out where perf cannot count them).
# shellcheck disable=SC2086 # lists of numbers
cost_cell() {
	local calls=
	[ -n "${CALLSEV[$1]:-}" ] && calls=" / $(median %.2f ${CALLSEV[$1]})"
	echo "$(median %.1f ${USEREV[$1]}) / $(median %.1f ${SYSEV[$1]}) / $(median %.3f ${VCSEV[$1]}) / $(median %.3f ${ICSEV[$1]})$calls"
}
# Head to head: the same load directly, through pdlb and through nginx,
# all three at once, so that pdlb's and nginx's p99 come from the same
# moments of the shared cores (each proxy's round against its own direct
# run swings by a millisecond, below zero at times, and cannot rank them).
# lat_race ROUND adds the three p99s to RACE_D99, RACE_P99 and RACE_N99.
RACE_D99= RACE_P99= RACE_N99= RACE_WON=0
lat_race() {
	log "latency round $1: $LAT_ARGS directly, through pdlb and through nginx at the same time"
	"$DIR/client" --url "http://$STUB$API" $LAT_ARGS >"$DIR/race-direct-$1.txt" &
	local direct=$!
	started
	"$DIR/client" --url "http://$NGINX$API" $LAT_ARGS >"$DIR/race-nginx-$1.txt" &
	local nginx=$!
	started
	"$DIR/client" --url "http://$PDLB$API" $LAT_ARGS >"$DIR/race-pdlb-$1.txt"
	wait "$direct" "$nginx"
	local d p n
	d=$(field "$DIR/race-direct-$1.txt" p99_us) p=$(field "$DIR/race-pdlb-$1.txt" p99_us) n=$(field "$DIR/race-nginx-$1.txt" p99_us)
	RACE_D99+="$(us "$d") " RACE_P99+="$(us "$p") " RACE_N99+="$(us "$n") "
	awk -v p="$p" -v n="$n" 'BEGIN{exit !(p <= n)}' && RACE_WON=$((RACE_WON + 1))
	return 0
}
for round in $(seq "$LAT_ROUNDS"); do
	lat_pair pdlb "http://$PDLB$API" "$round" "$PDLB_PID"
	[ -n "$NGINX_ROW" ] && lat_pair nginx "http://$NGINX$API" "$round" "${NGINX_PIDS[@]}"
	[ -n "$NGINX_ROW" ] && lat_race "$round"
	[ -n "$SPLICE_ROW" ] && lat_pair splice "http://$SPLICE$API" "$round" "$SPLICE_PID"
done
kill "$SPLICE_PID" 2>/dev/null || true
if [ -n "${NGINX_PID:-}" ]; then
	kill "$NGINX_PID" 2>/dev/null || true
	wait "$NGINX_PID" 2>/dev/null || true
fi

# Memory: idle (after the latency runs warmed pdlb up), then with N held.
sleep 1
IDLE_RSS=$(rss_kib "$PDLB_PID")
IDLE_G=$(goroutines)
IDLE_STACK=$(heap_stat Stack)
IDLE_HEAP=$(heap_stat HeapInuse)
HOLD_ARGS="--streams $N --events $HOLD_EVENTS --interval $HOLD_INTERVAL --dial-rate $DIAL_RATE"
log "holding $N streams ($HOLD_ARGS)"
"$DIR/client" --url "http://$PDLB$API" $HOLD_ARGS >"$DIR/hold.txt" 2>"$DIR/hold.log" &
CLIENT_PID=$!
started
HOLD_T0=$(cpu_ticks "$PDLB_PID")
for _ in $(seq $((N / DIAL_RATE * 10 + 300))); do
	grep -q '^open' "$DIR/hold.txt" && break
	kill -0 "$CLIENT_PID" 2>/dev/null || break
	sleep 0.2
done
read -r _ HELD HELD_FAILED < <(grep '^open' "$DIR/hold.txt" || echo "open 0 $N")
sleep 2
HOLD_RSS=$(rss_kib "$PDLB_PID")
HOLD_G=$(goroutines)
HOLD_STACK=$(heap_stat Stack)
HOLD_HEAP=$(heap_stat HeapInuse)
curl -s -o "$DIR/hold.heap.pprof" "http://$PDLB_ADMIN/debug/pprof/heap?gc=1"
HEAP_TOP=$(cd "$ROOT" && go tool pprof -sample_index=inuse_space -top -nodecount=15 "$DIR/pdlb" "$DIR/hold.heap.pprof" 2>/dev/null || true)
log "held $HELD streams (failed $HELD_FAILED); waiting for them to end"
wait "$CLIENT_PID" || true
HOLD_T1=$(cpu_ticks "$PDLB_PID")

per() { awk -v a="$1" -v b="$2" -v n="$3" -v d="$4" 'BEGIN{ if (n > 0) printf "%.1f", (b - a) / n / d }'; }
# lat_cell LIST50 LIST99: "median p50 / median p99" of a tag's rounds.
# shellcheck disable=SC2086 # lists of numbers
lat_cell() { echo "$(median %.0f $1) / $(median %.0f $2)"; }
h50=$(field "$DIR/hold.txt" p50_us) h99=$(field "$DIR/hold.txt" p99_us)
hold_events=$(field "$DIR/hold.txt" events) hold_failed=$(field "$DIR/hold.txt" failed)
first_err=$(sed -n 's/^result .*"first_error":"\([^"]*\)".*/\1/p' "$DIR/hold.txt")

CLIENT="go run ./bench/sse/client"
echo "### SSE: $N concurrent streams through pdlb, ${FRONTEND:-default} front end"
echo
echo "$(machine); open-files limit $FD_LIMIT."
echo "pdlb: \`pdlb ${PDLB_CMD[*]}\`; stub: \`go run ./bench/proxy/stub --listen $STUB\`."
echo
echo "| figure | value | target | command |"
echo "| --- | ---: | --- | --- |"
echo "| event latency direct, p50 / p99 µs | $(lat_cell "${D50[pdlb]}" "${D99[pdlb]}") | | \`$CLIENT --url http://$STUB$API $LAT_ARGS\`; median of $LAT_ROUNDS rounds |"
echo "| event latency through pdlb, p50 / p99 µs | $(lat_cell "${T50[pdlb]}" "${T99[pdlb]}") | | \`$CLIENT --url http://$PDLB$API $LAT_ARGS\`, at the same time as the row above |"
# shellcheck disable=SC2086 # lists of numbers
echo "| pdlb CPU per relayed event, µs | $(median %.2f ${CPUEV[pdlb]}) | | the time its threads ran, from /proc/PID/task/TID/schedstat, over the runs above |"
echo "| of which user / kernel µs, voluntary / involuntary context switches and syscalls per event | $(cost_cell pdlb) | | user and kernel from /proc/PID/stat's utime and stime (10 ms ticks: coarse), switches summed over /proc/PID/task/TID/status; syscalls: \`perf stat -e raw_syscalls:sys_enter -p PID\` over a run of the same load alone before each round |"
echo "| relay adds, p50 / p99 µs | $(lat_cell "${ADD50[pdlb]}" "${ADD99[pdlb]}") | ≤ 50 µs p99 | the two rows above, each round's difference; p99 per round: ${ADD99[pdlb]% } |"
if [ -n "$NGINX_ROW" ]; then
	echo "| nginx's relay adds, p50 / p99 µs | $(lat_cell "${ADD50[nginx]}" "${ADD99[nginx]}") | (reference) | p99 per round: ${ADD99[nginx]% }; direct $(lat_cell "${D50[nginx]}" "${D99[nginx]}"), through nginx $(lat_cell "${T50[nginx]}" "${T99[nginx]}"), each round right after pdlb's: \`$CLIENT --url http://$NGINX$API $LAT_ARGS\`, nginx $(nproc) workers, \`proxy_buffering off\` (bench/proxy/nginx.conf.tmpl) |"
	# shellcheck disable=SC2086
	echo "| nginx CPU per relayed event, µs | $(median %.2f ${CPUEV[nginx]}) | (reference) | its master and workers, the same way |"
	echo "| of which user / kernel µs, voluntary / involuntary context switches and syscalls per event | $(cost_cell nginx) | (reference) | the same |"
	# shellcheck disable=SC2086
	echo "| **event latency p99 head to head, through pdlb / through nginx, µs** | **$(median %.0f $RACE_P99) / $(median %.0f $RACE_N99)** | pdlb ≤ nginx | directly, through pdlb and through nginx all at once, median of $LAT_ROUNDS rounds; pdlb's p99 at or under nginx's in $RACE_WON of them; per round pdlb / nginx / direct: $(paste -d/ <(tr ' ' '\n' <<<"${RACE_P99% }") <(tr ' ' '\n' <<<"${RACE_N99% }") <(tr ' ' '\n' <<<"${RACE_D99% }") | paste -sd' ') |"
fi
if [ -n "$SPLICE_ROW" ]; then
	# shellcheck disable=SC2086
	echo "| TCP splice CPU per relayed event, µs | $(median %.2f ${CPUEV[splice]}) | (the floor) | the least a proxy on pdlb's stack (Go, lb/evloop) spends: bytes relayed unread, \`go run ./bench/proxy/splice --listen $SPLICE --upstream $STUB\` with GOMAXPROCS $SPLICE_PROCS, each round after nginx's; relay adds p50 / p99 µs $(lat_cell "${ADD50[splice]}" "${ADD99[splice]}") |"
	echo "| of which user / kernel µs, voluntary / involuntary context switches and syscalls per event | $(cost_cell splice) | (the floor) | the same |"
fi
echo "| streams held through pdlb | $HELD of $N (failed $HELD_FAILED) | 10,000 | \`$CLIENT --url http://$PDLB$API $HOLD_ARGS\` |"
echo "| event latency while holding them, p50 / p99 µs | $(us "$h50") / $(us "$h99") ($hold_events events, $hold_failed streams failed) | | same |"
echo "| pdlb CPU per relayed event while holding them, µs | $(cpu_us_per "$HOLD_T0" "$HOLD_T1" "$hold_events") | | includes opening and closing the streams |"
echo "| pdlb VmRSS idle → holding, MiB | $((IDLE_RSS / 1024)) → $((HOLD_RSS / 1024)) | | /proc/PID/status |"
echo "| **RSS per stream, KiB** | **$(per "$IDLE_RSS" "$HOLD_RSS" "$HELD" 1)** | ≤ 16 KiB | (holding − idle) / streams |"
echo "| of which goroutine stacks, KiB | $(per "$IDLE_STACK" "$HOLD_STACK" "$HELD" 1024) ($(per "$IDLE_G" "$HOLD_G" "$HELD" 1) goroutines) | | /debug/pprof/goroutine, MemStats.StackInuse |"
echo "| of which live heap, KiB | $(per "$IDLE_HEAP" "$HOLD_HEAP" "$HELD" 1024) | | MemStats.HeapInuse after GC (/debug/pprof/heap?gc=1) |"
if [ -n "$HEAP_TOP" ]; then
	echo
	echo "Live heap of pdlb holding the streams, by allocation site (\`go tool pprof -sample_index=inuse_space -top\`):"
	echo
	echo '```'
	echo "$HEAP_TOP" | sed -n '4,25p'
	echo '```'
fi
if [ -n "$first_err" ]; then
	echo
	echo "First stream error: $first_err"
fi
