#!/usr/bin/env bash
# Many zones: dnsplan's authority against Knot DNS and NSD in the same run, each serving
# --zones static zones (default 10,000) of --names names (default 100: SOA, NS, the name
# server's address and A records) from master files, plus, for dnsplan, its (empty) managed
# zone. Each server is pinned to one core.
#
# Figures per server: seconds from the start until every zone answers (a sample of 100 zones
# spread over all of them, the last one included), for the first start and for a restart;
# RSS of the process tree once loaded; then --rounds runs of dnsperf (on the other core,
# --duration seconds each, the servers taking turns) over queries spread over every zone
# (each line a random existing name of a random zone): queries per second and per server
# CPU-second, and the ratio of that to NSD's in the same round; then each server's CPU over 5 s
# with no query (what its timers and its store cost at rest). For dnsplan alone: how long a
# zone added at run time (`PUT /v1/zones/{origin}`) takes until it answers, over 20 zones.
#
# With --managed, dnsplan's zones are zones its store manages (each with its own plans,
# fences, serial and directory), added at run time with `PUT /v1/managed/{zone}` (4 at a
# time) rather than static `[[zones]]`: "first start" is then from the start of an empty
# store until every zone is added and the sample answers (the adds per second are printed
# too), "restart" the start of the store holding them all; and the zones added at run time
# are added to the store the same way.
#
# With --etcd (implies --managed), dnsplan's store is etcd (one member on loopback, its data in
# the run's directory, started before and stopped after; Debian's etcd-server): the zones are
# added to etcd, and "restart" is the authority serving every zone kept on its disk while it
# reaches etcd and follows each zone's store again. etcd's own CPU is not counted in dnsplan's
# figures; its RSS is printed apart.
#
# Before measuring, the three must give the same answer for a sample of names.
#
# Usage: bench/zones.sh [--zones N] [--names N] [--duration SECS] [--rounds N] [--managed] [--etcd]
set -euo pipefail
cd "$(dirname "$0")/.."

ZONES=10000
NAMES=100
DURATION=15
ROUNDS=2
MANAGED=0
ETCD=0
usage() {
    echo "usage: bench/zones.sh [--zones N] [--names N] [--duration SECS] [--rounds N] [--managed] [--etcd]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --zones) [ $# -ge 2 ] || usage; ZONES=$2; shift 2 ;;
        --names) [ $# -ge 2 ] || usage; NAMES=$2; shift 2 ;;
        --duration) [ $# -ge 2 ] || usage; DURATION=$2; shift 2 ;;
        --rounds) [ $# -ge 2 ] || usage; ROUNDS=$2; shift 2 ;;
        --managed) MANAGED=1; shift ;;
        --etcd) MANAGED=1; ETCD=1; shift ;;
        -h | --help) usage ;;
        *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
for v in "$ZONES" "$NAMES" "$DURATION" "$ROUNDS"; do
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -ge 1 ] || { echo "every argument is a number, at least 1" >&2; exit 2; }
done
[ "$NAMES" -ge 4 ] || { echo "--names: at least 4 (SOA, NS, the server's address and one more)" >&2; exit 2; }

SERVERS="dnsplan knot nsd"
CLIENTS=8
OUTSTANDING=100
QUERY_LINES=500000
LOAD_TIMEOUT_SECS=600
STOP_TIMEOUT_SECS=20
ADDS=20
export PATH="$PATH:/usr/sbin:/sbin"

missing=""
needed="dnsperf:dnsperf knotd:knot nsd:nsd dig:bind9-dnsutils taskset:util-linux curl:curl"
[ "$ETCD" = 0 ] || needed="$needed etcd:etcd-server"
for pair in $needed; do
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

