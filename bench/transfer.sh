#!/usr/bin/env bash
# Zone transfer benchmark: AXFR and IXFR from dnsplan's authority against Knot DNS as a
# primary of the same zone, in the same run.
#
# One zone (bench.test.) of N managed names, name i with 2 + i%3 A records, is served by the
# dnsplan authority (plan 1 applied through its store, with `[dns.transfer]` allowing
# 127.0.0.1 with a TSIG key) and by Knot from the same zone as a file, with the same SOA
# serial and the same key. Both servers are pinned to core 0, kdig to core 1.
#
# AXFR: first each server's AXFR is listed in full and the two must hold the same records
# (every record line, normalised and sorted, compared). Then the two servers take turns
# (dnsplan, Knot, dnsplan, Knot ...) for --rounds rounds (default 3), kdig reading, checking
# and counting every message without printing it. Figures per transfer: wall time (as kdig
# reports it: query sent to last message read; kdig's own work is most of it at 1,000,000
# names), the server's CPU time over the transfer (every thread of its process tree, from
# /proc/PID/task/TID/schedstat), bytes, messages and records as kdig counts them.
#
# IXFR: a plan changing 1% of the endpoints (every 100th in name order, each changed
# endpoint's every address changed) is published and applied through dnsplan's control API
# (chaos/src/bin/dns-bench-change.rs, as a separate enactor would). Knot gets the same change
# as a new zone file with the serial dnsplan now serves, reloaded with `zonefile-load:
# difference` and `journal-content: changes`, so it computes the difference and keeps it in
# its journal. Both then answer IXFR from the serial before the change: listed once (the two
# must delete and add the same records), then taking turns for --rounds rounds, as above.
#
# Every figure is the median over rounds; the ratio is dnsplan's median over Knot's.
#
# The dnsplan side is built from the work tree (the commit is printed, "+changes" when the
# tree differs from it); Knot and kdig come from the distribution.
#
# Usage: bench/transfer.sh [--sizes 10000,1000000] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=1000000
ROUNDS=3
usage() {
    echo "usage: bench/transfer.sh [--sizes N[,N...]] [--rounds N]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --sizes) [ $# -ge 2 ] || usage; SIZES=$2; shift 2 ;;
        --rounds) [ $# -ge 2 ] || usage; ROUNDS=$2; shift 2 ;;
        -h | --help) usage ;;
        *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
