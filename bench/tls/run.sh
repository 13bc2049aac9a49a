#!/usr/bin/env bash
# TLS and HTTP/2 benchmark (issue 27): pdlb (each front end) and nginx
# terminating TLS in front of the proxy benchmark's stub, in one run on
# this machine, with the same ECDSA P-256 certificate, TLS 1.3,
# TLS_AES_128_GCM_SHA256 and X25519. Rows per target:
#   - HTTPS keep-alive requests/s: wrk, THREADS threads, CONNS connections,
#     the proxy benchmark's 1 KB chat completion (HTTP/1.1 over TLS);
#   - new handshakes/s: the same with "Connection: close", so each request
#     is a new connection and a new handshake; wrk keeps one SSL object a
#     connection slot (SSL_clear keeps its session), so each resumes the
#     last session by its ticket (every target issues tickets): PSK with
#     a fresh X25519 exchange, no certificate and no signature (a perf
#     profile of pdlb under this load has no ECDSA signing in it);
#   - full handshakes/s: FULL_CLIENTS `openssl s_time -new` at once, each
#     a new connection and a full handshake after another (no session
#     offered: the certificate sent and signed for), no request;
#   - h2 requests/s: h2load, H2_CLIENTS connections with H2_STREAMS
#     streams each, the same body;
#   - SSE over h2: h2load streams of SSE_EVENTS events, no gap between
#     them, events/s;
#   - keep-alive latency under a handshake storm (STORM=1): 8 HTTPS
#     keep-alive connections sending the body every 5 ms each
#     (bench/tls/latency), alone and then while FULL_CLIENTS `openssl
#     s_time -new` make full handshakes: what handshakes on the server's
#     event loops cost the connections already open.
# Targets take turns per row, ROUNDS times; each cell is the median of the
# rounds, so a burst of load from the machine's neighbours moves one round,
# not one target; five, as a row moved 10-20% between runs of three on a
# shared two-core machine. Prints three markdown tables on stdout: the
# rates, the CPU the server's processes spent per request (per event for
# SSE), and the kernel's part of that CPU; progress goes to stderr.
#
# Knobs (environment): CONNS (64), THREADS (2), DURATION (5s per sample),
# FULL_CLIENTS (4), H2_CLIENTS (16), H2_STREAMS (10), H2_REQUESTS (150000),
# SSE_STREAMS (16000), SSE_EVENTS (50), ROUNDS (5), BASE (a git revision:
# pdlb built from it runs beside this tree's, both front ends), ROWS (the
# rows to run, of "ka hs full h2 sse"), STORM (0: no latency table). The h2 counts make samples of a few seconds, as the
# wrk rows' DURATION: one-second samples move by a tenth from one round to
# the next on a shared machine.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/bench/tls
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
DURATION=${DURATION:-5s}
FULL_CLIENTS=${FULL_CLIENTS:-4}
H2_CLIENTS=${H2_CLIENTS:-16}
H2_STREAMS=${H2_STREAMS:-10}
H2_REQUESTS=${H2_REQUESTS:-150000}
SSE_STREAMS=${SSE_STREAMS:-16000}
SSE_EVENTS=${SSE_EVENTS:-50}
ROUNDS=${ROUNDS:-5}
STORM=${STORM:-1}
BASE=${BASE:-}
WORKERS=$(nproc)

NAME=tlsbench
# shellcheck source=../proxy/harness.sh
. "$ROOT/bench/proxy/harness.sh"
API=/v1/chat/completions

