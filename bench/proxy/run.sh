#!/usr/bin/env bash
# Proxy benchmark (issue 8, item 3b): wrk against a minimal fasthttp stub
# upstream directly, then through pdlb (each front end, each of two routing
# policies), nginx, HAProxy and a TCP splice on pdlb's event loops
# (bench/proxy/splice: the floor of pdlb's stack), all in one run on this
# machine, with the same 1 KB non-streaming chat completion. Every target runs from the start; the
# measurements go round the targets ROUNDS times, so a burst of load from
# the machine's neighbours lands on one target's sample, not its figure.
# Prints one markdown table on stdout: per target the median over the rounds
# of requests/s (with the lowest and highest), p50, p99, and CPU-seconds per
# 1,000 requests of the proxy process (for "direct", of the stub) and the
# kernel's part of them, with the command of each row; then the issue's
# targets and the most any proxy with pdlb's kernel work could serve here.
# Progress goes to stderr.
#
# Knobs (environment): CONNS (64), ROUNDS (3), DURATION (6s per sample),
# WARMUP (1s before each: every target runs from the start, so only the
# first round's warm-up warms it; the others set it apart from the target
# before and count its syscalls, a steady ratio at tens of thousands of
# requests a second), THREADS (wrk threads, 2), PROFILE (1: take a 10 s
# CPU profile of pdlb under the same load after the rounds and print its
# top), KEEP (1: keep the scratch directory with wrk outputs, logs and the
# profile), BASE (a git revision: pdlb built from it runs beside this tree's
# on both front ends, its rows measured in the same rounds, for a before
# and after of a change), ENVS (space-separated environments, each
# VAR=VALUE[,VAR=VALUE...]: one more gnet slo_cache row per environment,
# pdlb run with it, e.g. ENVS=GOMAXPROCS=1 for one event loop), QUICK (1:
# only direct, pdlb gnet slo_cache (and BASE's), nginx, HAProxy and the
# splice, for a before and after in a third of the time).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/bench/proxy
CONNS=${CONNS:-64}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-6s}
WARMUP=${WARMUP:-1s}
THREADS=${THREADS:-2}
PROFILE=${PROFILE:-1}
QUICK=${QUICK:-}
BASE=${BASE:-}
WORKERS=$(nproc)

NAME=proxybench
SPLICE_ROW="TCP splice on pdlb's loops (no HTTP)"
# shellcheck source=harness.sh
. "$HERE/harness.sh"
take_port STUB
take_port NGINX
take_port HAPROXY
take_port SINK
API=/v1/chat/completions

