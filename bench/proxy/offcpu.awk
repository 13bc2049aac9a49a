# offcpu.awk folds `perf script` output of sched:sched_switch samples (taken
# with -g) into one line per place a thread left its core: "blocked" when
# it went to sleep (a voluntary switch: it waits for a futex, epoll, a
# timer), "preempted" when the scheduler took the core from it while it
# could run. The place is the innermost three frames of the process's own
# code, below the kernel and the syscall wrappers. Prints "count state
# frames", unsorted.
/sched:sched_switch:/ {
	state = ($0 ~ /prev_state=R/) ? "preempted" : "blocked"
	n = 0
	where = ""
	next
}
/^[ \t]+[0-9a-f]+ / {
	if ($0 ~ /kernel\.kallsyms/ || n >= 3)
		next
	f = $2
	sub(/\+0x[0-9a-f]+$/, "", f)
	if (f ~ /^(internal\/runtime\/syscall|syscall\.|golang\.org\/x\/sys\/unix\.)/)
		next
	where = where (n ? " < " : "") f
	n++
	next
}
/^$/ {
	if (state != "")
		count[state "  " where]++
	state = ""
}
END {
	for (k in count)
		printf "%7d  %s\n", count[k], k
}