install_missing() {
	local pkgs=()
	command -v wrk >/dev/null || pkgs+=(wrk)
	command -v h2load >/dev/null || pkgs+=(nghttp2-client)
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || pkgs+=(nginx-light)
	command -v openssl >/dev/null || pkgs+=(openssl)
	[ ${#pkgs[@]} -eq 0 ] && return
	log "installing ${pkgs[*]}"
	local sudo=
	[ "$(id -u)" = 0 ] || sudo=sudo
	$sudo apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${pkgs[@]}" >&2 ||
		log "WARNING: could not install ${pkgs[*]}"
}
install_missing

log "building pdlb and the stub"
(cd "$ROOT" && go build -o "$DIR/pdlb" ./tools/pdlb && go build -o "$DIR/stub" ./bench/proxy/stub &&
	go build -o "$DIR/latency" ./bench/tls/latency)
if [ -n "$BASE" ]; then
	log "building pdlb at $BASE"
	(cd "$ROOT" && git worktree add -q --detach "$DIR/base" "$BASE" &&
		(cd "$DIR/base" && go build -o "$DIR/pdlb-base" ./tools/pdlb); status=$?
		git worktree remove --force "$DIR/base"; exit $status)
fi
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
	-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout "$DIR/key.pem" -out "$DIR/cert.pem" 2>/dev/null
lua=$DIR/post.lua
cp "$ROOT/bench/proxy/post.lua" "$lua"
# lua_body is bench/proxy/post.lua's 1 KB body, for h2load.
lua_body() {
	local head='{"model":"bench","max_tokens":200,"stream":false,"messages":[{"role":"user","content":"' tail='"}]}'
	local filler
	filler=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 30))
	printf '%s%s%s' "$head" "${filler:0:$((1024 - ${#head} - ${#tail}))}" "$tail"
}
lua_body >"$DIR/body.json"

take_port STUB
"$DIR/stub" --listen "$STUB" 2>"$DIR/stub.log" &
started
wait_port "$STUB"

declare -A ADDR PID
LABELS=()
# start_pdlb FRONTEND BINARY LABEL
start_pdlb() {
	take_port LISTEN
	take_port ADMIN
	"$DIR/$2" serve --pod "model=bench,address=$STUB" --listen "$LISTEN" --admin "$ADMIN" --frontend "$1" \
		--tls-cert "$DIR/cert.pem" --tls-key "$DIR/key.pem" 2>"$DIR/$2-$1.log" &
	started
	LABELS+=("$3") ADDR["$3"]=$LISTEN PID["$3"]=$!
}
for fe in gnet fasthttp; do
	start_pdlb "$fe" pdlb "pdlb $fe"
	if [ -n "$BASE" ]; then
		start_pdlb "$fe" pdlb-base "pdlb $fe (base $BASE)"
	fi
done
take_port NGINX
sed -e "s|@WORKERS@|$WORKERS|" -e "s|@DIR@|$DIR|g" -e "s|@UPSTREAM@|$STUB|" -e "s|@LISTEN@|$NGINX|" \
	"$HERE/nginx.conf.tmpl" >"$DIR/nginx.conf"
/usr/sbin/nginx -c "$DIR/nginx.conf" 2>"$DIR/nginx.log" &
started
LABELS+=(nginx) ADDR[nginx]=$NGINX PID[nginx]=$!
for l in "${LABELS[@]}"; do
	wait_port "${ADDR[$l]}"
done

# pids prints the target's processes: nginx's master and its workers.
pids() {
	echo "${PID[$1]}" $(pgrep -P "${PID[$1]}" || true)
}

# handshakers LABEL SECS starts FULL_CLIENTS `openssl s_time -new` against
# LABEL for SECS seconds, each a full handshake after another, writing
# $DIR/s_time.N.txt; their pids go in HANDSHAKERS.
handshakers() {
	local i
	HANDSHAKERS=()
	for i in $(seq "$FULL_CLIENTS"); do
		openssl s_time -connect "${ADDR[$1]}" -new -tls1_3 -ciphersuites TLS_AES_128_GCM_SHA256 \
			-time "$2" >"$DIR/s_time.$i.txt" 2>&1 &
		HANDSHAKERS+=($!)
	done
}