cargo build --release -q -p dnsplan-authority --bin dnsplan-authority
BIN=$PWD/target/release
CLK_TCK=$(getconf CLK_TCK)
commit=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
git diff --quiet HEAD 2> /dev/null || commit="$commit+changes"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), commit $commit, $(date -u +%Y-%m-%d)"
echo "servers: dnsplan-authority, $(knotd --version | head -1), $(nsd -v 2>&1 | head -1); client $(dnsperf -h 2>&1 | grep -m1 Version)"
echo "zones: $ZONES of $NAMES names; dnsperf $DURATION s x $ROUNDS rounds$([ "$MANAGED" = 1 ] && echo "; dnsplan's zones managed by its store")$([ "$ETCD" = 1 ] && echo ", on etcd")"

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

# Below the ephemeral ports: the thousands of connections of a --managed run leave source
# ports in use that a server started after it could not bind.
EPHEMERAL_LOW=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
FIRST=$((EPHEMERAL_LOW > 21000 ? EPHEMERAL_LOW - 1000 : 20000))
BASE=""
for ((base = FIRST; base < FIRST + 400; base += 4)); do
    if ! port_busy $base && ! port_busy $((base + 1)) && ! port_busy $((base + 2)) && ! port_busy $((base + 3)); then
        BASE=$base
        break
    fi
done
[ -n "$BASE" ] || { echo "no four free consecutive ports from $FIRST on" >&2; exit 1; }
declare -A PORT=([dnsplan]=$BASE [knot]=$((BASE + 1)) [nsd]=$((BASE + 2)))
CONTROL_PORT=$((BASE + 3))
ETCD_PORTS=""
if [ "$ETCD" = 1 ]; then
    for ((base = BASE + 4; base < FIRST + 400; base += 2)); do
        if ! port_busy $base && ! port_busy $((base + 1)); then
            ETCD_PORTS="$base $((base + 1))"
            break
        fi
    done
    [ -n "$ETCD_PORTS" ] || { echo "no two free ports for etcd" >&2; exit 1; }
fi
TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
declare -A ROOT

# The zones, their lists in each server's config and the queries, by one awk.
mkdir -p "$WORK/zones" "$WORK/knot" "$WORK/nsd" "$WORK/dnsplan"
awk -v zones="$ZONES" -v names="$NAMES" -v dir="$WORK" -v lines="$QUERY_LINES" 'BEGIN {
    srand(7)
    for (z = 0; z < zones; z++) {
        origin = "z" z ".bench."
        f = dir "/zones/" origin "zone"
        printf "$ORIGIN %s\n$TTL 3600\n@ SOA ns1 hostmaster 1 3600 600 604800 30\n@ NS ns1\nns1 A 192.0.2.1\n", origin > f
        for (n = 0; n < names - 3; n++) printf "h%d A 10.%d.%d.%d\n", n, int(z / 256) % 256, z % 256, n % 250 + 1 > f
        close(f)
        printf "[[zones]]\norigin = \"%s\"\nmaster_file = \"%s\"\n", origin, f > (dir "/dnsplan/zones.toml")
        printf "  - domain: %s\n    file: \"%s\"\n", origin, f > (dir "/knot/zones.conf")
        printf "zone:\n    name: %s\n    zonefile: \"%s\"\n", origin, f > (dir "/nsd/zones.conf")
    }
    for (i = 0; i < lines; i++) printf "h%d.z%d.bench. A\n", int(rand() * (names - 3)), int(rand() * zones) > (dir "/queries")
}'
LAST="h0.z$((ZONES - 1)).bench."