[[ "$SIZES" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "--sizes: a comma-separated list of numbers" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] || { echo "--rounds: a number, at least 1" >&2; exit 2; }

ORIGIN=bench.test.
SERVERS="dnsplan knot"
CHANGE_EVERY=100          # 1% of the endpoints change
KEY_NAME=bench-xfr.
SEED_TIMEOUT_SECS=1800    # the seed of 1,000,000 names takes under a minute on a quiet machine
LOAD_TIMEOUT_SECS=1200
CHANGE_TIMEOUT_SECS=900   # read plan 1, publish plan 2, apply 1% through the control API
XFR_TIMEOUT_SECS=600      # one transfer, whatever its size
STOP_TIMEOUT_SECS=20
export PATH="$PATH:/usr/sbin:/sbin"

# The tools, installed from the distribution only when a binary is missing.
missing=""
for pair in kdig:knot-dnsutils knotd:knot knotc:knot dig:bind9-dnsutils taskset:util-linux timeout:coreutils; do
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
[ "$(nproc)" -ge 2 ] || { echo "needs at least 2 cores (servers on core 0, kdig on core 1)" >&2; exit 1; }

cargo build --release -q -p dnsplan-authority -p dnsplan-chaos --bin dnsplan-authority --bin dns-bench-seed --bin dns-bench-change
BIN=$PWD/target/release
commit=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
git diff --quiet HEAD 2> /dev/null || commit="$commit+changes"
MACHINE="machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), commit $commit, $(date -u +%Y-%m-%d)"
VERSIONS="servers: dnsplan-authority, $(knotd --version | head -1); client $(kdig --version | head -1)"
echo "$MACHINE" >&2
echo "$VERSIONS" >&2

WORK=$(mktemp -d)
PIDS=""
# shellcheck source=bench/lib.sh
. bench/lib.sh

# CPU time of the tree rooted at $1 in nanoseconds: the run time of every thread of every live
# process (/proc/PID/task/TID/schedstat), finer than the 10 ms ticks of /proc/PID/stat, which
# an IXFR of tens of milliseconds needs. The servers keep their threads across a transfer.
tree_cpu_ns() {
    local pid
    # shellcheck disable=SC2046
    for pid in $(tree_pids "$1"); do
        cat /proc/"$pid"/task/*/schedstat 2> /dev/null || true
    done | awk '{ t += $1 } END { printf "%.0f\n", t }'
}

cleanup() {
    local pid
    for pid in $PIDS; do stop_tree "$pid"; done
    PIDS=""
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Three consecutive free ports from 53631 on: dnsplan, Knot, dnsplan's control API.
BASE=""
for ((base = 53631; base < 53631 + 300; base += 3)); do
    if ! port_busy $base && ! port_busy $((base + 1)) && ! port_busy $((base + 2)); then
        BASE=$base
        break
    fi
done
[ -n "$BASE" ] || { echo "no three free consecutive ports from 53631 on" >&2; exit 1; }
declare -A PORT=([dnsplan]=$BASE [knot]=$((BASE + 1)))
CONTROL_PORT=$((BASE + 2))
declare -A ROOT

answers() { # PORT NAME: the sorted addresses, or nothing
    dig @127.0.0.1 -p "$1" +norec +short +time=1 +tries=1 "$2" A 2> /dev/null | grep -E '^[0-9.]+$' | sort || true
}
soa() { # PORT: the SOA's rdata, or nothing
    dig @127.0.0.1 -p "$1" +norec +short +time=1 +tries=1 "$ORIGIN" SOA 2> /dev/null | grep -E '^[^;]+ [0-9]+ [0-9]+ [0-9]+ [0-9]+ [0-9]+$' || true
}
serial() { # PORT
    soa "$1" | awk '{ print $3 }'
}
serves_serial() { # PORT SERIAL
    [ "$(serial "$1")" = "$2" ]
}

# Waits up to $2 seconds until command $3... succeeds; fails with message $1.
wait_until() {
    local what=$1 secs=$2 i
    shift 2
    for ((i = 0; i < secs * 4; i++)); do
        "$@" && return 0
        sleep 0.25
    done
    echo "$what after ${secs}s" >&2
    exit 1
}

# Starts server $1 (command in the rest) pinned to core 0 and waits until name $3 answers.
start_server() {
    local server=$1 dir=$2 last=$3 pid i
    shift 3
    taskset -c 0 "$@" > "$dir/$server.log" 2>&1 &
    pid=$!
    PIDS="$PIDS $pid"
    ROOT[$server]=$pid
    for ((i = 0; i < LOAD_TIMEOUT_SECS * 4; i++)); do
        if ! alive "$pid"; then
            echo "$server exited while loading; its log:" >&2
            tail -20 "$dir/$server.log" >&2
            exit 1
        fi
        [ -n "$(answers "${PORT[$server]}" "$last")" ] && break
        sleep 0.25
    done
    [ -n "$(answers "${PORT[$server]}" "$last")" ] || { echo "$server does not answer $last after ${LOAD_TIMEOUT_SECS}s" >&2; exit 1; }
}

# Every record of a kdig transfer listing, one normalised line each (owner lower-cased,
# fields separated by one space), TSIG left out; the SOA that closes the transfer is dropped
# and, for an IXFR, each record is prefixed by its part: "del" or "add" (RFC 1995: the new
# SOA, then for each difference the old SOA and what it deletes, the new SOA and what it adds).
normalise() { # FILE KIND (axfr|ixfr)
    awk -v kind="$2" '
        /^;/ || NF < 4 { next }
        $4 == "TSIG" { next }
        {
            line = tolower($1); for (i = 2; i <= NF; i++) line = line " " $i
            n++; rec[n] = line; type[n] = $4
        }
        END {
            if (n < 2 || type[1] != "SOA" || type[n] != "SOA") { print "not a transfer: no SOA first and last" > "/dev/stderr"; exit 1 }
            if (kind == "axfr") { for (i = 1; i < n; i++) print rec[i]; exit }
            part = "new"; soas = 0
            for (i = 2; i < n; i++) {
                if (type[i] == "SOA") { soas++; part = soas % 2 ? "del" : "add" }
                print part " " rec[i]
            }
        }' "$1" | LC_ALL=C sort
}

# One transfer from $1 of kind $2 (AXFR or IXFR=serial) by kdig on core 1, its output (with
# the records listed when $4 is "list") to file $3; fails on any error.
kdig_transfer() {
    local server=$1 kind=$2 out=$3 display=(+noall +stats)
    [ "$4" != list ] || display=()
    timeout "$XFR_TIMEOUT_SECS" taskset -c 1 kdig @127.0.0.1 -p "${PORT[$server]}" -y "hmac-sha256:$KEY_NAME:$SECRET" +time=30 +retry=0 \
        "${display[@]}" "$ORIGIN" "$kind" > "$out" 2>&1 || { echo "kdig $kind from $server failed:" >&2; tail -5 "$out" >&2; exit 1; }
    alive "${ROOT[$server]}" || { echo "$server died during the transfer" >&2; exit 1; }
    grep -q '^;; Received' "$out" || { echo "kdig $kind from $server: no statistics:" >&2; tail -5 "$out" >&2; exit 1; }
    if grep -qiE '^;; (ERROR|WARNING)|status: (REFUSED|NOTAUTH|SERVFAIL)' "$out"; then
        echo "kdig $kind from $server:" >&2; grep -iE '^;; (ERROR|WARNING)|status:' "$out" | head -5 >&2; exit 1
    fi
}

# One measured transfer (the records not listed: kdig reads, checks and counts every message
# without printing 3,000,000 lines, so the time is the server's more than the client's).
# Appends a result line to $RESULTS:
# size kind server round wall_ms server_cpu_ms bytes messages records
transfer() {
    local server=$1 kind=$2 size=$3 round=$4 out=$WORK/kdig.out t0 t1 stats
    t0=$(tree_cpu_ns "${ROOT[$server]}")
    kdig_transfer "$server" "$kind" "$out" stats
    t1=$(tree_cpu_ns "${ROOT[$server]}")
    stats=$(awk '
        /^;; Received/ { bytes = $3; msgs = $5; sub(/^\(/, "", msgs); recs = $7 }
        /^;; From / { for (i = 1; i <= NF; i++) if ($i == "in") ms = $(i + 1) }
        END { print ms, bytes, msgs, recs }' "$out")
    # shellcheck disable=SC2086
    set -- $stats
    [ $# -eq 4 ] || { echo "kdig $kind from $server: statistics not understood:" >&2; cat "$out" >&2; exit 1; }
    rm -f "$out"
    echo "$size ${kind%%=*} $server $round $1 $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) / 1e6 }') $2 $3 $4" >> "$RESULTS"
    tail -1 "$RESULTS" | awk '{ printf "  round %s %s %-8s %9.1f ms  server cpu %7.1f ms  %11s B  %6s messages  %8s records\n", $4, $2, $3, $5, $6, $7, $8, $9 }' >&2
}

RESULTS=$WORK/results
CHANGES=$WORK/changes
: > "$RESULTS"
: > "$CHANGES"
TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
SECRET=$(head -c 32 /dev/urandom | base64)

for size in ${SIZES//,/ }; do
    [ "$size" -ge 1 ] || { echo "--sizes: sizes must be at least 1" >&2; exit 2; }
    dir=$WORK/$size
    mkdir -p "$dir/store" "$dir/knot" "$dir/knot-zones"
    echo "size $size: seeding" >&2
    timeout "$SEED_TIMEOUT_SECS" "$BIN/dns-bench-seed" --data-dir "$dir/store" --names "$size" --origin "$ORIGIN" \
        --zone-file "$dir/bench.test.zone" --static-zone-file "$dir/static.zone" \
        --queries-positive "$dir/queries-pos" --queries-nx "$dir/queries-nx" --queries 1 2> "$dir/seed.log" \
        || { cat "$dir/seed.log" >&2; exit 1; }
    sed 's/^/  /' "$dir/seed.log" >&2
    changed_max=$(((size + CHANGE_EVERY - 1) / CHANGE_EVERY))

    cat > "$dir/authority.toml" << EOF
data_dir = "$dir/store"

[dns]
listen = ["127.0.0.1:${PORT[dnsplan]}"]

[dns.transfer]
ixfr_history_names_max = $((changed_max > 100000 ? changed_max : 100000))

[[dns.transfer.keys]]
name = "$KEY_NAME"
secret = "$SECRET"

[[dns.transfer.secondaries]]
address = "127.0.0.1"
key = "$KEY_NAME"

[control]
listen = "127.0.0.1:$CONTROL_PORT"
token = "$TOKEN"

[dns_zone]
origin = "$ORIGIN"
master_file = "static.zone"
EOF
    last="e$((size - 1)).$ORIGIN"
    echo "size $size: starting the servers" >&2
    start_server dnsplan "$dir" "$last" env RUST_LOG=info "$BIN/dnsplan-authority" --config "$dir/authority.toml"
    serial_before=$(serial "${PORT[dnsplan]}")
    [ -n "$serial_before" ] || { echo "dnsplan answers no SOA" >&2; exit 1; }

    # Knot serves the seed's zone file with dnsplan's serial, so that both SOAs are alike.
    sed "s/^\(@ [0-9]* IN SOA [^ ]* [^ ]* \)[0-9]* /\1$serial_before /" "$dir/bench.test.zone" > "$dir/knot-zones/bench.test.zone"
    cat > "$dir/knot/knot.conf" << EOF
server:
    listen: 127.0.0.1@${PORT[knot]}
    rundir: "$dir/knot"
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1
control:
    listen: "$dir/knot/knot.sock"
log:
  - target: stderr
    any: info
database:
    storage: "$dir/knot"
key:
  - id: $KEY_NAME
    algorithm: hmac-sha256
    secret: $SECRET
acl:
  - id: bench-transfer
    address: 127.0.0.1
    key: $KEY_NAME
    action: transfer
template:
  - id: default
    storage: "$dir/knot-zones"
    file: "%s.zone"
    zonefile-sync: -1
    zonefile-load: difference
    journal-content: changes
zone:
  - domain: $ORIGIN
    acl: bench-transfer
EOF
    start_server knot "$dir" "$last" knotd -c "$dir/knot/knot.conf"
    [ "$(soa "${PORT[knot]}")" = "$(soa "${PORT[dnsplan]}")" ] \
        || { echo "the SOAs differ: dnsplan [$(soa "${PORT[dnsplan]}")], knot [$(soa "${PORT[knot]}")]" >&2; exit 1; }

    echo "size $size: AXFR, serial $serial_before" >&2
    # The two AXFRs, listed in full, must hold the same records before anything is measured.
    for server in $SERVERS; do
        kdig_transfer "$server" AXFR "$dir/axfr-$server" list
        normalise "$dir/axfr-$server" axfr > "$dir/axfr-$server.sorted"
        rm -f "$dir/axfr-$server"
    done
    cmp -s "$dir/axfr-dnsplan.sorted" "$dir/axfr-knot.sorted" || {
        echo "the two AXFRs differ (dnsplan <, knot >):" >&2
        diff "$dir/axfr-dnsplan.sorted" "$dir/axfr-knot.sorted" | head -10 >&2
        exit 1
    }
    echo "  the two AXFRs hold the same $(wc -l < "$dir/axfr-knot.sorted") records (the closing SOA aside)" >&2
    rm -f "$dir"/axfr-*.sorted
    for ((round = 1; round <= ROUNDS; round++)); do
        for server in $SERVERS; do transfer "$server" AXFR "$size" "$round"; done
    done

    echo "size $size: changing 1 in $CHANGE_EVERY endpoints" >&2
    changed=$(timeout "$CHANGE_TIMEOUT_SECS" "$BIN/dns-bench-change" --control "http://127.0.0.1:$CONTROL_PORT" --token "$TOKEN" \
        --every "$CHANGE_EVERY" --zone-body "$dir/zone-body" 2> "$dir/change.log") || { cat "$dir/change.log" >&2; exit 1; }
    sed 's/^/  /' "$dir/change.log" >&2
    # The serial counts applied changes: every changed endpoint adds one.
    serial_after=$(((serial_before + changed) % 4294967296))
    wait_until "dnsplan does not serve serial $serial_after" "$LOAD_TIMEOUT_SECS" serves_serial "${PORT[dnsplan]}" "$serial_after"
    # Knot's new zone file: the seed's header (everything before the first managed name) with
    # the new serial, then every endpoint of the new plan.
    {
        awk '/^e[0-9]/ { exit } { print }' "$dir/bench.test.zone" | sed "s/^\(@ [0-9]* IN SOA [^ ]* [^ ]* \)[0-9]* /\1$serial_after /"
        cat "$dir/zone-body"
    } > "$dir/knot-zones/bench.test.zone.new"
    mv "$dir/knot-zones/bench.test.zone.new" "$dir/knot-zones/bench.test.zone"
    reload_started=$(date +%s.%N)
    timeout "$LOAD_TIMEOUT_SECS" knotc -s "$dir/knot/knot.sock" -t "$LOAD_TIMEOUT_SECS" zone-reload "$ORIGIN" > /dev/null
    wait_until "knot does not serve serial $serial_after" "$LOAD_TIMEOUT_SECS" serves_serial "${PORT[knot]}" "$serial_after"
    reload_secs=$(awk -v a="$reload_started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    echo "  knot reloaded the zone file and computed the difference in ${reload_secs}s" >&2
    echo "$size $changed $serial_before $serial_after $reload_secs" >> "$CHANGES"

    echo "size $size: IXFR from serial $serial_before to $serial_after" >&2
    for server in $SERVERS; do
        kdig_transfer "$server" "IXFR=$serial_before" "$dir/ixfr-$server" list
        normalise "$dir/ixfr-$server" ixfr > "$dir/ixfr-$server.sorted"
        rm -f "$dir/ixfr-$server"
    done
    cmp -s "$dir/ixfr-dnsplan.sorted" "$dir/ixfr-knot.sorted" || {
        echo "the two IXFRs differ (dnsplan <, knot >):" >&2
        diff "$dir/ixfr-dnsplan.sorted" "$dir/ixfr-knot.sorted" | head -10 >&2
        exit 1
    }
    deleted=$(grep -v ' SOA ' "$dir/ixfr-knot.sorted" | grep -c '^del ' || true)
    added=$(grep -v ' SOA ' "$dir/ixfr-knot.sorted" | grep -c '^add ' || true)
    echo "  the two IXFRs delete the same $deleted records and add the same $added (besides the SOAs)" >&2
    rm -f "$dir"/ixfr-*.sorted
    for ((round = 1; round <= ROUNDS; round++)); do
        for server in $SERVERS; do transfer "$server" "IXFR=$serial_before" "$size" "$round"; done
    done

    for server in $SERVERS; do stop_tree "${ROOT[$server]}"; done
    PIDS=""
    rm -rf "$dir"
done

echo
echo "transfer benchmark: zone $ORIGIN over TCP with TSIG (hmac-sha256), $ROUNDS rounds (median), servers on core 0, kdig on core 1"
echo "$MACHINE"
echo "$VERSIONS"
awk '
    function median(key,    n, i, j, v, t) {
        n = split(vals[key], v, " ")
        for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    }
    FILENAME ~ /changes$/ { changed[$1] = $2; from[$1] = $3; to[$1] = $4; reload[$1] = $5; next }
    {
        k = $1 SUBSEP $2
        if (!(k in seen)) { seen[k] = 1; order[++rows] = k }
        for (f = 5; f <= 9; f++) vals[k, $3, f] = vals[k, $3, f] " " $f
    }
    END {
        split("wall ms,server CPU ms,bytes,messages,records", label, ",")
        printf "%-9s %-5s %-14s %12s %12s %8s\n", "names", "xfr", "figure", "dnsplan", "knot", "ratio"
        for (r = 1; r <= rows; r++) {
            split(order[r], key, SUBSEP)
            for (f = 5; f <= 9; f++) {
                d = median(order[r] SUBSEP "dnsplan" SUBSEP f); k = median(order[r] SUBSEP "knot" SUBSEP f)
                printf "%-9s %-5s %-14s %12s %12s %8s\n", key[1], key[2], label[f - 4], (f <= 6 ? sprintf("%.1f", d) : d), (f <= 6 ? sprintf("%.1f", k) : k), (k > 0 ? sprintf("%.2f", d / k) : "-")
            }
        }
        print ""
        for (s in changed) printf "IXFR at %s names: %s endpoints changed (1 in '"$CHANGE_EVERY"'), serial %s to %s; knot reloaded its zone file and computed the difference in %ss\n", s, changed[s], from[s], to[s], reload[s]
        print "wall ms: as kdig reports it (query sent to last message read); server CPU ms: the server tree'"'"'s CPU time over the transfer."
        print "ratio: dnsplan'"'"'s median over knot'"'"'s. The two AXFRs, and the two IXFRs, were checked to hold the same records."
    }' "$CHANGES" "$RESULTS"
