#!/usr/bin/env bash
# UDP over AF_XDP: dnsplan's authority with `[dns] xdp` and on sockets, Knot DNS with XDP
# (`xdp.listen`) and on sockets, and NSD, in the same run, over a veth pair between two network
# namespaces made for the run: the server in one, pinned to core 0, dnsperf in the other,
# pinned to core 1. One zone of --names static A records (a master file all three read).
#
# Each server is asked twice per round: at an equal offered load (--rate queries a second,
# dnsperf -Q) and at saturation (no limit). The servers take turns (A B C ... each round).
# Figures: answers a second, the answered fraction, p99 latency (dnsperf -v), and answers per
# server-core CPU-second: the busy time of core 0 over the run (user, system, irq and
# softirq from /proc/stat), not the server process's, because a frame's kernel work (the XDP
# program, the AF_XDP copy, the UDP stack) is charged to no process. On a veth the receive
# side of a query (the XDP program included) runs on the sender's core, so core 0 carries
# what the server does and what sending its answers costs.
#
# A server that does not start here is said and left out: Knot 3.2's XDP program is refused by
# the verifier of recent kernels (it calls bpf_xdp_adjust_meta), and the ratio column is then
# to Knot on sockets. With two cores the client's core also runs the receive side of every
# query, so "unlimited" is the client's limit, not the server's.
#
# Usage: bench/xdp.sh [--names N] [--duration SECS] [--rounds N] [--rate QPS]
set -euo pipefail
cd "$(dirname "$0")/.."

NAMES=10000
DURATION=10
ROUNDS=2
RATE=100000
usage() {
    echo "usage: bench/xdp.sh [--names N] [--duration SECS] [--rounds N] [--rate QPS]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --names) [ $# -ge 2 ] || usage; NAMES=$2; shift 2 ;;
        --duration) [ $# -ge 2 ] || usage; DURATION=$2; shift 2 ;;
        --rounds) [ $# -ge 2 ] || usage; ROUNDS=$2; shift 2 ;;
        --rate) [ $# -ge 2 ] || usage; RATE=$2; shift 2 ;;
        -h | --help) usage ;;
        *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
for v in "$NAMES" "$DURATION" "$ROUNDS" "$RATE"; do
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -ge 1 ] || { echo "every argument is a number, at least 1" >&2; exit 2; }
done

SERVERS="dnsplan-xdp dnsplan knot-xdp knot nsd"
CLIENTS=8
OUTSTANDING=100
STOP_TIMEOUT_SECS=20
LOAD_TIMEOUT_SECS=120
export PATH="$PATH:/usr/sbin:/sbin"
[ "$(id -u)" -eq 0 ] || { echo "needs root: network namespaces, XDP and AF_XDP" >&2; exit 1; }
missing=""
for pair in dnsperf:dnsperf knotd:knot nsd:nsd dig:bind9-dnsutils taskset:util-linux ip:iproute2; do
    command -v "${pair%%:*}" > /dev/null || missing="$missing ${pair#*:}"
done
if [ -n "$missing" ]; then
    echo "installing:$missing" >&2
    apt-get update
    # shellcheck disable=SC2086
    apt-get install -y $missing
fi
[ "$(nproc)" -ge 2 ] || { echo "needs at least 2 cores (server on core 0, dnsperf on core 1)" >&2; exit 1; }

cargo build --release -q -p dnsplan-authority --bin dnsplan-authority
BIN=$PWD/target/release
CLK_TCK=$(getconf CLK_TCK)
commit=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
git diff --quiet HEAD 2> /dev/null || commit="$commit+changes"

WORK=$(mktemp -d)
SRV="dnsplan-bx-srv-$$"
CLI="dnsplan-bx-cli-$$"
PIDS=""
# shellcheck source=bench/lib.sh
. bench/lib.sh
cleanup() {
    local pid
    for pid in $PIDS; do stop_tree "$pid"; done
    ip netns del "$SRV" 2> /dev/null || true
    ip netns del "$CLI" 2> /dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "$SRV"
ip netns add "$CLI"
ip -n "$SRV" link add xa type veth peer name xb netns "$CLI"
ip -n "$SRV" addr add 10.97.0.1/24 dev xa
ip -n "$CLI" addr add 10.97.0.2/24 dev xb
for ns in "$SRV" "$CLI"; do ip -n "$ns" link set lo up; done
ip -n "$SRV" link set xa up
ip -n "$CLI" link set xb up
SERVER=10.97.0.1

ORIGIN=bench.test.
mkdir -p "$WORK/knot" "$WORK/nsd" "$WORK/dnsplan"
awk -v names="$NAMES" -v dir="$WORK" -v origin="$ORIGIN" 'BEGIN {
    srand(11)
    f = dir "/zone.db"
    printf "$ORIGIN %s\n$TTL 3600\n@ SOA ns1 hostmaster 1 3600 600 604800 30\n@ NS ns1\nns1 A 10.97.0.1\n", origin > f
    for (n = 0; n < names; n++) printf "h%d A 10.%d.%d.%d\n", n, int(n / 65536) % 256, int(n / 256) % 256, n % 250 + 1 > f
    for (i = 0; i < 500000; i++) printf "h%d.%s A\n", int(rand() * names), origin > (dir "/queries")
}'