# install_missing installs wrk, nginx and HAProxy from Debian's packages
# when they are missing; nginx-light is nginx without modules the benchmark
# does not use.
install_missing() {
	local pkgs=()
	command -v wrk >/dev/null || pkgs+=(wrk)
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || pkgs+=(nginx-light)
	command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || pkgs+=(haproxy)
	[ ${#pkgs[@]} -eq 0 ] && return
	log "installing ${pkgs[*]}"
	local sudo=
	[ "$(id -u)" = 0 ] || sudo=sudo
	# policy-rc.d in containers keeps the packages' services from starting;
	# where they do start, they listen on :80, not on our ports.
	$sudo apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${pkgs[@]}" >&2 ||
		log "WARNING: could not install ${pkgs[*]}; their rows will say so"
}

# to_ms converts a wrk duration (850.00us, 1.23ms, 1.02s) to milliseconds.
to_ms() {
	echo "$1" | awk '{
		v = $1 + 0
		if ($1 ~ /us$/) v /= 1000
		else if ($1 ~ /ms$/) v = v
		else if ($1 ~ /m$/) v *= 60000
		else if ($1 ~ /s$/) v *= 1000
		printf "%.3f", v }'
}

WRK_ARGS="-t$THREADS -c$CONNS -d$DURATION --latency -s bench/proxy/post.lua"
# The targets in the order each round measures them: label, command, address,
# the PIDs whose CPU time is charged to the row.
LABELS=()
declare -A CMD ADDR CHARGED FAILED
# One value per round: requests/s, p50 and p99 (ms), µs per request of the
# charged processes' kernel and user time and of the whole machine's busy
# time, the charged processes' voluntary and involuntary context switches
# and syscalls per request, and a note (errors seen).
declare -A RPS_S P50_S P99_S SYS_US_S USER_US_S BUSY_US_S VCS_S ICS_S SYSCALLS_S NOTE
# The medians the report and the targets use.
declare -A RPS P99

# target registers a started target; failed makes a row that says why not.
target() {
	local label=$1
	LABELS+=("$label")
	CMD[$label]=$2 ADDR[$label]=$3
	shift 3
	CHARGED[$label]="$*"
}
failed() {
	LABELS+=("$1")
	FAILED[$1]=$2
}

# check sends one request and fails the target unless it answers 200.
check() {
	local label=$1 status
	status=$(curl -s -o "$DIR/check.json" -w '%{http_code}' -XPOST -H 'Content-Type: application/json' \
		--data-binary '{"model":"bench","messages":[{"role":"user","content":"hi"}]}' "http://${ADDR[$label]}$API" || true)
	if [ "$status" != 200 ]; then
		log "$label answers $status, not 200: $(head -c 300 "$DIR/check.json")"
		FAILED[$label]="failed: HTTP $status"
	fi
}

# sample runs wrk once against a target and adds the round's values.
sample() {
	local label=$1 round=$2
	local url=http://${ADDR[$label]}$API out=$DIR/wrk-${label//[^a-zA-Z0-9]/_}-$round.txt
	log "round $round, $label: warm-up $WARMUP, then $DURATION"
	# The warm-up's syscalls are counted, not the sample's: perf's counter
	# adds kernel time to every call, which the sample's CPU figures must
	# not carry.
	# shellcheck disable=SC2086 # a list of PIDs
	syscalls_start ${CHARGED[$label]}
	(cd "$ROOT" && wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" -s bench/proxy/post.lua "$url" >"$out.warmup")
	syscalls_stop
	[ -n "$SYSCALLS" ] && SYSCALLS_S[$label]+="$(per_req 0 "$SYSCALLS" "$(awk '/requests in/{print $1}' "$out.warmup")") "
	local t0 t1 k0 k1 b0 b1 cs0 cs1
	# shellcheck disable=SC2086 # a list of PIDs
	t0=$(cpu_ticks ${CHARGED[$label]}) k0=$(kernel_ticks ${CHARGED[$label]}) b0=$(busy_ticks) cs0=$(ctx_switches ${CHARGED[$label]})
	(cd "$ROOT" && wrk $WRK_ARGS "$url" >"$out")
	# shellcheck disable=SC2086
	t1=$(cpu_ticks ${CHARGED[$label]}) k1=$(kernel_ticks ${CHARGED[$label]}) b1=$(busy_ticks) cs1=$(ctx_switches ${CHARGED[$label]})
	local reqs bad sockerr
	reqs=$(awk '/requests in/{print $1}' "$out")
	VCS_S[$label]+="$(per_req "${cs0% *}" "${cs1% *}" "$reqs") "
	ICS_S[$label]+="$(per_req "${cs0#* }" "${cs1#* }" "$reqs") "
	SYS_US_S[$label]+="$(cpu_us_per "$k0" "$k1" "$reqs") "
	USER_US_S[$label]+="$(cpu_us_per $((t0 - k0)) $((t1 - k1)) "$reqs") "
	BUSY_US_S[$label]+="$(cpu_us_per "$b0" "$b1" "$reqs") "
	RPS_S[$label]+="$(awk '/^Requests\/sec:/{printf "%.0f", $2}' "$out") "
	P50_S[$label]+="$(to_ms "$(awk '$1=="50%"{print $2}' "$out")") "
	P99_S[$label]+="$(to_ms "$(awk '$1=="99%"{print $2}' "$out")") "
	bad=$(awk '/Non-2xx/{print $NF}' "$out")
	sockerr=$(awk '/Socket errors/{print}' "$out")
	[ -n "$bad" ] && NOTE[$label]+=" (round $round: $bad non-2xx)"
	[ -n "$sockerr" ] && NOTE[$label]+=" (round $round: $sockerr)"
	return 0
}

# profile_pdlb takes a 10 s CPU profile from a pdlb's admin listener while
# wrk runs the same load, and keeps the top of it for the report; then,
# under the same load again, the off-CPU view: 5 s of perf's
# sched:sched_switch samples with stacks, folded by offcpu.awk into where
# pdlb's threads slept (each a voluntary switch, a wake-up to come) or were
# preempted, per request served meanwhile.
profile_pdlb() {
	local label=$1 admin=$2 url=http://${ADDR[$1]}$API
	log "$label: 10 s CPU profile under load"
	(cd "$ROOT" && wrk -t"$THREADS" -c"$CONNS" -d12s -s bench/proxy/post.lua "$url" >/dev/null) &
	local wrk_pid=$!
	sleep 1
	curl -s -o "$DIR/pdlb.cpu.pprof" "http://$admin/debug/pprof/profile?seconds=10"
	wait "$wrk_pid"
	if [ -n "$PERF_OK" ]; then
		log "$label: 5 s of context switches under load"
		(cd "$ROOT" && wrk -t"$THREADS" -c"$CONNS" -d7s -s bench/proxy/post.lua "$url" >"$DIR/wrk-offcpu.txt") &
		wrk_pid=$!
		sleep 1
		# shellcheck disable=SC2086 # a list of PIDs
		perf record -q -e sched:sched_switch -g -p "$(echo ${CHARGED[$label]} | tr ' ' ',')" -o "$DIR/sched.data" -- sleep 5 2>/dev/null || true
		wait "$wrk_pid"
		local rps
		rps=$(awk '/^Requests\/sec:/{print $2}' "$DIR/wrk-offcpu.txt")
		OFFCPU_TOP=$(perf script -i "$DIR/sched.data" 2>/dev/null | awk -f "$HERE/offcpu.awk" | sort -rn | sed -n 1,15p |
			awk -v n="$(awk -v r="$rps" 'BEGIN{print r * 5}')" '{printf "%7d %6.3f/req  %s\n", $1, (n > 0 ? $1 / n : 0), substr($0, index($0, $2))}')
	fi
	PROFILE_TOP=$(cd "$ROOT" && go tool pprof -top -nodecount=35 "$DIR/pdlb" "$DIR/pdlb.cpu.pprof" 2>/dev/null)
	PROFILE_CUM=$(cd "$ROOT" && go tool pprof -top -cum -nodecount=35 "$DIR/pdlb" "$DIR/pdlb.cpu.pprof" 2>/dev/null)
	PROFILE_LABEL=$label
}

# start_pdlb starts pdlb with one front end and one policy, on ports of its
# own, and with "access" as a third argument its access log on (to a file
# in the scratch directory), with a fourth the binary (pdlb-base for BASE's)
# and with a fifth a note for its label; EXTRA_ENV (VAR=VALUE words) is
# added to its environment, EXTRA_ARGS (words) to its flags. The default front end and policy's admin
# address goes in PROFILED_ADMIN.
start_pdlb() {
	local frontend=$1 policy=$2 access=${3:-} bin=${4:-pdlb} note=${5:-} listen admin
	take_port listen
	take_port admin
	local args=(serve --pod "model=bench,address=$STUB" --listen "$listen" --admin "$admin")
	[ "$policy" = least_request ] && args+=(--config bench/proxy/least_request.yaml)
	args+=(--frontend "$frontend")
	local label="pdlb $frontend, $policy" name=$frontend-$policy
	if [ -n "$access" ]; then
		args+=(--access-log "$DIR/access.log")
		label+=", access log"
		name+=-access
	fi
	if [ "$bin" != pdlb ]; then
		label+=" (base $BASE)"
		name+=-base
	fi
	[ -z "$note" ] || { label+=", $note"; name+=-${note//[^a-z0-9]/}; }
	# shellcheck disable=SC2206 # flags, one a word
	args+=(${EXTRA_ARGS:-})
	# shellcheck disable=SC2086 # one word per variable
	(cd "$ROOT" && exec env ${EXTRA_ENV:-} "$DIR/$bin" "${args[@]}") 2>"$DIR/pdlb-$name.log" &
	local pid=$!
	started
	if ! wait_port "$listen"; then
		failed "$label" "failed to start: $(tail -1 "$DIR/pdlb-$name.log")"
		return
	fi
	target "$label" "pdlb ${args[*]}" "$listen" "$pid"
	if [ "$frontend" = gnet ] && [ "$policy" = slo_cache ] && [ -z "$access" ] && [ "$bin" = pdlb ] && [ -z "$note" ]; then
		PROFILED_ADMIN=$admin
	fi
}

install_missing
command -v wrk >/dev/null || { log "wrk is required"; exit 1; }
log "building pdlb and the stub"
(cd "$ROOT" && go build -o "$DIR/pdlb" ./tools/pdlb && go build -o "$DIR/stub" ./bench/proxy/stub && go build -o "$DIR/otlpsink" ./bench/proxy/otlpsink &&
	go build -o "$DIR/splice" ./bench/proxy/splice)
if [ -n "$BASE" ]; then
	log "building pdlb at $BASE"
	(cd "$ROOT" && git worktree add -q --detach "$DIR/base" "$BASE" &&
		(cd "$DIR/base" && go build -o "$DIR/pdlb-base" ./tools/pdlb); status=$?
		git worktree remove --force "$DIR/base"; exit $status)
fi

"$DIR/stub" --listen "$STUB" 2>"$DIR/stub.log" &
STUB_PID=$!
started
wait_port "$STUB"
target direct "stub --listen $STUB" "$STUB" "$STUB_PID"

if [ -n "$QUICK" ]; then
	start_pdlb gnet slo_cache
	[ -z "$BASE" ] || start_pdlb gnet slo_cache "" pdlb-base
else
	for policy in slo_cache least_request; do
		start_pdlb gnet "$policy"
		start_pdlb fasthttp "$policy"
	done
	if [ -n "$BASE" ]; then
		start_pdlb gnet slo_cache "" pdlb-base
		start_pdlb fasthttp slo_cache "" pdlb-base
	fi
fi
for env in ${ENVS:-}; do
	EXTRA_ENV=${env//,/ } start_pdlb gnet slo_cache "" pdlb "$env"
done
if [ -z "$QUICK" ]; then
	# What io_uring's batches save: a system call per send and receive.
	EXTRA_ARGS=--io-uring=false start_pdlb gnet slo_cache "" pdlb "io_uring off"
	# What the access log costs (nginx and HAProxy run without one).
	start_pdlb gnet slo_cache access
	# What tracing costs: spans to a local OTLP sink that drops them
	# (bench/proxy/otlpsink), 1% and 100% of requests sampled.
	"$DIR/otlpsink" --listen "$SINK" 2>"$DIR/otlpsink.log" &
	started
	wait_port "$SINK"
	for pct in 1 100; do
		OTEL_TRACES_EXPORTER=otlp OTEL_EXPORTER_OTLP_ENDPOINT=http://$SINK OTEL_TRACES_SAMPLER=traceidratio \
			OTEL_TRACES_SAMPLER_ARG=$(awk -v p="$pct" 'BEGIN{print p / 100}') start_pdlb gnet slo_cache "" pdlb "tracing $pct%"
	done
fi

NGINX_BIN=$(command -v nginx || echo /usr/sbin/nginx)
if [ -x "$NGINX_BIN" ]; then
	sed -e "s|@WORKERS@|$WORKERS|" -e "s|@DIR@|$DIR|g" -e "s|@UPSTREAM@|$STUB|" -e "s|@LISTEN@|$NGINX|" -e "s|@EXTRA@||" \
		"$HERE/nginx.conf.tmpl" >"$DIR/nginx.conf"
	"$NGINX_BIN" -p "$DIR" -c "$DIR/nginx.conf" 2>"$DIR/nginx.log" &
	NGINX_PID=$!
	started
	# The master and its workers: the workers do the proxying.
	if wait_port "$NGINX"; then
		target nginx "nginx -c nginx.conf  # bench/proxy/nginx.conf.tmpl, $WORKERS workers" "$NGINX" \
			"$NGINX_PID" $(pgrep -P "$NGINX_PID")
	else
		failed nginx "failed to start: $(tail -1 "$DIR/nginx.log")"
	fi
else
	failed nginx "not installed"
fi

HAPROXY_BIN=$(command -v haproxy || echo /usr/sbin/haproxy)
if [ -x "$HAPROXY_BIN" ]; then
	sed -e "s|@WORKERS@|$WORKERS|" -e "s|@UPSTREAM@|$STUB|" -e "s|@LISTEN@|$HAPROXY|" \
		"$HERE/haproxy.cfg.tmpl" >"$DIR/haproxy.cfg"
	"$HAPROXY_BIN" -db -f "$DIR/haproxy.cfg" 2>"$DIR/haproxy.log" &
	HAPROXY_PID=$!
	started
	if wait_port "$HAPROXY"; then
		target haproxy "haproxy -db -f haproxy.cfg  # bench/proxy/haproxy.cfg.tmpl, $WORKERS threads" "$HAPROXY" "$HAPROXY_PID"
	else
		failed haproxy "failed to start: $(tail -1 "$DIR/haproxy.log")"
	fi
else
	failed haproxy "not installed"
fi

# splice starts bench/proxy/splice with FLAGS as the target ROW, logging to
# LOG in the scratch directory: splice ROW LOG [FLAGS...].
splice() {
	local row=$1 log=$2 addr
	shift 2
	start_splice addr "$log" "$@"
	if wait_port "$addr"; then
		target "$row" "splice ${*:+$* }--listen $addr --upstream $STUB  # bench/proxy/splice, GOMAXPROCS $SPLICE_PROCS" "$addr" "$SPLICED_PID"
	else
		failed "$row" "failed to start: $(tail -1 "$DIR/$log")"
	fi
}
# The floor: what the stack pdlb's gnet front end runs on (Go, lb/evloop,
# the kernel) costs a request that passes through with no HTTP read at all.
splice "$SPLICE_ROW" splice.log

for label in "${LABELS[@]}"; do
	[ -z "${FAILED[$label]:-}" ] && check "$label"
done
for round in $(seq "$ROUNDS"); do
	for label in "${LABELS[@]}"; do
		[ -z "${FAILED[$label]:-}" ] && sample "$label" "$round"
	done
done
if [ "$PROFILE" = 1 ] && [ -n "${PROFILED_ADMIN:-}" ]; then
	profile_pdlb "pdlb gnet, slo_cache" "$PROFILED_ADMIN"
fi

# The report: medians over the rounds; ratios against the direct row's.
ROWS=()
for label in "${LABELS[@]}"; do
	if [ -n "${FAILED[$label]:-}" ]; then
		ROWS+=("| $label | ${FAILED[$label]} | | | | | | | | | | \`${CMD[$label]:-}\` |")
		continue
	fi
	# shellcheck disable=SC2086 # lists of numbers
	{
		RPS[$label]=$(median %.0f ${RPS_S[$label]})
		P99[$label]=$(median %.3f ${P99_S[$label]})
		row_calls=
		[ -n "${SYSCALLS_S[$label]:-}" ] && row_calls=$(median %.1f ${SYSCALLS_S[$label]})
		ROWS+=("| $label | ${RPS[$label]}${NOTE[$label]:-} | $(lowest ${RPS_S[$label]})–$(highest ${RPS_S[$label]}) | $(median %.3f ${P50_S[$label]}) | ${P99[$label]} | $(median %.1f ${USER_US_S[$label]}) | $(median %.1f ${SYS_US_S[$label]}) | $(median %.3f ${VCS_S[$label]}) | $(median %.3f ${ICS_S[$label]}) | $row_calls | @RATIO:$label@ | \`${CMD[$label]}\` |")
	}
done
direct=${RPS[direct]:-0}
if [ -n "$PERF_OK" ]; then
	SYSCALL_SOURCE="\`perf stat -e raw_syscalls:sys_enter -p PIDS\` over each round's warm-up, not its sample, since the counter adds kernel time to every call"
else
	SYSCALL_SOURCE="none: perf's raw_syscalls:sys_enter does not count here"
fi
ratio() { awk -v a="${1:-0}" -v b="$2" 'BEGIN{ if (b > 0 && a > 0) printf "%.2f", a / b }'; }
echo "### Proxy: 1 KB chat completion, wrk $CONNS connections, median of $ROUNDS rounds of $DURATION (each after $WARMUP of warm-up)"
echo
echo "$(machine); $(wrk -v 2>&1 | head -1 | awk '{print $1, $2}'), nginx $("$NGINX_BIN" -v 2>&1 | sed 's|.*/||'), HAProxy $("$HAPROXY_BIN" -v 2>/dev/null | awk 'NR==1{print $3}')."
echo
echo "Load: \`wrk $WRK_ARGS http://ADDR$API\` (ADDR: the row's listener); the stub is \`go run ./bench/proxy/stub\`. Each round measures every target in the order below."
echo
echo "Per request, of the row's process (for \"direct\", the stub's; nginx's master and workers): user and kernel CPU µs (/proc/PID/stat), voluntary and involuntary context switches (every thread's /proc/PID/task/TID/status), and syscalls ($SYSCALL_SOURCE)."
echo
echo "| target | requests/s | lowest–highest | p50 ms | p99 ms | user µs | kernel µs | vol. cs | invol. cs | syscalls | × direct | command |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
for row in "${ROWS[@]}"; do
	if [[ $row =~ @RATIO:([^@]*)@ ]]; then
		row=${row/"${BASH_REMATCH[0]}"/$(ratio "${RPS[${BASH_REMATCH[1]}]}" "$direct")}
	fi
	echo "$row"
done

# The issue's targets, from this run's numbers.
best_pdlb=0 best_label=
for k in "${!RPS[@]}"; do
	if [[ $k == pdlb* && $k != *"access log" && $k != *"(base "* && $k != *tracing* && $k != *=* ]] && [ "${RPS[$k]}" -gt "$best_pdlb" ]; then
		best_pdlb=${RPS[$k]} best_label=$k
	fi
done
best_other=$(( ${RPS[nginx]:-0} > ${RPS[haproxy]:-0} ? ${RPS[nginx]:-0} : ${RPS[haproxy]:-0} ))
if [ "$best_pdlb" -gt 0 ] && [ "$best_other" -gt 0 ]; then
	echo
	echo "Targets (best pdlb row: $best_label): RPS $(ratio "$best_pdlb" "$best_other")× the better of nginx and HAProxy (target ≥ 1.2),"\
		"$(ratio "$best_pdlb" "$direct")× direct (target ≥ 0.5); p99 ${P99[$best_label]} ms vs nginx ${P99[nginx]:-?} ms (target ≤)."
fi
# ceiling prints, per round of a target, the requests/s a proxy would serve
# that made the target's kernel work in no user time at all: the same
# machine busy time per request less the target's own user time, the
# machine as saturated (requests/s × busy / (busy − user)); the median.
ceiling() {
	# shellcheck disable=SC2086 # lists of numbers
	median %.0f $(paste -d' ' <(printf '%s\n' ${RPS_S[$1]}) <(printf '%s\n' ${BUSY_US_S[$1]}) <(printf '%s\n' ${USER_US_S[$1]}) |
		awk '$2 > $3 {printf "%.0f\n", $1 * $2 / ($2 - $3)}')
}
if [ "$best_pdlb" -gt 0 ] && [ "$best_other" -gt 0 ]; then
	# shellcheck disable=SC2086 # lists of numbers
	{
		busy=$(median %.1f ${BUSY_US_S[$best_label]}) user=$(median %.1f ${USER_US_S[$best_label]})
		most=$(ceiling "$best_label")
	}
	echo
	echo "What this machine allows: through $best_label its cores were busy $busy µs per request, $user µs of it pdlb's user time;"\
		"the rest is the kernel's socket work (the proxy's own $(median %.1f ${SYS_US_S[$best_label]}) µs), wrk's and the stub's."\
		"A proxy that made the same socket calls in no user time at all would serve about $most requests/s here"\
		"($(ratio "$most" "$best_other")× the better of nginx and HAProxy; requests/s × busy / (busy − user), median of the rounds)."
	if [ -n "${USER_US_S[nginx]:-}" ]; then
		# shellcheck disable=SC2086
		echo "nginx, the same way: $(median %.1f ${USER_US_S[nginx]}) µs of user time and $(median %.1f ${SYS_US_S[nginx]}) µs of kernel time per request; with no user time it would serve about $(ceiling nginx) requests/s."
	fi
fi
if [ "$best_pdlb" -gt 0 ] && [ -n "${USER_US_S[$SPLICE_ROW]:-}" ]; then
	# shellcheck disable=SC2086 # lists of numbers
	{
		floor=$(median %.1f ${USER_US_S[$SPLICE_ROW]}) user=$(median %.1f ${USER_US_S[$best_label]})
	}
	echo
	echo "The stack's floor: a request through the TCP splice on pdlb's loops cost $floor µs of user time, against $user µs through $best_label:"\
		"$(awk -v a="$user" -v b="$floor" 'BEGIN{printf "%.1f", a - b}') µs of it are pdlb's own work (parsing, routing, relaying), the rest the Go runtime's, the loops' and the socket calls'."
	if [ -n "${USER_US_S[nginx]:-}" ]; then
		# shellcheck disable=SC2086
		echo "nginx's whole user time was $(median %.1f ${USER_US_S[nginx]}) µs a request: pdlb's user time meets it with its own work at $(awk -v n="$(median %.1f ${USER_US_S[nginx]})" -v b="$floor" 'BEGIN{printf "%.1f", n - b}') µs or less."
	fi
fi
logged=${RPS["pdlb gnet, slo_cache, access log"]:-0} unlogged=${RPS["pdlb gnet, slo_cache"]:-0}
if [ "$logged" -gt 0 ] && [ "$unlogged" -gt 0 ]; then
	echo
	echo "The access log: pdlb gnet, slo_cache with it makes $(ratio "$logged" "$unlogged")× the requests/s of without ($(wc -l <"$DIR/access.log") lines written)."
fi
if [ -n "${PROFILE_TOP:-}" ]; then
	echo
	echo "CPU profile of $PROFILE_LABEL under the same load (10 s, \`go tool pprof -top\`):"
	echo
	echo '```'
	echo "$PROFILE_TOP" | sed -n '1,45p'
	echo '```'
	echo
	echo "By cumulative time (\`-top -cum\`):"
	echo
	echo '```'
	echo "$PROFILE_CUM" | sed -n '6,45p'
	echo '```'
fi
if [ -n "${OFFCPU_TOP:-}" ]; then
	echo
	echo "Off CPU: where $PROFILE_LABEL's threads left their cores under the same load (5 s of \`perf record -e sched:sched_switch -g\`, bench/proxy/offcpu.awk; count, per request, blocked or preempted, innermost frames):"
	echo
	echo '```'
	echo "$OFFCPU_TOP"
	echo '```'
fi
