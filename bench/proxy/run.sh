#!/usr/bin/env bash
# Proxy benchmark (issue 8, item 3b): wrk against a minimal fasthttp stub
# upstream directly, then through pdlb (each front end, each of two routing
# policies), nginx and HAProxy, all in one run on this machine, with the same
# 1 KB non-streaming chat completion. Prints one markdown table on stdout:
# requests/s, p50, p99, and CPU-seconds per 1,000 requests of the proxy
# process (for "direct", of the stub), with the command of each row.
# Progress goes to stderr.
#
# Knobs (environment): CONNS (64), DURATION (10s), WARMUP (3s), THREADS
# (wrk threads, 2), PROFILE (1: take a 10 s CPU profile of pdlb under the
# same load after its measured run and print its top), KEEP (1: keep the
# scratch directory with wrk outputs, logs and the profile).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/bench/proxy
CONNS=${CONNS:-64}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3s}
THREADS=${THREADS:-2}
PROFILE=${PROFILE:-1}
WORKERS=$(nproc)

NAME=proxybench
# shellcheck source=harness.sh
. "$HERE/harness.sh"
take_port STUB
take_port PDLB
take_port PDLB_ADMIN
take_port NGINX
take_port HAPROXY
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
ROWS=()
declare -A RPS P99

# measure runs wrk against addr and appends a table row. The remaining
# arguments are the PIDs whose CPU time is charged to the row.
measure() {
	local label=$1 cmd=$2 addr=$3
	shift 3
	local url=http://$addr$API out=$DIR/wrk-${label//[^a-zA-Z0-9]/_}.txt
	local status
	status=$(curl -s -o "$DIR/check.json" -w '%{http_code}' -XPOST -H 'Content-Type: application/json' \
		--data-binary '{"model":"bench","messages":[{"role":"user","content":"hi"}]}' "$url" || true)
	if [ "$status" != 200 ]; then
		log "$label answers $status, not 200: $(head -c 300 "$DIR/check.json")"
		ROWS+=("| $label | failed: HTTP $status | | | | | \`$cmd\` |")
		return
	fi
	log "$label: warm-up $WARMUP, then $DURATION"
	(cd "$ROOT" && wrk -t"$THREADS" -c"$CONNS" -d"$WARMUP" -s bench/proxy/post.lua "$url" >/dev/null)
	local t0 t1
	t0=$(cpu_ticks "$@")
	(cd "$ROOT" && wrk $WRK_ARGS "$url" >"$out")
	t1=$(cpu_ticks "$@")
	local rps reqs p50 p99 bad sockerr cpu
	rps=$(awk '/^Requests\/sec:/{printf "%.0f", $2}' "$out")
	reqs=$(awk '/requests in/{print $1}' "$out")
	p50=$(to_ms "$(awk '$1=="50%"{print $2}' "$out")")
	p99=$(to_ms "$(awk '$1=="99%"{print $2}' "$out")")
	bad=$(awk '/Non-2xx/{print $NF}' "$out")
	sockerr=$(awk '/Socket errors/{print}' "$out")
	cpu=$(awk -v us="$(cpu_us_per "$t0" "$t1" "$reqs")" 'BEGIN{printf "%.3f", us / 1000}')
	RPS[$label]=$rps
	P99[$label]=$p99
	local note=
	[ -n "$bad" ] && note=" ($bad non-2xx)"
	[ -n "$sockerr" ] && note="$note ($sockerr)"
	ROWS+=("| $label | $rps$note | $p50 | $p99 | $cpu | @RATIO:$label@ | \`$cmd\` |")
}