# measure LABEL ROW runs ROW's load against LABEL and prints its rate and
# the target's CPU microseconds per request (per event for SSE), all and
# in the kernel.
measure() {
	local label=$1 row=$2 t0 t1 k0 k1 rate n
	t0=$(cpu_ticks $(pids "$label")) k0=$(kernel_ticks $(pids "$label"))
	case $row in
	ka | hs)
		local extra=()
		[ "$row" = hs ] && extra=(-H 'Connection: close')
		(cd "$DIR" && wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" -s post.lua "${extra[@]}" "https://${ADDR[$label]}$API") >"$DIR/wrk.txt" 2>&1 || true
		if grep -q 'Non-2xx\|Socket errors' "$DIR/wrk.txt"; then
			log "$label: $(grep 'Non-2xx\|Socket errors' "$DIR/wrk.txt" | tr '\n' ' ')"
		fi
		rate=$(awk '/^Requests\/sec/ {printf "%.0f", $2}' "$DIR/wrk.txt")
		n=$(awk '/requests in/ {print $1}' "$DIR/wrk.txt")
		;;
	full)
		local start
		start=$(date +%s.%N)
		handshakers "$label" "${DURATION%s}"
		wait "${HANDSHAKERS[@]}" || true
		n=$(cat "$DIR"/s_time.*.txt | awk '/connections in .* real seconds/ {n += $1} END {print n + 0}')
		rate=$(awk -v n="$n" -v t0="$start" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.0f", n / (t1 - t0)}')
		rm -f "$DIR"/s_time.*.txt
		;;
	h2 | sse)
		local args=(-n "$H2_REQUESTS" -c "$H2_CLIENTS" -m "$H2_STREAMS" -d "$DIR/body.json" -H 'content-type: application/json') per=1
		if [ "$row" = sse ]; then
			args=(-n "$SSE_STREAMS" -c "$H2_CLIENTS" -m "$H2_STREAMS" -d "$HERE/sse.json" -H 'content-type: application/json'
				-H "x-stub-events: $SSE_EVENTS" -H 'x-stub-interval: 1us')
			per=$SSE_EVENTS
		fi
		h2load "${args[@]}" "https://${ADDR[$label]}$API" >"$DIR/h2load.txt" 2>&1 || true
		if ! grep -q 'requests:.*succeeded' "$DIR/h2load.txt"; then
			log "$label: h2load: $(tail -3 "$DIR/h2load.txt" | tr '\n' ' ')"
		fi
		rate=$(awk -v per="$per" '/^finished in/ {gsub(",", "", $4); printf "%.0f", $4 * per}' "$DIR/h2load.txt")
		n=$(awk -v per="$per" '/^requests:/ {print $8 * per}' "$DIR/h2load.txt")
		;;
	esac
	t1=$(cpu_ticks $(pids "$label")) k1=$(kernel_ticks $(pids "$label"))
	echo "${rate:-0} $(cpu_us_per "$t0" "$t1" "${n:-0}") $(cpu_us_per "$k0" "$k1" "${n:-0}")"
}

read -ra ROWS <<<"${ROWS:-ka hs full h2 sse}"
declare -A RATES CPUS KERNS
for r in $(seq "$ROUNDS"); do
	for row in "${ROWS[@]}"; do
		for l in "${LABELS[@]}"; do
			log "round $r: $l: $row"
			read -r rate cpu kern < <(measure "$l" "$row")
			RATES["$l/$row"]+=" $rate" CPUS["$l/$row"]+=" ${cpu:-0}" KERNS["$l/$row"]+=" ${kern:-0}"
		done
	done
done

# storm LABEL prints the keep-alive latency p50 and p99 (µs) against
# LABEL alone, then while FULL_CLIENTS openssl s_time -new make full
# handshakes against it, and the requests that failed then.
storm() {
	local url="https://${ADDR[$1]}$API" alone during
	alone=$("$DIR/latency" --url "$url" --body "$DIR/body.json" --duration "$DURATION")
	handshakers "$1" $((${DURATION%s} + 1))
	sleep 0.5
	during=$("$DIR/latency" --url "$url" --body "$DIR/body.json" --duration "$DURATION")
	wait "${HANDSHAKERS[@]}" || true
	rm -f "$DIR"/s_time.*.txt
	echo "$(json_field "$alone" p50_us) $(json_field "$alone" p99_us) $(json_field "$during" p50_us) $(json_field "$during" p99_us) $(json_field "$during" errors)"
}
json_field() { sed -n "s/^result .*\"$2\":\([0-9]*\).*/\1/p" <<<"$1"; }
declare -A ALONE50 ALONE99 STORM50 STORM99 STORMERR
if [ "$STORM" != 0 ]; then
	for r in $(seq "$ROUNDS"); do
		for l in "${LABELS[@]}"; do
			log "round $r: $l: keep-alive latency, alone and under full handshakes"
			read -r a50 a99 s50 s99 serr < <(storm "$l")
			ALONE50[$l]+=" ${a50:-0}" ALONE99[$l]+=" ${a99:-0}" STORM50[$l]+=" ${s50:-0}" STORM99[$l]+=" ${s99:-0}" STORMERR[$l]+=" ${serr:-0}"
		done
	done