cat > "$WORK/dnsplan/authority.toml" << EOF
data_dir = "$WORK/dnsplan/data"
[dns]
listen = ["127.0.0.1:${PORT[dnsplan]}"]
[dns.rrl]
enabled = false
[control]
listen = "127.0.0.1:$CONTROL_PORT"
token = "$TOKEN"
[dns_zone]
origin = "managed.bench-only."
ns = ["ns1.managed.bench-only."]
[dns_zone.soa]
mname = "ns1.managed.bench-only."
rname = "hostmaster.managed.bench-only."
EOF
[ "$MANAGED" = 1 ] || cat "$WORK/dnsplan/zones.toml" >> "$WORK/dnsplan/authority.toml"
if [ "$ETCD" = 1 ]; then
    read -r ETCD_CLIENT ETCD_PEER <<< "$ETCD_PORTS"
    etcd --name bench --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
        --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT" --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-cluster "bench=http://127.0.0.1:$ETCD_PEER" \
        --quota-backend-bytes 8589934592 > "$WORK/etcd.log" 2>&1 &
    ETCD_PID=$!
    PIDS="$PIDS $ETCD_PID"
    for ((i = 0; ; i++)); do
        curl -sf "http://127.0.0.1:$ETCD_CLIENT/health" > /dev/null && break
        [ "$i" -lt 200 ] || { echo "etcd did not start; its log:" >&2; tail -20 "$WORK/etcd.log" >&2; exit 1; }
        sleep 0.05
    done
    printf '[store]\nkind = "etcd"\nendpoints = ["http://127.0.0.1:%s"]\nprefix = "/bench/"\n' "$ETCD_CLIENT" >> "$WORK/dnsplan/authority.toml"
fi
cat > "$WORK/knot/knot.conf" << EOF
server:
    listen: 127.0.0.1@${PORT[knot]}
    rundir: "$WORK/knot"
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1
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
EOF
cat "$WORK/knot/zones.conf" >> "$WORK/knot/knot.conf"
cat > "$WORK/nsd/nsd.conf" << EOF
server:
    ip-address: 127.0.0.1@${PORT[nsd]}
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
EOF
cat "$WORK/nsd/zones.conf" >> "$WORK/nsd/nsd.conf"

answers() { # PORT NAME
    dig @127.0.0.1 -p "$1" +norec +short +time=1 +tries=1 "$2" A 2> /dev/null | grep -E '^[0-9.]+$' | sort || true
}

# A name of every ZONES/100-th zone and of the last: every one must answer for "ready".
SAMPLE=$(awk -v zones="$ZONES" 'BEGIN { step = int(zones / 100); if (step < 1) step = 1; for (z = 0; z < zones; z += step) print "h0.z" z ".bench."; print "h0.z" zones - 1 ".bench." }')

# Adds zone $1 (origin) to dnsplan's store with master file $2.
add_managed() {
    curl -sf -X PUT -H "Authorization: Bearer $TOKEN" --data-binary @"$2" "http://127.0.0.1:$CONTROL_PORT/v1/managed/$1" > /dev/null \
        || { echo "PUT /v1/managed/$1 failed" >&2; return 1; }
}

# Starts server $1 (command in the rest) on core 0; sets READY to the seconds until every
# sampled zone answers (and ROOT, PIDS: not in a subshell). With MANAGED and an empty store,
# dnsplan's zones are added first, 4 at a time (ADDS_PER_SEC says how fast).
start_server() {
    local server=$1 started pid i name
    shift
    started=$(date +%s.%N)
    taskset -c 0 "$@" > "$WORK/$server.log" 2>&1 &
    pid=$!
    PIDS="$PIDS $pid"
    ROOT[$server]=$pid
    if [ "$server" = dnsplan ] && [ "$MANAGED" = 1 ] && [ ! -e "$WORK/dnsplan/added" ]; then
        until curl -sf "http://127.0.0.1:$CONTROL_PORT/readyz" > /dev/null; do
            alive "$pid" || { echo "dnsplan exited at start; its log:" >&2; tail -20 "$WORK/$server.log" >&2; exit 1; }
            sleep 0.05
        done
        local adds_started
        adds_started=$(date +%s.%N)
        export -f add_managed
        export TOKEN CONTROL_PORT
        awk -v zones="$ZONES" -v dir="$WORK/zones" 'BEGIN { for (z = 0; z < zones; z++) print "z" z ".bench. " dir "/z" z ".bench.zone" }' \
            | xargs -P 4 -n 2 bash -c 'add_managed "$0" "$1"' || { echo "adding the zones failed" >&2; exit 1; }
        ADDS_PER_SEC=$(awk -v n="$ZONES" -v a="$adds_started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", n / (b - a) }')
        touch "$WORK/dnsplan/added"
    fi
    for name in $SAMPLE; do
        for ((i = 0; ; i++)); do
            alive "$pid" || { echo "$server exited while loading; its log:" >&2; grep -v "^ *[0-9]*: \|^ *at " "$WORK/$server.log" | tail -20 >&2; exit 1; }
            [ -n "$(answers "${PORT[$server]}" "$name")" ] && break
            [ "$i" -lt $((LOAD_TIMEOUT_SECS * 20)) ] || { echo "$server does not answer $name after ${LOAD_TIMEOUT_SECS}s" >&2; exit 1; }
            sleep 0.05
        done
    done
    READY=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
}

