#!/usr/bin/env bash
# DNSSEC signing benchmark: a zone signed from nothing by dnsplan's authority and by Knot DNS,
# in the same run, with the same algorithm (ECDSA P-256 SHA-256, algorithm 13, NSEC), both
# cores each.
#
# One zone (sign.test.) of N names, name i with one A record, in a master file. Each server
# starts on it with signing on (dnsplan: `[dns_zone.dnssec]`; Knot: `dnssec-signing: on`, a
# policy of one combined key, `signing-threads: 2`) and is timed from its start until it
# answers the last name with DO=1 with an RRSIG: loading the zone and signing every RRset and
# the NSEC chain. The same start without signing gives each server's load alone, so the
# signing itself is the difference. Figures: wall seconds, CPU seconds of the server's
# process tree (utime+stime, /proc), RSS after signing; the ratio dnsplan/Knot. The servers
# take turns (dnsplan knot dnsplan knot ...) for --rounds rounds; each figure is the median.
#
# Then serving with DO=1 (--serve N names, default 100000; 0 skips it): dnsplan serving the
# zone it signs, against NSD serving the same signed zone (dnsplan's AXFR, pre-signed: NSD
# does not sign), each pinned to core 0 with dnsperf -D (DO=1) on core 1 for --duration
# seconds, taking turns for --rounds rounds. Two mixes: positives only, and 5% names that do
# not exist (NXDOMAIN with its NSEC proofs). Figures: answers per server CPU-second (median),
# the ratio to NSD, and the mean response size.
#
# Usage: bench/dnssec.sh [--sizes 100000,1000000] [--rounds N] [--serve N] [--duration SECS]
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=100000,1000000
ROUNDS=3
SERVE=100000
DURATION=10
usage() {
    echo "usage: bench/dnssec.sh [--sizes N[,N...]] [--rounds N] [--serve N] [--duration SECS]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --sizes) [ $# -ge 2 ] || usage; SIZES=$2; shift 2 ;;
        --rounds) [ $# -ge 2 ] || usage; ROUNDS=$2; shift 2 ;;
        --serve) [ $# -ge 2 ] || usage; SERVE=$2; shift 2 ;;
        --duration) [ $# -ge 2 ] || usage; DURATION=$2; shift 2 ;;
        -h | --help) usage ;;
        *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
[[ "$SIZES" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "--sizes: a comma-separated list of numbers" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] || { echo "--rounds: a number, at least 1" >&2; exit 2; }
[[ "$SERVE" =~ ^[0-9]+$ ]] || { echo "--serve: a number of names (0: no serving run)" >&2; exit 2; }
[[ "$DURATION" =~ ^[0-9]+$ ]] && [ "$DURATION" -ge 1 ] || { echo "--duration: a number of seconds" >&2; exit 2; }

ORIGIN=sign.test.
LOAD_TIMEOUT_SECS=1800
STOP_TIMEOUT_SECS=20
export PATH="$PATH:/usr/sbin:/sbin"

missing=""
for pair in knotd:knot keymgr:knot dig:bind9-dnsutils nsd:nsd dnsperf:dnsperf taskset:util-linux; do
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

cargo build --release -q -p dnsplan-authority -p dnsplan-cli --bin dnsplan-authority --bin dnsplan
BIN=$PWD/target/release
CLK_TCK=$(getconf CLK_TCK)
commit=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
git diff --quiet HEAD 2> /dev/null || commit="$commit+changes"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), commit $commit, $(date -u +%Y-%m-%d)" >&2
echo "servers: dnsplan-authority, $(knotd --version | head -1)" >&2

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

PORT=""
for ((p = 53631; p < 53631 + 200; p += 2)); do
    if ! port_busy $p && ! port_busy $((p + 1)); then PORT=$p; break; fi
done
[ -n "$PORT" ] || { echo "no two free consecutive ports from 53631 on" >&2; exit 1; }
CONTROL_PORT=$((PORT + 1))

