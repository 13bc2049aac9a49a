# What bench/proxy/run.sh and bench/sse/run.sh share, sourced by both after
# they set NAME: a scratch directory, the processes they start (every one
# stopped on exit), free loopback ports, CPU time from /proc, and medians.
# KEEP=1 keeps the scratch directory (outputs, logs, profiles).

DIR=$(mktemp -d "/tmp/pdlb-$NAME.XXXXXX")
PIDS=()
cleanup() {
	local pid
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	if [ "${KEEP:-0}" = 1 ]; then
		echo "scratch directory kept: $DIR" >&2
	else
		rm -rf "$DIR"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "$NAME: $*" >&2; }

# started records the last background process for cleanup.
started() { PIDS+=("$!"); }

# take_port sets the variable named $1 to 127.0.0.1:PORT where nothing
# listens. Ports come from 20000-29999, below Linux's ephemeral range, so no
# outbound connection holds them; the start is random so that runs beside
# other people's servers rarely collide.
NEXT_PORT=$((20000 + RANDOM % 9000))
take_port() {
	while (exec 3<>"/dev/tcp/127.0.0.1/$NEXT_PORT") 2>/dev/null; do
		NEXT_PORT=$((NEXT_PORT + 1))
	done
	printf -v "$1" '127.0.0.1:%d' "$NEXT_PORT"
	NEXT_PORT=$((NEXT_PORT + 1))
}