declare -A FIRST RESTART RSS IDLE
IDLE_SECS=5
for server in $SERVERS; do
    case $server in
        dnsplan) cmd=("$BIN/dnsplan-authority" --config "$WORK/dnsplan/authority.toml") ;;
        knot) cmd=(knotd -c "$WORK/knot/knot.conf") ;;
        nsd) cmd=(nsd -d -c "$WORK/nsd/nsd.conf") ;;
    esac
    start_server "$server" "${cmd[@]}"
    FIRST[$server]=$READY
    stop_tree "${ROOT[$server]}"
    start_server "$server" "${cmd[@]}"
    RESTART[$server]=$READY
    RSS[$server]=$(awk -v kb="$(tree_rss_kb "${ROOT[$server]}")" 'BEGIN { printf "%.0f", kb / 1024 }')
    echo "$server: ready in ${FIRST[$server]} s (first start), ${RESTART[$server]} s (restart); RSS ${RSS[$server]} MB" >&2
    [ "$server" = dnsplan ] && [ "$ETCD" = 1 ] && echo "etcd (apart from dnsplan): RSS $(awk -v kb="$(tree_rss_kb "$ETCD_PID")" 'BEGIN { printf "%.0f", kb / 1024 }') MB, data $(du -sm "$WORK/etcd" | cut -f1) MB" >&2
    [ "$server" = dnsplan ] && [ "$MANAGED" = 1 ] && echo "dnsplan: $ZONES zones added to its store at $ADDS_PER_SEC a second" >&2
done

for name in h1.z0.bench. "h$((NAMES - 4)).z$((ZONES / 2)).bench." "$LAST"; do
    want=$(answers "${PORT[nsd]}" "$name")
    [ -n "$want" ] || { echo "nsd does not answer $name" >&2; exit 1; }
    for server in dnsplan knot; do
        got=$(answers "${PORT[$server]}" "$name")
        [ "$got" = "$want" ] || { echo "$server answers $name with [$got], nsd with [$want]" >&2; exit 1; }
    done
done

