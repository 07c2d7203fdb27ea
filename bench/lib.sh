# Shared by the benchmarks (sourced): process trees, their CPU ticks and memory, stopping
# them, pinning them to a core, free ports. Uses STOP_TIMEOUT_SECS.

# Every pid in the process tree rooted at $1 (the root first when alive).
tree_pids() {
    { cat /proc/[0-9]*/stat 2> /dev/null || true; } | awk -v root="$1" '
        { pid = $1; line = $0; sub(/^.*\) /, "", line); split(line, f, " "); ppid[pid] = f[2] }
        END {
            if (!(root in ppid)) exit
            want[root] = 1; print root
            for (changed = 1; changed;) {
                changed = 0
                for (p in ppid) if (!(p in want) && (ppid[p] in want)) { want[p] = 1; changed = 1; print p }
            }
        }'
}

# CPU ticks of the tree rooted at $1: utime+stime of every live process (all its threads)
# plus cutime+cstime (children that exited and were reaped during the run); then the user
# part alone (utime+cutime).
tree_ticks() {
    { cat /proc/[0-9]*/stat 2> /dev/null || true; } | awk -v root="$1" '
        { pid = $1; line = $0; sub(/^.*\) /, "", line); split(line, f, " ")
          ppid[pid] = f[2]; ticks[pid] = f[12] + f[13] + f[14] + f[15]; user[pid] = f[12] + f[14] }
        END {
            if (!(root in ppid)) { print 0, 0; exit }
            want[root] = 1
            for (changed = 1; changed;) {
                changed = 0
                for (p in ppid) if (!(p in want) && (ppid[p] in want)) { want[p] = 1; changed = 1 }
            }
            t = 0; u = 0; for (p in want) { t += ticks[p]; u += user[p] }; print t, u
        }'
}

# Busy ticks of the whole machine (everything but idle and iowait).
machine_ticks() {
    local cpu user nice system idle iowait irq softirq steal rest
    read -r cpu user nice system idle iowait irq softirq steal rest < /proc/stat
    echo $((user + nice + system + irq + softirq + steal))
}

# CPU ticks of this shell's reaped children (dnsperf, once it has exited).
children_ticks() {
    local -a f
    read -r -a f < "/proc/$$/stat"
    echo $((f[15] + f[16]))
}

# VmRSS of the tree rooted at $1, in kB.
tree_rss_kb() {
    local total=0 pid kb
    for pid in $(tree_pids "$1"); do
        kb=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2> /dev/null || true)
        total=$((total + ${kb:-0}))
    done
    echo "$total"
}

# True while process $1 runs (a zombie does not count).
alive() {
    local state
    state=$(sed 's/^.*) //' "/proc/$1/stat" 2> /dev/null | cut -c1)
    [ -n "$state" ] && [ "$state" != Z ]
}

# Stops the tree rooted at $1: SIGTERM to the root, then SIGKILL to whatever is left.
stop_tree() {
    local root=$1 pids pid i left
    pids=$(tree_pids "$root")
    [ -n "$pids" ] || return 0
    kill -TERM "$root" 2> /dev/null || true
    for ((i = 0; i < STOP_TIMEOUT_SECS * 10; i++)); do
        left=""
        for pid in $pids; do alive "$pid" && left="$left $pid"; done
        [ -n "$left" ] || break
        sleep 0.1
    done
    # shellcheck disable=SC2086
    kill -KILL $pids 2> /dev/null || true
    wait "$root" 2> /dev/null || true
}

port_busy() {
    command -v ss > /dev/null || return 1
    [ -n "$(ss -Hlnu "sport = :$1" 2> /dev/null)$(ss -Hlnt "sport = :$1" 2> /dev/null)" ]
}

# Pins every thread of every process of the tree rooted at $1 to core $2.
pin_tree() {
    local pid
    for pid in $(tree_pids "$1"); do
        taskset -a -p -c "$2" "$pid" > /dev/null 2>&1 || true
    done
}


# Writes DIR/nsd/nsd.conf: NSD on 127.0.0.1@PORT, one server process, everything in DIR, no
# rate limit and minimal responses (as the benchmarks compare), serving ORIGIN from DIR/FILE.
# Usage: nsd_conf DIR PORT ORIGIN FILE
nsd_conf() {
    local dir=$1 port=$2 origin=$3 file=$4
    cat > "$dir/nsd/nsd.conf" << EOF2
server:
    ip-address: 127.0.0.1@$port
    server-count: 1
    username: ""
    chroot: ""
    database: ""
    zonesdir: "$dir"
    pidfile: "$dir/nsd/nsd.pid"
    xfrdfile: "$dir/nsd/xfrd.state"
    zonelistfile: "$dir/nsd/zone.list"
    xfrdir: "$dir/nsd"
    zonefiles-write: 0
    minimal-responses: yes
    rrl-ratelimit: 0
    rrl-whitelist-ratelimit: 0
    verbosity: 1
remote-control:
    control-enable: no
zone:
    name: $origin
    zonefile: $file
EOF2
}
