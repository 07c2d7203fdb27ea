#!/usr/bin/env bash
# Serving benchmark: dnsplan's authority against Knot DNS and NSD in the same run.
#
# One zone (bench.test.) of N managed names, name i with 2 + i%3 A records, is served by the
# dnsplan authority (from plan 1 applied through its store), by Knot and by NSD, each pinned
# to one core, with dnsperf on the other over UDP. Two query mixes: positives only, and
# positives with 5% names that do not exist. The servers take turns (A B C A B C ...) for
# --rounds rounds (default 3), and each round runs in both pinning orders (servers on core 0
# and dnsperf on core 1, then the other way round: the two cores of a virtual machine are not
# alike); every figure is the median over rounds and orders.
#
# The ratio to NSD is taken run by run (each run against NSD's in the same round and order),
# and reported as the median with its lowest and highest value per order; a ratio whose range
# over every round and order includes 1.00 is "within the noise" (not told apart from NSD).
#
# Figures per server, size and mix: queries per second; queries per server CPU-second (the
# CPU time of the server's process tree over the run: utime+stime, plus reaped children's
# cutime+cstime, of the server and every live descendant, from /proc/PID/stat); the ratio of
# that to NSD's; mean latency (dnsperf) and p99 latency (from dnsperf -v, which reports each
# response's latency, at some cost to the client: dnsperf 2.10 has no histogram option); RSS
# summed over the tree after the run; lost queries (at most the outstanding window is lost
# at the end of a run); the mean response size (the servers are set up to answer alike: no
# authority or additional section on a positive answer); the NXDOMAIN share of the answers;
# the server's CPU use during the run (100% = one core) and its user-space share (the rest
# is the kernel, mostly the UDP path); and the CPU other processes used meanwhile (anything
# above a few % means the figures are disturbed). Before measuring, the three servers must
# give the same addresses for a sample of names and NXDOMAIN for a missing one.
#
# The dnsplan side is built from the work tree (the commit is printed, "+changes" when the
# tree differs from it); Knot and NSD come from the distribution.
#
# Usage: bench/dns.sh [--sizes 10000,1000000] [--duration SECS] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=10000,1000000
DURATION=15
ROUNDS=3
usage() {
    echo "usage: bench/dns.sh [--sizes N[,N...]] [--duration SECS] [--rounds N]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --sizes) [ $# -ge 2 ] || usage; SIZES=$2; shift 2 ;;
        --duration) [ $# -ge 2 ] || usage; DURATION=$2; shift 2 ;;
        --rounds) [ $# -ge 2 ] || usage; ROUNDS=$2; shift 2 ;;
        -h | --help) usage ;;
        *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