# One dnsperf run against $1 on core 1; prints "qps q_per_cpu_s".
measure() {
    local server=$1 out=$WORK/dnsperf.out t0 t1 u
    read -r t0 u <<< "$(tree_ticks "${ROOT[$server]}")"
    taskset -c 1 dnsperf -s 127.0.0.1 -p "${PORT[$server]}" -d "$WORK/queries" -l "$DURATION" -c "$CLIENTS" -q "$OUTSTANDING" > "$out" 2>&1 \
        || { echo "dnsperf failed against $server:" >&2; tail -20 "$out" >&2; exit 1; }
    read -r t1 u <<< "$(tree_ticks "${ROOT[$server]}")"
    awk -v ticks=$((t1 - t0)) -v hz="$CLK_TCK" '
        /Queries completed:/ { completed = $3 }
        /Queries per second:/ { qps = $4 }
        /Response codes:/ { if ($0 !~ /NOERROR [0-9]+ \(100/) bad = $0 }
        END {
            if (bad != "") print "answers were not all NOERROR: " bad > "/dev/stderr"
            printf "%.0f %.0f\n", qps, (ticks > 0 ? completed / (ticks / hz) : 0)
        }' "$out"
}

declare -A QPS PER_CPU
RATIOS=""
for ((round = 1; round <= ROUNDS; round++)); do
    for server in $SERVERS; do
        read -r QPS[$server] PER_CPU[$server] <<< "$(measure "$server")"
        echo "  round $round $server: ${QPS[$server]} q/s, ${PER_CPU[$server]} q/cpu-s" >&2
    done
    RATIOS="$RATIOS $(awk -v a="${PER_CPU[dnsplan]}" -v b="${PER_CPU[nsd]}" 'BEGIN { printf "%.2f", a / b }')"
    echo "  round $round: dnsplan/nsd q/cpu-s $(echo "$RATIOS" | awk '{ print $NF }'), knot/nsd $(awk -v a="${PER_CPU[knot]}" -v b="${PER_CPU[nsd]}" 'BEGIN { printf "%.2f", a / b }')" >&2
done

# CPU while no query comes, once every server has settled after the rounds (timers, the
# store followed): counted in every q per CPU-s above.
for server in $SERVERS; do
    read -r t0 _ <<< "$(tree_ticks "${ROOT[$server]}")"
    sleep "$IDLE_SECS"
    read -r t1 _ <<< "$(tree_ticks "${ROOT[$server]}")"
    IDLE[$server]=$(awk -v t=$((t1 - t0)) -v hz="$CLK_TCK" -v s="$IDLE_SECS" 'BEGIN { printf "%.1f", 100 * t / hz / s }')
    echo "$server: idle ${IDLE[$server]}% of a core" >&2
done

# Zones added at run time: from the PUT until the zone answers.
ADD_MS=""
for ((i = 0; i < ADDS; i++)); do
    origin="added$i.bench."
    sed "s/^\$ORIGIN .*/\$ORIGIN $origin/" "$WORK/zones/z0.bench.zone" > "$WORK/added.zone"
    started=$(date +%s%N)
    if [ "$MANAGED" = 1 ]; then
        add_managed "$origin" "$WORK/added.zone" || exit 1
    else
        curl -sf -X PUT -H "Authorization: Bearer $TOKEN" --data-binary @"$WORK/added.zone" "http://127.0.0.1:$CONTROL_PORT/v1/zones/$origin" > /dev/null \
            || { echo "PUT /v1/zones/$origin failed" >&2; exit 1; }
    fi
    until [ -n "$(answers "${PORT[dnsplan]}" "h0.$origin")" ]; do
        [ $(($(date +%s%N) - started)) -lt 10000000000 ] || { echo "added zone $origin does not answer after 10 s" >&2; exit 1; }
    done
    ADD_MS="$ADD_MS $((($(date +%s%N) - started) / 1000))"
done
ADDED=$(echo "$ADD_MS" | tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { printf "median %.1f ms, max %.1f ms", v[int((NR + 1) / 2)] / 1000, v[NR] / 1000 }')

echo
echo "| server | ready, first start (s) | ready, restart (s) | RSS (MB) | idle CPU (% of a core) | q/s (last round) | q per CPU-s (last round) |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for server in $SERVERS; do
    echo "| $server | ${FIRST[$server]} | ${RESTART[$server]} | ${RSS[$server]} | ${IDLE[$server]} | ${QPS[$server]} | ${PER_CPU[$server]} |"
done
echo
echo "dnsplan / nsd, queries per CPU-second, by round:$RATIOS"
if [ "$MANAGED" = 1 ]; then
    echo "dnsplan's zones added to its store at $ADDS_PER_SEC a second (4 at a time)"
    echo "a zone added to the store at run time answers after: $ADDED (the add included: its trees created, the registry written and flushed)"
else
    echo "a zone added at run time answers after: $ADDED (the add included: the master file written and fsynced)"
fi