write_dnsplan_config() { # FILE XDP(0|1)
    cat > "$1" << EOF
data_dir = "$WORK/dnsplan/data-$2"
[dns]
listen = ["$SERVER:53"]
$([ "$2" = 1 ] && echo 'xdp = ["xa"]')
[dns.rrl]
enabled = false
[control]
listen = "127.0.0.1:0"
token = "0123456789abcdef0123456789abcdef"
[dns_zone]
origin = "$ORIGIN"
master_file = "$WORK/zone.db"
EOF
}
write_dnsplan_config "$WORK/dnsplan/xdp.toml" 1
write_dnsplan_config "$WORK/dnsplan/sockets.toml" 0
write_knot_config() { # FILE XDP(0|1)
    cat > "$1" << EOF
server:
    rundir: "$WORK/knot"
    listen: $SERVER@53
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1
$([ "$2" = 1 ] && printf 'xdp:\n    listen: xa@53\n    udp: on\n')
log:
  - target: stderr
    any: warning
database:
    storage: "$WORK/knot"
template:
  - id: default
    zonefile-sync: -1
    zonefile-load: whole
    journal-content: none
zone:
  - domain: $ORIGIN
    file: "$WORK/zone.db"
EOF
}
write_knot_config "$WORK/knot/xdp.conf" 1
write_knot_config "$WORK/knot/sockets.conf" 0
cat > "$WORK/nsd/nsd.conf" << EOF
server:
    ip-address: $SERVER@53
    server-count: 1
    username: ""
    chroot: ""
    database: ""
    pidfile: "$WORK/nsd/nsd.pid"
    xfrdfile: "$WORK/nsd/xfrd.state"
    zonelistfile: "$WORK/nsd/zone.list"
    xfrdir: "$WORK/nsd"
    zonefiles-write: 0
    minimal-responses: yes
    rrl-ratelimit: 0
    verbosity: 0
remote-control:
    control-enable: no
zone:
    name: $ORIGIN
    zonefile: "$WORK/zone.db"
EOF

command_of() {
    case $1 in
        dnsplan-xdp) echo "$BIN/dnsplan-authority --config $WORK/dnsplan/xdp.toml" ;;
        dnsplan) echo "$BIN/dnsplan-authority --config $WORK/dnsplan/sockets.toml" ;;
        knot-xdp) echo "knotd -c $WORK/knot/xdp.conf" ;;
        knot) echo "knotd -c $WORK/knot/sockets.conf" ;;
        nsd) echo "nsd -d -c $WORK/nsd/nsd.conf" ;;
    esac
}

answer_of() { # NAME
    ip netns exec "$CLI" dig @"$SERVER" +norec +short +time=1 +tries=1 "$1" A 2> /dev/null | grep -E '^[0-9.]+$' | sort || true
}

# Starts server $1 in the server namespace on core 0; waits until it answers the last name.
# Returns 1 (its log's end printed) when it exits at start.
start_server() {
    local server=$1 i
    # shellcheck disable=SC2046
    ip netns exec "$SRV" taskset -c 0 $(command_of "$server") > "$WORK/$server.log" 2>&1 &
    ROOT=$!
    PIDS="$PIDS $ROOT"
    for ((i = 0; ; i++)); do
        alive "$ROOT" || { echo "$server exited at start; the end of its log:" >&2; tail -4 "$WORK/$server.log" >&2; return 1; }
        [ -n "$(answer_of "h$((NAMES - 1)).$ORIGIN")" ] && break
        [ "$i" -lt $((LOAD_TIMEOUT_SECS * 10)) ] || { echo "$server does not answer after ${LOAD_TIMEOUT_SECS}s" >&2; exit 1; }
        sleep 0.1
    done
    pin_tree "$ROOT" 0
    case $server in
        dnsplan-xdp) grep -q "answering UDP over AF_XDP" "$WORK/$server.log" || { echo "dnsplan did not attach XDP:" >&2; grep -i xdp "$WORK/$server.log" >&2; exit 1; } ;;
    esac
}