# wait_port waits until host:port accepts connections (10 s at most).
wait_port() {
	local host=${1%:*} port=${1##*:} i
	for i in $(seq 100); do
		if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then
			return 0
		fi
		sleep 0.1
	done
	log "nothing listens on $1"
	return 1
}

# cpu_ticks prints the user+system clock ticks the given processes used, all
# their threads: fields 14 and 15 of /proc/PID/stat, counted after the ")"
# that ends the command name, which may hold spaces. kernel_ticks prints the
# system ticks alone (field 15).
cpu_ticks() { stat_ticks '$12 + $13' "$@"; }
kernel_ticks() { stat_ticks '$13' "$@"; }
stat_ticks() {
	local fields=$1 total=0 pid
	shift
	for pid in "$@"; do
		total=$((total + $(sed 's/.*) //' "/proc/$pid/stat" | awk "{print $fields}")))
	done
	echo "$total"
}

# cpu_ns sums the nanoseconds the processes' threads have run (the first
# field of /proc/PID/task/TID/schedstat): exact, where /proc/PID/stat
# counts 10 ms ticks, as coarse as 0.8 us an event over a 12,800-event
# round. A thread that exits between two readings takes its share along.
cpu_ns() {
	local pid
	for pid in "$@"; do
		cat /proc/"$pid"/task/*/schedstat 2>/dev/null || true
	done | awk '{s += $1} END{printf "%.0f\n", s}'
}

# ns_us_per A B N: the microseconds from nanoseconds A to B, per one of N.
ns_us_per() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN{ if (n > 0) printf "%.2f", (b - a) / 1e3 / n }'; }

# ctx_switches prints the voluntary and involuntary context switches of the
# given processes, every thread summed: /proc/PID/status counts the main
# thread alone, so each /proc/PID/task/TID/status is read.
ctx_switches() {
	local pid
	for pid in "$@"; do
		cat /proc/"$pid"/task/*/status 2>/dev/null || true
	done | awk '$1 == "voluntary_ctxt_switches:" {v += $2} $1 == "nonvoluntary_ctxt_switches:" {n += $2}
		END{print v + 0, n + 0}'
}

# SPLICE_PROCS is GOMAXPROCS as pdlb's gnet front end raises it for its
# loops while they hold connections (lb/frontend's busyLoops: by a P a
# loop, one loop a core), which the splice (bench/proxy/splice) runs with.
SPLICE_PROCS=$((2 * $(nproc)))

# start_splice VAR LOG [FLAGS...] starts the splice with FLAGS on a port of
# its own, which it puts in VAR, with SPLICE_PROCS, logging to LOG in the
# scratch directory; SPLICED_PID is its process.
start_splice() {
	local var=$1 log=$2
	shift 2
	take_port "$var"
	(cd "$ROOT" && exec env GOMAXPROCS=$SPLICE_PROCS "$DIR/splice" "$@" --listen "${!var}" --upstream "$STUB") 2>"$DIR/$log" &
	SPLICED_PID=$!
	started
}

# per_req prints (after - before) / requests with three decimals.
per_req() {
	awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN{ if (n > 0) printf "%.3f", (b - a) / n }'
}

# Syscall counts come from perf's raw_syscalls:sys_enter tracepoint,
# counted for the given processes (every thread, and threads they start)
# while a command runs: syscalls_start PID... starts the count,
# syscalls_stop sets SYSCALLS to it (empty when not counted). It is not
# printed: only this shell can wait for perf to write its count, not a
# $(...) subshell, which read the file before it was written, or last time's. /proc has no per-process syscall count (its io
# file counts reads and writes alone), and strace stops the process at
# every call, which changes how many a wake-up batches. PERF_OK says
# whether the counter works here (perf installed, perf_event_paranoid
# allowing it); where not, the figure is empty.
PERF_OK=
if command -v perf >/dev/null && perf stat -e raw_syscalls:sys_enter -- true >/dev/null 2>&1; then
	PERF_OK=1
fi
syscalls_start() {
	SYSCALLS_PID=
	[ -n "$PERF_OK" ] || return 0
	rm -f "$DIR/perf-stat.txt"
	local pids
	pids=$(echo "$@" | tr ' ' ',')
	perf stat -x, -e raw_syscalls:sys_enter -p "$pids" -o "$DIR/perf-stat.txt" 2>/dev/null &
	SYSCALLS_PID=$!
	sleep 0.2
}
syscalls_stop() {
	SYSCALLS=
	[ -n "$SYSCALLS_PID" ] || return 0
	kill -INT "$SYSCALLS_PID" 2>/dev/null || true
	wait "$SYSCALLS_PID" 2>/dev/null || true
	SYSCALLS=$(awk -F, '/raw_syscalls:sys_enter/ && $1 ~ /^[0-9]+$/ {print $1}' "$DIR/perf-stat.txt" 2>/dev/null)
}

# busy_ticks prints the clock ticks all of the machine's cores spent busy,
# whichever process ran: user, nice, system, irq and softirq of /proc/stat's
# cpu line (softirq is where loopback's receiving side runs; idle, iowait
# and the hypervisor's steal are left out).
busy_ticks() {
	awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8; exit}' /proc/stat
}

# cpu_us_per prints microseconds of CPU per item: ticks before, after, items.
cpu_us_per() {
	awk -v d=$(($2 - $1)) -v hz="$(getconf CLK_TCK)" -v n="$3" 'BEGIN{ if (n > 0) printf "%.1f", d / hz / n * 1e6 }'
}

# machine prints the line that says where a table was measured.
machine() {
	echo "$(date -u +%Y-%m-%dT%H:%MZ), $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo), $(nproc) cores, $(go version | awk '{print $3}'), load average at the end $(cut -d' ' -f1-3 /proc/loadavg) (shared cores: the load generator, the proxy and the upstream run on them together)"
}

# median FORMAT NUMBER... prints the median of the numbers in printf's
# FORMAT; lowest and highest print the extremes. For figures measured in
# rounds: a burst of load from the machine's neighbours moves one round.
median() {
	local format=$1
	shift
	printf '%s\n' "$@" | sort -g | awk -v f="$format" '{v[NR] = $1}
		END{printf f, (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
lowest() { printf '%s\n' "$@" | sort -g | head -1; }
highest() { printf '%s\n' "$@" | sort -g | tail -1; }