[[ "$SIZES" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "--sizes: a comma-separated list of numbers" >&2; exit 2; }
[[ "$DURATION" =~ ^[0-9]+$ ]] && [ "$DURATION" -ge 1 ] || { echo "--duration: a number of seconds" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] || { echo "--rounds: a number, at least 1" >&2; exit 2; }

ORIGIN=bench.test.
SERVERS="dnsplan knot nsd"
CLIENTS=8            # dnsperf -c: client sockets
OUTSTANDING=100      # dnsperf -q: enough to keep one server core busy without queueing much
QUERY_LINES=1000000  # lines in each query file
LOAD_TIMEOUT_SECS=1200
STOP_TIMEOUT_SECS=20
export PATH="$PATH:/usr/sbin:/sbin"

# The tools, installed from the distribution only when a binary is missing.
missing=""
for pair in dnsperf:dnsperf knotd:knot nsd:nsd dig:bind9-dnsutils taskset:util-linux; do
    command -v "${pair%%:*}" > /dev/null || missing="$missing ${pair#*:}"
done
if [ -n "$missing" ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    echo "installing:$missing" >&2
    $sudo apt-get update
    # shellcheck disable=SC2086
    $sudo apt-get install -y $missing
fi
[ "$(nproc)" -ge 2 ] || { echo "needs at least 2 cores (server on core 0, dnsperf on core 1)" >&2; exit 1; }

cargo build --release -q -p dnsplan-authority -p dnsplan-chaos --bin dnsplan-authority --bin dns-bench-seed
BIN=$PWD/target/release
CLK_TCK=$(getconf CLK_TCK)
commit=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
git diff --quiet HEAD 2> /dev/null || commit="$commit+changes"
MACHINE="machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), commit $commit, $(date -u +%Y-%m-%d)"
VERSIONS="servers: dnsplan-authority, $(knotd --version | head -1), $(nsd -v 2>&1 | head -1); client $(dnsperf -h 2>&1 | grep -m1 Version)"
echo "$MACHINE" >&2
echo "$VERSIONS" >&2

WORK=$(mktemp -d)
PIDS=""

# shellcheck source=bench/lib.sh
. bench/lib.sh

cleanup() {
    local pid
    for pid in $PIDS; do stop_tree "$pid"; done
    PIDS=""
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Four consecutive free ports from 53531 on: dnsplan, Knot, NSD, dnsplan's control API.
BASE=""
for ((base = 53531; base < 53531 + 400; base += 4)); do
    if ! port_busy $base && ! port_busy $((base + 1)) && ! port_busy $((base + 2)) && ! port_busy $((base + 3)); then
        BASE=$base
        break
    fi
done
[ -n "$BASE" ] || { echo "no four free consecutive ports from 53531 on" >&2; exit 1; }
declare -A PORT=([dnsplan]=$BASE [knot]=$((BASE + 1)) [nsd]=$((BASE + 2)))
CONTROL_PORT=$((BASE + 3))
declare -A ROOT LOAD_SECS

answers() { # PORT NAME: the sorted addresses, or nothing
    dig @127.0.0.1 -p "$1" +norec +short +time=1 +tries=1 "$2" A 2> /dev/null | grep -E '^[0-9.]+$' | sort || true
}
rcode() { # PORT NAME
    dig @127.0.0.1 -p "$1" +norec +time=1 +tries=1 "$2" A 2> /dev/null | sed -n 's/.*status: \([A-Z]*\),.*/\1/p'
}

# Starts server $1 (command in the rest), pinned to core 0, and waits until the last name of
# the zone answers with addresses. Sets ROOT and LOAD_SECS.
start_server() {
    local server=$1 dir=$2 last=$3 started pid i
    shift 3
    started=$(date +%s.%N)
    taskset -c 0 "$@" > "$dir/$server.log" 2>&1 &
    pid=$!
    PIDS="$PIDS $pid"
    ROOT[$server]=$pid
    for ((i = 0; i < LOAD_TIMEOUT_SECS * 20; i++)); do
        if ! alive "$pid"; then
            echo "$server exited while loading; its log:" >&2
            tail -20 "$dir/$server.log" >&2
            exit 1
        fi
        [ -n "$(answers "${PORT[$server]}" "$last")" ] && break
        sleep 0.05
    done
    [ -n "$(answers "${PORT[$server]}" "$last")" ] || { echo "$server does not answer $last after ${LOAD_TIMEOUT_SECS}s" >&2; exit 1; }
    LOAD_SECS[$server]=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
}

# The servers must agree before anything is measured.
check_answers() {
    local n=$1 i name want got server
    for i in $(printf '%s\n' 0 1 2 $((n / 2)) $((n - 1)) | sort -un); do
        [ "$i" -lt "$n" ] || continue
        name=e$i
        want=$(answers "${PORT[nsd]}" "$name.$ORIGIN")
        [ -n "$want" ] || { echo "nsd does not answer $name.$ORIGIN" >&2; exit 1; }
        for server in dnsplan knot; do
            got=$(answers "${PORT[$server]}" "$name.$ORIGIN")
            [ "$got" = "$want" ] || { echo "$server answers $name.$ORIGIN with [$got], nsd with [$want]" >&2; exit 1; }
        done
    done
    for server in $SERVERS; do
        got=$(rcode "${PORT[$server]}" "nx1.$ORIGIN")
        [ "$got" = NXDOMAIN ] || { echo "$server answers nx1.$ORIGIN with ${got:-nothing}, not NXDOMAIN" >&2; exit 1; }
    done
}

# One dnsperf run against $1 with query file $2, dnsperf on core $6 (the pinning order $7);
# appends a result line to $RESULTS:
# size mix server round qps q_per_cpu_s mean_ms p99_ms rss_mb lost_pct resp_bytes
# nxdomain_pct other_rcode_pct server_cpu_pct other_cpu_pct server_user_pct order
measure() {
    local server=$1 queries=$2 size=$3 mix=$4 round=$5 client_core=$6 order=$7 out t0 t1 u0 u1 w0 w1 m0 m1 c0 c1 rss
    out=$WORK/dnsperf.out
    w0=$(date +%s.%N)
    read -r t0 u0 <<< "$(tree_ticks "${ROOT[$server]}")"
    m0=$(machine_ticks)
    c0=$(children_ticks)
    taskset -c "$client_core" dnsperf -s 127.0.0.1 -p "${PORT[$server]}" -d "$queries" -l "$DURATION" -c "$CLIENTS" -q "$OUTSTANDING" -v > "$out" 2>&1 \
        || { echo "dnsperf failed against $server:" >&2; grep -v '^>' "$out" | tail -20 >&2; exit 1; }
    c1=$(children_ticks)
    m1=$(machine_ticks)
    read -r t1 u1 <<< "$(tree_ticks "${ROOT[$server]}")"
    w1=$(date +%s.%N)
    rss=$(tree_rss_kb "${ROOT[$server]}")
    alive "${ROOT[$server]}" || { echo "$server died during the run" >&2; exit 1; }
    awk -v size="$size" -v mix="$mix" -v server="$server" -v round="$round" -v order="$order" -v cpu_ticks=$((t1 - t0)) -v hz="$CLK_TCK" -v rss="$rss" -v wall="$(awk -v a="$w0" -v b="$w1" 'BEGIN { print b - a }')" \
        -v user_ticks=$((u1 - u0)) -v other_ticks=$((m1 - m0 - (t1 - t0) - (c1 - c0))) '
        $1 == ">" && NF == 5 { us = int($5 * 1e6 + 0.5); hist[us]++; n++; next }
        $1 == ">" { next }
        /Queries completed:/ { completed = $3 }
        /Queries lost:/ { lost = $3 }
        /Queries sent:/ { sent = $3 }
        /Queries per second:/ { qps = $4 }
        /Run time \(s\):/ { runtime = $4 }
        /Average Latency \(s\):/ { mean = $4 }
        /Average packet size:/ { resp = $NF }
        /Response codes:/ {
            sub(/.*Response codes: */, ""); m = split($0, c, ",")
            for (i = 1; i <= m; i++) {
                split(c[i], kv, " ")
                answered += kv[2]; if (kv[1] == "NXDOMAIN") nxd += kv[2]; else if (kv[1] != "NOERROR") other += kv[2]
            }
        }
        END {
            if (completed == "" || qps == "") { print "no statistics from dnsperf" > "/dev/stderr"; exit 1 }
            want = n * 0.99; acc = 0; p99 = 0
            if (n > 0) { for (us = 0; acc < want; us++) acc += hist[us]; p99 = (us - 1) / 1000 }
            cpu = cpu_ticks / hz
            printf "%s %s %s %s %.0f %.0f %.3f %.3f %.1f %.3f %s %.2f %.2f %.0f %.0f %.0f %s\n", size, mix, server, round, qps,
                (cpu > 0 ? completed / cpu : 0), mean * 1000, p99, rss / 1024, (sent > 0 ? 100 * lost / sent : 0), resp,
                (answered > 0 ? 100 * nxd / answered : 0), (answered > 0 ? 100 * other / answered : 0), (runtime > 0 ? 100 * cpu / runtime : 0), (wall > 0 && other_ticks > 0 ? 100 * other_ticks / hz / wall : 0),
                (cpu_ticks > 0 ? 100 * user_ticks / cpu_ticks : 0), order
        }' "$out" >> "$RESULTS"
    rm -f "$out"
    tail -1 "$RESULTS" | awk '{ printf "  round %s %s %-4s %-8s %9s q/s %9s q/cpu-s  cpu %s%% (user %s%%)  mean %s ms  p99 %s ms  rss %s MB  nxdomain %s%%  other %s%%\n", $4, $17, $2, $3, $5, $6, $14, $16, $7, $8, $9, $12, $15
        if ($13 > 0) printf "  WARNING: %s%% of the answers were neither NOERROR nor NXDOMAIN\n", $13 }' >&2
}

RESULTS=$WORK/results
LOADS=$WORK/loads
: > "$RESULTS"
: > "$LOADS"
TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')

for size in ${SIZES//,/ }; do
    [ "$size" -ge 1 ] || { echo "--sizes: sizes must be at least 1" >&2; exit 2; }
    dir=$WORK/$size
    mkdir -p "$dir/store" "$dir/knot" "$dir/nsd"
    echo "size $size: seeding" >&2
    seed_started=$(date +%s.%N)
    "$BIN/dns-bench-seed" --data-dir "$dir/store" --names "$size" --origin "$ORIGIN" \
        --zone-file "$dir/bench.test.zone" --static-zone-file "$dir/static.zone" \
        --queries-positive "$dir/queries-pos" --queries-nx "$dir/queries-nx" --queries "$QUERY_LINES" 2> "$dir/seed.log" \
        || { cat "$dir/seed.log" >&2; exit 1; }
    sed 's/^/  /' "$dir/seed.log" >&2
    seed_secs=$(awk -v a="$seed_started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')

    cat > "$dir/authority.toml" << EOF
data_dir = "$dir/store"

[dns]
listen = ["127.0.0.1:${PORT[dnsplan]}"]

[control]
listen = "127.0.0.1:$CONTROL_PORT"
token = "$TOKEN"

[dns_zone]
origin = "$ORIGIN"
master_file = "static.zone"
EOF
    cat > "$dir/knot/knot.conf" << EOF
server:
    listen: 127.0.0.1@${PORT[knot]}
    rundir: "$dir/knot"
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1
log:
  - target: stderr
    any: info
database:
    storage: "$dir/knot"
template:
  - id: default
    storage: "$dir"
    file: "%s.zone"
    zonefile-sync: -1
    zonefile-load: whole
    journal-content: none
zone:
  - domain: $ORIGIN
EOF
    nsd_conf "$dir" "${PORT[nsd]}" "$ORIGIN" bench.test.zone

    last="e$((size - 1)).$ORIGIN"
    echo "size $size: starting the servers" >&2
    start_server dnsplan "$dir" "$last" env RUST_LOG=info "$BIN/dnsplan-authority" --config "$dir/authority.toml"
    # The first start reads the store's active state and writes the serving image; a restart
    # (SIGTERM, as an operator's) answers from the image brought up to the store. Both count;
    # the runs below measure the restarted process.
    first_load=${LOAD_SECS[dnsplan]}
    mv "$dir/dnsplan.log" "$dir/dnsplan-first.log"
    stop_tree "${ROOT[dnsplan]}"
    start_server dnsplan "$dir" "$last" env RUST_LOG=info "$BIN/dnsplan-authority" --config "$dir/authority.toml"
    grep -q "serving image loaded" "$dir/dnsplan.log" || { echo "dnsplan's restart did not use the serving image; its log:" >&2; tail -5 "$dir/dnsplan.log" >&2; exit 1; }
    start_server knot "$dir" "$last" knotd -c "$dir/knot/knot.conf"
    start_server nsd "$dir" "$last" nsd -d -c "$dir/nsd/nsd.conf"
    check_answers "$size"
    echo "$size $seed_secs ${LOAD_SECS[dnsplan]} ${LOAD_SECS[knot]} ${LOAD_SECS[nsd]} $first_load" >> "$LOADS"
    echo "  seeded in ${seed_secs}s; loaded: dnsplan ${LOAD_SECS[dnsplan]}s (restart; first start ${first_load}s), knot ${LOAD_SECS[knot]}s, nsd ${LOAD_SECS[nsd]}s" >&2

    for ((round = 1; round <= ROUNDS; round++)); do
        # Order s0: servers on core 0, dnsperf on core 1; order s1: the other way round.
        for server_core in 0 1; do
            for server in $SERVERS; do pin_tree "${ROOT[$server]}" "$server_core"; done
            for mix in pos nx; do
                for server in $SERVERS; do
                    measure "$server" "$dir/queries-$mix" "$size" "$mix" "$round" $((1 - server_core)) "s$server_core"
                done
            done
        done
    done

    for server in $SERVERS; do stop_tree "${ROOT[$server]}"; done
    PIDS=""
    rm -rf "$dir"
done

echo
echo "serving benchmark: zone $ORIGIN, UDP, ${DURATION}s per run, $ROUNDS rounds in two pinning orders (median), dnsperf -c $CLIENTS -q $OUTSTANDING"
echo "$MACHINE"
echo "$VERSIONS"
echo "mix: pos = existing names only; nx = 5% names that do not exist. vs nsd = q/cpu-s over NSD's, run by run (median)."
awk '
    function median(key,    n, i, j, v, t) {
        n = split(vals[key], v, " ")
        for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    FILENAME ~ /loads$/ { sizes[++nsizes] = $1; seed[$1] = $2; load[$1, "dnsplan"] = $3; load[$1, "knot"] = $4; load[$1, "nsd"] = $5; first[$1] = $6; next }
    {
        k = $1 SUBSEP $2 SUBSEP $3
        if (!(k in seen)) { seen[k] = 1; order[++rows] = k }
        for (f = 5; f <= 16; f++) vals[k, f] = vals[k, f] " " $f
        run[$1, $2, $3, $4, $17] = $6
        runs[++nruns] = $1 SUBSEP $2 SUBSEP $3 SUBSEP $4 SUBSEP $17
        if ($13 > 0) bad = bad "  " $1 " " $2 " " $3 " round " $4 ": " $13 "% of the answers\n"
    }
    END {
        # The ratio of each run to NSD in the same size, mix, round and pinning order.
        for (i = 1; i <= nruns; i++) {
            split(runs[i], rk, SUBSEP)
            base = run[rk[1], rk[2], "nsd", rk[4], rk[5]]
            if (base > 0) {
                x = run[rk[1], rk[2], rk[3], rk[4], rk[5]] / base
                k = rk[1] SUBSEP rk[2] SUBSEP rk[3]
                vals[k, "ratio"] = vals[k, "ratio"] " " x
                vals[k, "ratio", rk[5]] = vals[k, "ratio", rk[5]] " " x
                if (!((k, "lo") in lim) || x < lim[k, "lo"]) lim[k, "lo"] = x
                if (!((k, "hi") in lim) || x > lim[k, "hi"]) lim[k, "hi"] = x
                if (!((k, "lo", rk[5]) in lim) || x < lim[k, "lo", rk[5]]) lim[k, "lo", rk[5]] = x
                if (!((k, "hi", rk[5]) in lim) || x > lim[k, "hi", rk[5]]) lim[k, "hi", rk[5]] = x
            }
        }
        printf "%-9s %-4s %-8s %10s %10s %7s %6s %6s %9s %9s %9s %7s %7s %7s %8s %8s\n", "names", "mix", "server", "qps", "q/cpu-s", "vs nsd", "cpu %", "usr %", "mean ms", "p99 ms", "rss MB", "lost %", "resp B", "nxd %", "other %", "load s"
        for (r = 1; r <= rows; r++) {
            split(order[r], key, SUBSEP)
            q = median(order[r] SUBSEP 6)
            printf "%-9s %-4s %-8s %10.0f %10.0f %7.2f %6.0f %6.0f %9.3f %9.3f %9.1f %7.3f %7.0f %7.2f %8.0f %8s\n", key[1], key[2], key[3],
                median(order[r] SUBSEP 5), q, median(order[r] SUBSEP "ratio"), median(order[r] SUBSEP 14), median(order[r] SUBSEP 16), median(order[r] SUBSEP 7), median(order[r] SUBSEP 8),
                median(order[r] SUBSEP 9), median(order[r] SUBSEP 10), median(order[r] SUBSEP 11), median(order[r] SUBSEP 12),
                median(order[r] SUBSEP 15), load[key[1], key[3]]
        }
        print ""
        print "ratio to NSD in q/cpu-s, run by run: median [lowest-highest] with servers on core 0 (s0) and on core 1 (s1)"
        for (r = 1; r <= rows; r++) {
            split(order[r], key, SUBSEP)
            if (key[3] == "nsd") continue
            k = order[r]
            verdict = (lim[k, "lo"] <= 1 && lim[k, "hi"] >= 1) ? "within the noise" : (lim[k, "lo"] > 1 ? "ahead of NSD in every run" : "behind NSD in every run")
            printf "  %-9s %-4s %-8s s0 %.2f [%.2f-%.2f]  s1 %.2f [%.2f-%.2f]  %s\n", key[1], key[2], key[3],
                median(k SUBSEP "ratio" SUBSEP "s0"), lim[k, "lo", "s0"], lim[k, "hi", "s0"],
                median(k SUBSEP "ratio" SUBSEP "s1"), lim[k, "lo", "s1"], lim[k, "hi", "s1"], verdict
        }
        print ""
        printf "dnsplan seeding (files, publish of plan 1, apply of every endpoint):"
        for (i = 1; i <= nsizes; i++) printf " %s names %ss;", sizes[i], seed[sizes[i]]
        print ""
        printf "dnsplan first start (reading the store; the load s column is the restart from the serving image):"
        for (i = 1; i <= nsizes; i++) printf " %s names %ss;", sizes[i], first[sizes[i]]
        print ""
        if (bad != "") printf "WARNING: answers other than NOERROR and NXDOMAIN:\n%s", bad
        print "cpu %: the server tree'"'"'s CPU time over dnsperf'"'"'s run time (100 = one core saturated); usr %: its user-space share."
        print "other %: CPU used by other processes during the run, in % of one core; above a few %, the figures are noisy."
        print "load s: from start until the last name answers (dnsplan: its restart). nxd %: NXDOMAIN share of the answers (0 and 5 expected)."
    }' "$LOADS" "$RESULTS"