core0_ticks() {
    awk '$1 == "cpu0" { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}

RESULTS=$WORK/results
# One dnsperf run against the running server: "load" $2 (a rate, or 0 for no limit).
measure() {
    local server=$1 rate=$2 round=$3 out c0 c1 limit=()
    out=$WORK/dnsperf.out
    [ "$rate" -gt 0 ] && limit=(-Q "$rate")
    c0=$(core0_ticks)
    ip netns exec "$CLI" taskset -c 1 dnsperf -s "$SERVER" -p 53 -d "$WORK/queries" -l "$DURATION" -c "$CLIENTS" -q "$OUTSTANDING" "${limit[@]}" -v > "$out" 2>&1 \
        || { echo "dnsperf failed against $server:" >&2; grep -v '^>' "$out" | tail -20 >&2; exit 1; }
    c1=$(core0_ticks)
    alive "$ROOT" || { echo "$server died during the run" >&2; exit 1; }
    awk -v server="$server" -v rate="$rate" -v round="$round" -v ticks=$((c1 - c0)) -v hz="$CLK_TCK" '
        $1 == ">" && NF == 5 { us = int($5 * 1e6 + 0.5); hist[us]++; n++; next }
        $1 == ">" { next }
        /Queries sent:/ { sent = $3 }
        /Queries completed:/ { completed = $3 }
        /Queries per second:/ { qps = $4 }
        END {
            if (completed == "" || qps == "") { print "no statistics from dnsperf" > "/dev/stderr"; exit 1 }
            want = n * 0.99; acc = 0; p99 = 0
            if (n > 0) { for (us = 0; acc < want; us++) acc += hist[us]; p99 = (us - 1) / 1000 }
            cpu = ticks / hz
            printf "%s %s %s %.0f %.0f %.2f %.3f %.0f\n", server, (rate > 0 ? rate : "max"), round, qps,
                (cpu > 0 ? completed / cpu : 0), (sent > 0 ? 100 * completed / sent : 0), p99, 100 * cpu / '"$DURATION"'
        }' "$out" >> "$RESULTS"
    rm -f "$out"
    tail -1 "$RESULTS" | awk '{ printf "  round %s %-11s load %-6s %8s q/s %9s q per core-0 CPU-s  answered %s%%  p99 %s ms  core 0 %s%%\n", $3, $1, $2, $4, $5, $6, $7, $8 }'
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r), commit $commit, $(date -u +%Y-%m-%d)"
echo "servers: dnsplan-authority, $(knotd --version | head -1), $(nsd -v 2>&1 | head -1); client $(dnsperf -h 2>&1 | grep -m1 Version)"
echo "zone: $ORIGIN, $NAMES names; veth between two namespaces; dnsperf -c $CLIENTS -q $OUTSTANDING, $DURATION s a run, at $RATE q/s and unlimited, $ROUNDS rounds"

# A server that cannot start here (Knot's XDP program on a kernel that refuses it) is left out
# of the run, said first; the others are measured.
available=""
for server in $SERVERS; do
    if ! start_server "$server"; then
        echo "$server: not measured (it does not start on this machine)"
        PIDS=${PIDS% "$ROOT"}
        continue
    fi
    available="$available $server"
    want=$(answer_of "h1.$ORIGIN")
    [ "$want" = "10.0.0.2" ] || { echo "$server answers h1 with '$want', not 10.0.0.2" >&2; exit 1; }
    stop_tree "$ROOT"
    PIDS=${PIDS% "$ROOT"}
done
SERVERS=$available
for ((round = 1; round <= ROUNDS; round++)); do
    for server in $SERVERS; do
        start_server "$server" || exit 1
        measure "$server" "$RATE" "$round"
        measure "$server" 0 "$round"
        stop_tree "$ROOT"
        PIDS=${PIDS% "$ROOT"}
    done
done

echo
REF=knot-xdp
case " $SERVERS " in *" knot-xdp "*) ;; *) REF=knot ;; esac
echo "| server | load | q/s | q per core-0 CPU-s | answered | p99 ms | / $REF |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
awk -v ref_server="$REF" '
    { key = $1 " " $2; qps[key] += $4; qcpu[key] += $5; ans[key] += $6; p99[key] = ($7 > p99[key] ? $7 : p99[key]); n[key]++
      if (!(key in seen)) { seen[key] = 1; order[++m] = key } }
    END {
        for (i = 1; i <= m; i++) { k = order[i]; split(k, f, " "); ref = ref_server " " f[2]
            printf "| %s | %s | %.0f | %.0f | %.2f%% | %.3f | %.2f |\n", f[1], f[2], qps[k] / n[k], qcpu[k] / n[k], ans[k] / n[k], p99[k],
                (qcpu[ref] > 0 ? (qcpu[k] / n[k]) / (qcpu[ref] / n[ref]) : 0) }
    }' "$RESULTS"
echo "(means over rounds; p99: the highest round's)"