fi

# table TITLES FORMAT CELLS prints a markdown table, one line per target of
# the medians in the associative array named CELLS, per row, in printf's
# FORMAT, under the row titles in the associative array named TITLES.
table() {
	local -n cells=$3 titles=$1
	local head="| target |" rule="| --- |" row
	for row in "${ROWS[@]}"; do
		head+=" ${titles[$row]} |" rule+=" --- |"
	done
	echo "$head"
	echo "$rule"
	for l in "${LABELS[@]}"; do
		line="| $l |"
		for row in "${ROWS[@]}"; do
			# shellcheck disable=SC2086
			line+=" $(median "$2" ${cells["$l/$row"]}) |"
		done
		echo "$line"
	done
}
# shellcheck disable=SC2034 # table's titles
declare -A RATE_TITLES=([ka]="HTTPS keep-alive req/s" [hs]="new handshakes/s" [full]="full handshakes/s" [h2]="h2 req/s" [sse]="SSE over h2, events/s")
# shellcheck disable=SC2034
declare -A CPU_TITLES=([ka]="HTTPS keep-alive" [hs]="new handshakes" [full]="full handshakes" [h2]="h2" [sse]="SSE over h2")
table RATE_TITLES '%.0f' RATES
echo
echo "CPU of the target's processes, microseconds per request (per event for SSE, per handshake for full handshakes):"
echo
table CPU_TITLES '%.1f' CPUS
echo
echo "Of which in the kernel (the rest is the process's own work, user time):"
echo
table CPU_TITLES '%.1f' KERNS
echo
if [ "$STORM" != 0 ]; then
	echo "Keep-alive latency, µs to the whole answer, 8 HTTPS connections each sending every 5 ms (\`go run ./bench/tls/latency\`), alone and while $FULL_CLIENTS \`openssl s_time -new\` make full handshakes (medians of the rounds):"
	echo
	echo "| target | alone, p50 / p99 | under handshakes, p50 / p99 | failed under handshakes |"
	echo "| --- | --- | --- | --- |"
	for l in "${LABELS[@]}"; do
		# shellcheck disable=SC2086 # lists of numbers
		echo "| $l | $(median %.0f ${ALONE50[$l]}) / $(median %.0f ${ALONE99[$l]}) | $(median %.0f ${STORM50[$l]}) / $(median %.0f ${STORM99[$l]}) | $(median %.0f ${STORMERR[$l]}) |"
	done
	echo
fi
echo "Medians of $ROUNDS interleaved rounds. Machine: $(machine). Loads: \`wrk -t$THREADS -c$CONNS -d$DURATION -s bench/proxy/post.lua https://ADDR$API\` (with \`-H 'Connection: close'\` for handshakes, which resume wrk's last session by its ticket); full handshakes: $FULL_CLIENTS \`openssl s_time -new -time ${DURATION%s}\` at once; \`h2load -n $H2_REQUESTS -c $H2_CLIENTS -m $H2_STREAMS -d BODY\`; SSE: \`h2load -n $SSE_STREAMS -c $H2_CLIENTS -m $H2_STREAMS\` with $SSE_EVENTS events a stream. Certificate: ECDSA P-256; TLS 1.3, TLS_AES_128_GCM_SHA256, X25519 on every target."