# stop ends one process this script started and waits for it.
stop() {
	kill "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

# profile_pdlb takes a 10 s CPU profile from pdlb's admin listener while wrk
# runs the same load, and keeps the top of it for the report.
profile_pdlb() {
	local label=$1
	log "$label: 10 s CPU profile under load"
	(cd "$ROOT" && wrk -t"$THREADS" -c"$CONNS" -d12s -s bench/proxy/post.lua "http://$PDLB$API" >/dev/null) &
	local wrk_pid=$!
	sleep 1
	curl -s -o "$DIR/pdlb.cpu.pprof" "http://$PDLB_ADMIN/debug/pprof/profile?seconds=10"
	wait "$wrk_pid"
	PROFILE_TOP=$(cd "$ROOT" && go tool pprof -top -nodecount=35 "$DIR/pdlb" "$DIR/pdlb.cpu.pprof" 2>/dev/null)
	PROFILE_CUM=$(cd "$ROOT" && go tool pprof -top -cum -nodecount=35 "$DIR/pdlb" "$DIR/pdlb.cpu.pprof" 2>/dev/null)
	PROFILE_LABEL=$label
}

# run_pdlb measures pdlb with one front end and one policy.
run_pdlb() {
	local frontend=$1 policy=$2 args=(serve --pod "model=bench,address=$STUB" --listen "$PDLB" --admin "$PDLB_ADMIN")
	[ "$policy" = least_request ] && args+=(--config bench/proxy/least_request.yaml)
	args+=(--frontend "$frontend")
	local label="pdlb $frontend, $policy"
	(cd "$ROOT" && exec "$DIR/pdlb" "${args[@]}") 2>"$DIR/pdlb-$frontend-$policy.log" &
	local pid=$!
	started
	if ! wait_port "$PDLB"; then
		ROWS+=("| $label | failed to start: $(tail -1 "$DIR/pdlb-$frontend-$policy.log") | | | | | |")
		return
	fi
	measure "$label" "pdlb ${args[*]}" "$PDLB" "$pid"
	# The default front end and policy.
	if [ "$PROFILE" = 1 ] && [ "$frontend" = gnet ] && [ "$policy" = slo_cache ]; then
		profile_pdlb "$label"
	fi
	stop "$pid"
}

install_missing
command -v wrk >/dev/null || { log "wrk is required"; exit 1; }
log "building pdlb and the stub"
(cd "$ROOT" && go build -o "$DIR/pdlb" ./tools/pdlb && go build -o "$DIR/stub" ./bench/proxy/stub)

"$DIR/stub" --listen "$STUB" 2>"$DIR/stub.log" &
STUB_PID=$!
started
wait_port "$STUB"

measure direct "stub --listen $STUB" "$STUB" "$STUB_PID"

for policy in slo_cache least_request; do
	run_pdlb gnet "$policy"
	run_pdlb fasthttp "$policy"
done

NGINX_BIN=$(command -v nginx || echo /usr/sbin/nginx)
if [ -x "$NGINX_BIN" ]; then
	sed -e "s|@WORKERS@|$WORKERS|" -e "s|@DIR@|$DIR|g" -e "s|@UPSTREAM@|$STUB|" -e "s|@LISTEN@|$NGINX|" -e "s|@EXTRA@||" \
		"$HERE/nginx.conf.tmpl" >"$DIR/nginx.conf"
	"$NGINX_BIN" -p "$DIR" -c "$DIR/nginx.conf" 2>"$DIR/nginx.log" &
	NGINX_PID=$!
	started
	# The master and its workers: the workers do the proxying.
	if wait_port "$NGINX"; then
		measure nginx "nginx -c nginx.conf  # bench/proxy/nginx.conf.tmpl, $WORKERS workers" "$NGINX" \
			"$NGINX_PID" $(pgrep -P "$NGINX_PID")
	else
		ROWS+=("| nginx | failed to start: $(tail -1 "$DIR/nginx.log") | | | | | |")
	fi
	stop "$NGINX_PID"
else
	ROWS+=("| nginx | not installed | | | | | |")
fi

HAPROXY_BIN=$(command -v haproxy || echo /usr/sbin/haproxy)
if [ -x "$HAPROXY_BIN" ]; then
	sed -e "s|@WORKERS@|$WORKERS|" -e "s|@UPSTREAM@|$STUB|" -e "s|@LISTEN@|$HAPROXY|" \
		"$HERE/haproxy.cfg.tmpl" >"$DIR/haproxy.cfg"
	"$HAPROXY_BIN" -db -f "$DIR/haproxy.cfg" 2>"$DIR/haproxy.log" &
	HAPROXY_PID=$!
	started
	if wait_port "$HAPROXY"; then
		measure haproxy "haproxy -db -f haproxy.cfg  # bench/proxy/haproxy.cfg.tmpl, $WORKERS threads" "$HAPROXY" "$HAPROXY_PID"
	else
		ROWS+=("| haproxy | failed to start: $(tail -1 "$DIR/haproxy.log") | | | | | |")
	fi
	stop "$HAPROXY_PID"
else
	ROWS+=("| haproxy | not installed | | | | | |")
fi

# The report. Ratios are against the direct row of this same run.
direct=${RPS[direct]:-0}
ratio() { awk -v a="${1:-0}" -v b="$2" 'BEGIN{ if (b > 0 && a > 0) printf "%.2f", a / b }'; }
echo "### Proxy: 1 KB chat completion, wrk $CONNS connections, $DURATION after $WARMUP warm-up"
echo
echo "$(machine); $(wrk -v 2>&1 | head -1 | awk '{print $1, $2}'), nginx $("$NGINX_BIN" -v 2>&1 | sed 's|.*/||'), HAProxy $("$HAPROXY_BIN" -v 2>/dev/null | awk 'NR==1{print $3}')."
echo
echo "Load: \`wrk $WRK_ARGS http://ADDR$API\` (ADDR: the row's listener); the stub is \`go run ./bench/proxy/stub\`."
echo
echo "| target | requests/s | p50 ms | p99 ms | CPU-s / 1k req | × direct | command |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | --- |"
for row in "${ROWS[@]}"; do
	if [[ $row =~ @RATIO:([^@]*)@ ]]; then
		row=${row/"${BASH_REMATCH[0]}"/$(ratio "${RPS[${BASH_REMATCH[1]}]}" "$direct")}
	fi
	echo "$row"
done

# The issue's targets, from this run's numbers.
best_pdlb=0 best_label=
for k in "${!RPS[@]}"; do
	if [[ $k == pdlb* ]] && [ "${RPS[$k]}" -gt "$best_pdlb" ]; then
		best_pdlb=${RPS[$k]} best_label=$k
	fi
done
best_other=$(( ${RPS[nginx]:-0} > ${RPS[haproxy]:-0} ? ${RPS[nginx]:-0} : ${RPS[haproxy]:-0} ))
if [ "$best_pdlb" -gt 0 ] && [ "$best_other" -gt 0 ]; then
	echo
	echo "Targets (best pdlb row: $best_label): RPS $(ratio "$best_pdlb" "$best_other")× the better of nginx and HAProxy (target ≥ 1.2),"\
		"$(ratio "$best_pdlb" "$direct")× direct (target ≥ 0.5); p99 ${P99[$best_label]} ms vs nginx ${P99[nginx]:-?} ms (target ≤)."
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