# The zone file of $1 names.
zone_file() {
    local n=$1 file=$2
    {
        echo "\$ORIGIN $ORIGIN"
        echo "\$TTL 300"
        echo "@ IN SOA ns1 hostmaster 1 3600 600 604800 30"
        echo "@ IN NS ns1"
        echo "ns1 IN A 192.0.2.1"
        awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "h%d IN A 10.%d.%d.%d\n", i, int(i / 65536) % 256, int(i / 256) % 256, i % 256 }'
    } > "$file"
}

# Whether $1 (port) answers name $2 with an RRSIG (DO=1).
signed_answer() {
    dig @127.0.0.1 -p "$1" +norec +dnssec +time=1 +tries=1 "$2" A 2> /dev/null | grep -q "RRSIG"
}
# Whether $1 (port) answers name $2 with an address.
any_answer() {
    dig @127.0.0.1 -p "$1" +norec +short +time=1 +tries=1 "$2" A 2> /dev/null | grep -qE '^[0-9.]+$'
}

# Starts "$@" (logging to $LOG), waits until `$READY` (a function of the port and the last
# name) holds, and prints: wall seconds, CPU seconds, RSS in MB. Stops it.
RESULT=""
timed_start() {
    local ready=$1 last=$2 started pid i ticks rss now
    shift 2
    started=$(date +%s.%N)
    "$@" > "$LOG" 2>&1 &
    pid=$!
    PIDS="$PIDS $pid"
    for ((i = 0; i < LOAD_TIMEOUT_SECS * 50; i++)); do
        alive "$pid" || { echo "exited while loading; its log:" >&2; tail -20 "$LOG" >&2; exit 1; }
        "$ready" "$PORT" "$last" && break
        sleep 0.02
    done
    "$ready" "$PORT" "$last" || { echo "not ready within ${LOAD_TIMEOUT_SECS}s; its log:" >&2; tail -20 "$LOG" >&2; exit 1; }
    now=$(date +%s.%N)
    read -r ticks _ < <(tree_ticks "$pid")
    rss=$(tree_rss_kb "$pid")
    stop_tree "$pid"
    PIDS=${PIDS// $pid/}
    RESULT="$(echo "$now - $started" | bc -l) $(echo "$ticks / $CLK_TCK" | bc -l) $((rss / 1024))"
}

dnsplan_run() { # N SIGNED(0|1) -> RESULT
    local n=$1 signed=$2 dir=$WORK/dnsplan
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$WORK/zone.$n" "$dir/zone.db"
    cp "$WORK/zone.key" "$dir/zone.key"
    chmod 600 "$dir/zone.key"
    {
        echo "data_dir = \"$dir/data\""
        echo "[dns]"
        echo "listen = [\"127.0.0.1:$PORT\"]"
        echo "[control]"
        echo "listen = \"127.0.0.1:$CONTROL_PORT\""
        echo "token = \"bench-token-0123456789abcdef\""
        echo "[dns_zone]"
        echo "origin = \"$ORIGIN\""
        echo "master_file = \"zone.db\""
        [ "$signed" = 1 ] && printf '[dns_zone.dnssec]\nkey_file = "zone.key"\n'
    } > "$dir/authority.toml"
    LOG=$dir/log
    local ready=any_answer
    [ "$signed" = 1 ] && ready=signed_answer
    timed_start "$ready" "h$((n - 1)).$ORIGIN" "$BIN/dnsplan-authority" --config "$dir/authority.toml"
}

knot_run() { # N SIGNED(0|1) -> RESULT
    local n=$1 signed=$2 dir=$WORK/knot
    rm -rf "$dir"
    mkdir -p "$dir/zones" "$dir/db" "$dir/keys"
    cp "$WORK/zone.$n" "$dir/zones/sign.test.zone"
    cat > "$dir/knot.conf" << EOF
server:
    rundir: "$dir"
    listen: 127.0.0.1@$PORT
log:
  - target: stderr
    any: info
database:
    storage: "$dir/db"
keystore:
  - id: pemdir
    backend: pem
    config: "$dir/keys"
policy:
  - id: p256
    keystore: pemdir
    algorithm: ecdsap256sha256
    single-type-signing: on
    nsec3: off
    signing-threads: 2
    rrsig-lifetime: 14d
    rrsig-refresh: 7d
    ksk-lifetime: 0
    zsk-lifetime: 0
    manual: on
template:
  - id: default
    storage: "$dir/zones"
zone:
  - domain: $ORIGIN
    file: "sign.test.zone"
    zonefile-sync: -1
    zonefile-load: whole
    journal-content: none
EOF
    if [ "$signed" = 1 ]; then
        printf '    dnssec-signing: on\n    dnssec-policy: p256\n' >> "$dir/knot.conf"
        keymgr -c "$dir/knot.conf" "$ORIGIN" import-pem "$WORK/zone.key" algorithm=ecdsap256sha256 ksk=yes zsk=yes > /dev/null
    fi
    LOG=$dir/log
    local ready=any_answer
    [ "$signed" = 1 ] && ready=signed_answer
    timed_start "$ready" "h$((n - 1)).$ORIGIN" knotd -c "$dir/knot.conf"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# One key for both: dnsplan writes it; Knot imports the same PEM.
"$BIN/dnsplan" zone key new "$WORK/zone.key" --dns-zone "$ORIGIN" > /dev/null

echo "signing benchmark: zone $ORIGIN, ECDSA P-256 (13), NSEC, one combined key, both cores; $ROUNDS rounds (median)"
printf '%-9s %-8s %10s %10s %10s %10s %8s\n' names server "load s" "signed s" "sign s" "CPU s" "RSS MB"
IFS=, read -r -a sizes <<< "$SIZES"
for n in "${sizes[@]}"; do
    zone_file "$n" "$WORK/zone.$n"
    declare -A wall=() cpu=() plain=() rss=()
    for ((r = 0; r < ROUNDS; r++)); do
        for server in dnsplan knot; do
            "${server}_run" "$n" 0
            read -r w _ _ <<< "$RESULT"
            plain[$server]="${plain[$server]-} $w"
            "${server}_run" "$n" 1
            read -r w c m <<< "$RESULT"
            wall[$server]="${wall[$server]-} $w"
            cpu[$server]="${cpu[$server]-} $c"
            rss[$server]="${rss[$server]-} $m"
        done
    done
    declare -A med=()
    for server in dnsplan knot; do
        load=$(tr ' ' '\n' <<< "${plain[$server]}" | grep . | median)
        signed=$(tr ' ' '\n' <<< "${wall[$server]}" | grep . | median)
        c=$(tr ' ' '\n' <<< "${cpu[$server]}" | grep . | median)
        m=$(tr ' ' '\n' <<< "${rss[$server]}" | grep . | median)
        med[$server]=$signed
        printf '%-9s %-8s %10.2f %10.2f %10.2f %10.2f %8s\n' "$n" "$server" "$load" "$signed" "$(echo "$signed - $load" | bc -l)" "$c" "$m"
    done
    printf '%-9s dnsplan/knot, time to serve signed: %.2f\n' "$n" "$(echo "${med[dnsplan]} / ${med[knot]}" | bc -l)"
    rm -f "$WORK/zone.$n"
done

[ "$SERVE" -ge 1 ] || exit 0
[ "$(nproc)" -ge 2 ] || { echo "serving needs at least 2 cores (server on core 0, dnsperf on core 1)" >&2; exit 1; }

# Serving with DO=1: dnsplan (signing its zone) and NSD (serving dnsplan's signed AXFR).
n=$SERVE
zone_file "$n" "$WORK/zone.$n"
dir=$WORK/serve
rm -rf "$dir"
mkdir -p "$dir/nsd"
# The queries: positives, and the same with 5% names that do not exist.
awk -v n="$n" -v o="$ORIGIN" 'BEGIN { srand(7); for (i = 0; i < 500000; i++) printf "h%d.%s A\n", int(rand() * n), o }' > "$dir/pos"
awk -v n="$n" -v o="$ORIGIN" 'BEGIN { srand(8); for (i = 0; i < 500000; i++) { if (rand() < 0.05) printf "nx%d.%s A\n", i, o; else printf "h%d.%s A\n", int(rand() * n), o } }' > "$dir/nx"

# Waits until the server on $PORT serves the last name signed; $1 its pid, $2 its log.
wait_signed() {
    local i
    for ((i = 0; i < LOAD_TIMEOUT_SECS * 50; i++)); do
        alive "$1" || { echo "exited; its log:" >&2; tail -20 "$2" >&2; exit 1; }
        signed_answer "$PORT" "h$((n - 1)).$ORIGIN" && return
        sleep 0.02
    done
    echo "did not serve the signed zone within ${LOAD_TIMEOUT_SECS}s; its log:" >&2
    tail -20 "$2" >&2
    exit 1
}

# dnsplan's config for this zone (`dnsplan_run` writes it), transfers allowed from loopback
# (for NSD's copy), and its signed AXFR for NSD.
dnsplan_run "$n" 1
printf '[dns.transfer]\ntsig_required = false\n[[dns.transfer.secondaries]]\naddress = "127.0.0.1/32"\n' >> "$WORK/dnsplan/authority.toml"
cp "$WORK/zone.$n" "$WORK/dnsplan/zone.db"
"$BIN/dnsplan-authority" --config "$WORK/dnsplan/authority.toml" > "$dir/axfr.log" 2>&1 &
apid=$!
PIDS="$PIDS $apid"
wait_signed "$apid" "$dir/axfr.log"
# The AXFR without its closing SOA, which NSD would read as a second one.
dig @127.0.0.1 -p "$PORT" "$ORIGIN" AXFR +noall +answer | awk '$4 == "SOA" && seen++ { next } { print }' > "$dir/sign.test.zone"
stop_tree "$apid"
PIDS=${PIDS// $apid/}
grep -q RRSIG "$dir/sign.test.zone" || { echo "the AXFR has no signatures" >&2; exit 1; }
nsd_conf "$dir" "$PORT" "$ORIGIN" sign.test.zone

declare -A QPC=() SIZE=()
for ((r = 0; r < ROUNDS; r++)); do
    for server in dnsplan nsd; do
        if [ "$server" = dnsplan ]; then
            taskset -c 0 "$BIN/dnsplan-authority" --config "$WORK/dnsplan/authority.toml" > "$dir/dnsplan.log" 2>&1 &
        else
            taskset -c 0 nsd -d -c "$dir/nsd/nsd.conf" > "$dir/nsd.log" 2>&1 &
        fi
        spid=$!
        PIDS="$PIDS $spid"
        wait_signed "$spid" "$dir/$server.log"
        for mix in pos nx; do
            read -r t0 _ < <(tree_ticks "$spid")
            taskset -c 1 dnsperf -D -s 127.0.0.1 -p "$PORT" -d "$dir/$mix" -l "$DURATION" -c 8 -q 100 > "$dir/out" 2>&1 \
                || { echo "dnsperf failed against $server" >&2; tail -20 "$dir/out" >&2; exit 1; }
            read -r t1 _ < <(tree_ticks "$spid")
            completed=$(awk '/Queries completed:/ { print $3 }' "$dir/out")
            bytes=$(awk '/Average packet size:/ { print $NF }' "$dir/out")
            qpc=$(echo "$completed / (($t1 - $t0) / $CLK_TCK)" | bc -l)
            QPC[$server.$mix]="${QPC[$server.$mix]-} $qpc"
            SIZE[$server.$mix]=$bytes
            printf '  round %d %-8s %-4s %10.0f answers per CPU-s, %s bytes\n' "$r" "$server" "$mix" "$qpc" "$bytes" >&2
        done
        stop_tree "$spid"
        PIDS=${PIDS// $spid/}
    done
done
echo
echo "serving with DO=1: $n names, server on core 0, dnsperf -D on core 1, ${DURATION}s a run, $ROUNDS rounds (median)"
printf '%-5s %-8s %14s %10s %12s\n' mix server "answers/CPU-s" "vs NSD" "bytes/answer"
for mix in pos nx; do
    base=$(tr ' ' '\n' <<< "${QPC[nsd.$mix]}" | grep . | median)
    for server in dnsplan nsd; do
        m=$(tr ' ' '\n' <<< "${QPC[$server.$mix]}" | grep . | median)
        printf '%-5s %-8s %14.0f %10.2f %12s\n' "$mix" "$server" "$m" "$(echo "$m / $base" | bc -l)" "${SIZE[$server.$mix]}"
    done
done
