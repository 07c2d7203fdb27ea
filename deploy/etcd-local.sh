#!/usr/bin/env bash
# dnsplan on etcd on one machine, without Docker: a three-member etcd cluster, two authorities
# following it, the planner, three enactors (zones a, b, c) and three demo backends, all on
# loopback from built binaries. Waits until both authorities answer with the same SOA serial
# over DNS, prints how to query them, and stops everything on Ctrl-C or after --for seconds.
# Linux: the demo backends listen on 127.0.0.11-13.
#
#   cargo build --release -p dnsplan-authority -p dnsplan-planner -p dnsplan-enactor -p dnsplan-cli
#   deploy/etcd-local.sh
#
# `--check` starts everything, waits for the same serial on both authorities, stops
# everything and exits 0 (1 if they did not agree in time): what cli/tests/etcd_local.rs runs.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: deploy/etcd-local.sh [options]
  --bin-dir DIR          the built binaries (default: target/release of this repository)
  --dir DIR              configs, logs and data (default: a new temporary directory); run
                         again with the same DIR to restart on the data kept there
  --etcd-ports LIST      client,peer ports of the three members (default 2379,2380,22379,22380,32379,32380)
  --dns-ports LIST       DNS ports of the two authorities (default 5353,5354)
  --control-ports LIST   control API ports of the two authorities (default 8053,8054)
  --backend-ports LIST   the demo backends' HTTP and TCP ports (default 18080,15432)
  --for SECS             stop after this long (default 3600)
  --ready-timeout SECS   most time for both authorities to agree (default 60)
  --check                stop as soon as both authorities answer the same SOA serial
EOF
}

repo=$(cd "$(dirname "$0")/.." && pwd)
bin_dir="$repo/target/release"
dir=""
etcd_ports=2379,2380,22379,22380,32379,32380
dns_ports=5353,5354
control_ports=8053,8054
backend_ports=18080,15432
run_secs=3600
ready_secs=60
check=false
while (($#)); do
  case "$1" in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --etcd-ports) etcd_ports=$2; shift 2 ;;
    --dns-ports) dns_ports=$2; shift 2 ;;
    --control-ports) control_ports=$2; shift 2 ;;
    --backend-ports) backend_ports=$2; shift 2 ;;
    --for) run_secs=$2; shift 2 ;;
    --ready-timeout) ready_secs=$2; shift 2 ;;
    --check) check=true; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

die() { echo "error: $*" >&2; exit 1; }
IFS=, read -r -a etcd_port <<<"$etcd_ports"
IFS=, read -r -a dns_port <<<"$dns_ports"
IFS=, read -r -a control_port <<<"$control_ports"
IFS=, read -r -a backend_port <<<"$backend_ports"
((${#etcd_port[@]} == 6)) || die "--etcd-ports: give six ports, client,peer for each of three members"
((${#dns_port[@]} == 2)) || die "--dns-ports: give two ports, one per authority"
((${#control_port[@]} == 2)) || die "--control-ports: give two ports, one per authority"
((${#backend_port[@]} == 2)) || die "--backend-ports: give two ports, HTTP and TCP"
for p in "${etcd_port[@]}" "${dns_port[@]}" "${control_port[@]}" "${backend_port[@]}" "$run_secs" "$ready_secs"; do
  [[ $p =~ ^[0-9]+$ ]] || die "$p is not a number"
done

for b in dnsplan-authority dnsplan-planner dnsplan-enactor dnsplan; do
  [[ -x "$bin_dir/$b" ]] || die "$bin_dir/$b is missing; build it first:
  cargo build --release -p dnsplan-authority -p dnsplan-planner -p dnsplan-enactor -p dnsplan-cli
or give --bin-dir"
done
command -v etcd >/dev/null || die "etcd is not on PATH; install it (Debian: apt-get install etcd-server)"
command -v dig >/dev/null || die "dig is not on PATH; install it (Debian: apt-get install dnsutils)"

if [[ -z $dir ]]; then
  dir=$(mktemp -d "${TMPDIR:-/tmp}/dnsplan-etcd-local.XXXXXX")
fi
mkdir -p "$dir/logs"
dir=$(cd "$dir" && pwd)
# The authorities' control API needs a token; a fresh one unless the caller set one.
DNSPLAN_TOKEN=${DNSPLAN_TOKEN:-$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')}
export DNSPLAN_TOKEN

# Every process started here, in start order, with its name; stopped in reverse order.
pids=()
names=()
timer=""
start() {
  local name=$1
  shift
  "$@" </dev/null >>"$dir/logs/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
}

# SIGTERM to the processes given, then SIGKILL to whatever is left after 10 s (each daemon
# stops on SIGTERM within a few seconds).
stop() {
  local pid tries alive
  for pid in "$@"; do
    kill -TERM "$pid" 2>/dev/null
  done
  for ((tries = 0; tries < 100; tries++)); do
    alive=0
    for pid in "$@"; do
      kill -0 "$pid" 2>/dev/null && alive=1
    done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "$@"; do
    kill -KILL "$pid" 2>/dev/null
  done
}

# The daemons first, while etcd still answers (the planner gives its lease back), then etcd.
stop_all() {
  set +e
  [[ -n $timer ]] && kill "$timer" 2>/dev/null
  ((${#pids[@]} > 3)) && stop "${pids[@]:3}"
  ((${#pids[@]})) && stop "${pids[@]:0:3}"
  wait 2>/dev/null
  echo "stopped; configs, logs and data are in $dir"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The last lines of the log of every process that has exited.
report_exited() {
  local i
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[i]}" 2>/dev/null; then
      echo "${names[i]} exited; the end of $dir/logs/${names[i]}.log:" >&2
      tail -n 15 "$dir/logs/${names[i]}.log" >&2
    fi
  done
}

# etcd: three members of one static cluster.
client_urls=()
initial=""
for m in 1 2 3; do
  client_urls+=("http://127.0.0.1:${etcd_port[2 * (m - 1)]}")
  initial+="${initial:+,}etcd-$m=http://127.0.0.1:${etcd_port[2 * (m - 1) + 1]}"
done
for m in 1 2 3; do
  client=${client_urls[m - 1]}
  peer="http://127.0.0.1:${etcd_port[2 * (m - 1) + 1]}"
  start "etcd-$m" etcd --name "etcd-$m" --data-dir "$dir/etcd-$m" \
    --listen-client-urls "$client" --advertise-client-urls "$client" \
    --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
    --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token dnsplan-local
done
endpoints=$(printf '"%s", ' "${client_urls[@]}")
endpoints="[${endpoints%, }]"

# Until `condition` succeeds, at most `secs` seconds; fails early when a process exits.
wait_for() {
  local what=$1 secs=$2 condition=$3
  local deadline=$((SECONDS + secs))
  until $condition; do
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || { report_exited; die "a process exited while waiting for $what"; }
    done
    ((SECONDS < deadline)) || { echo "error: no $what within $secs s; logs in $dir/logs" >&2; return 1; }
    sleep 0.2
  done
}
# GET http://host:port/path with bash alone (no curl needed), within a second.
http_get() {
  local hostport=${1#http://}
  local path=/${hostport#*/}
  hostport=${hostport%%/*}
  timeout 1 bash -c 'exec 3<>"/dev/tcp/${1%:*}/${1##*:}" && printf "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" "$2" "$1" >&3 && cat <&3' \
    _ "$hostport" "$path" 2>/dev/null || true
}
etcd_healthy() {
  local url
  for url in "${client_urls[@]}"; do
    [[ $(http_get "$url/health") == *'"health":"true"'* ]] || return 1
  done
}
wait_for "healthy etcd cluster" 30 etcd_healthy

store="[store]
kind = \"etcd\"
endpoints = $endpoints
prefix = \"/dnsplan/\""

for a in 1 2; do
  cat >"$dir/authority-$a.toml" <<EOF
# authority-$a of deploy/etcd-local.sh; its saved state is authority-$a/served-state.
data_dir = "authority-$a"
$store
[dns]
listen = ["127.0.0.1:${dns_port[a - 1]}"]
[control]
listen = "127.0.0.1:${control_port[a - 1]}"
[dns_zone]
origin = "example.test."
ns = ["ns1.example.test.", "ns2.example.test."]
[dns_zone.soa]
mname = "ns1.example.test."
rname = "hostmaster.example.test."
ttl_secs = 300
minimum_secs = 30
EOF
  start "authority-$a" "$bin_dir/dnsplan-authority" --config "$dir/authority-$a.toml"
done

cat >"$dir/planner.toml" <<EOF
# The planner of deploy/etcd-local.sh, checking the demo backends on 127.0.0.11-13.
id = "planner-1"
dns_zone = "example.test."
$store
[planner]
decide_interval_ms = 500
lease_ttl_ms = 5000
[policy]
zone_recovery_dwell_secs = 30
[metrics]
listen = "127.0.0.1:0"

[[endpoint]]
name = "api.example.test."
ttl_secs = 30
check = { kind = "http", port = ${backend_port[0]}, path = "/healthz", body_contains = "ok", interval_ms = 500, timeout_ms = 300 }
[[endpoint.target]]
address = "127.0.0.11"
zone = "a"
[[endpoint.target]]
address = "127.0.0.12"
zone = "b"
[[endpoint.target]]
address = "127.0.0.13"
zone = "c"

[[endpoint]]
name = "db.example.test."
ttl_secs = 10
check = { kind = "tcp", port = ${backend_port[1]}, interval_ms = 500, timeout_ms = 300 }
[[endpoint.target]]
address = "127.0.0.11"
zone = "a"
[[endpoint.target]]
address = "127.0.0.12"
zone = "b"
[[endpoint.target]]
address = "127.0.0.13"
zone = "c"
EOF
cat >"$dir/enactor.toml" <<EOF
# The enactors of deploy/etcd-local.sh; each gets --id and --zone. They check authority-1.
id = "enactor"
zone = "a"
$store
[verify]
enabled = true
dns_server = "127.0.0.1:${dns_port[0]}"
[metrics]
listen = "127.0.0.1:0"
EOF

for backend in a:11 b:12 c:13; do
  z=${backend%:*}
  address=127.0.0.${backend#*:}
  start "backend-$z" "$bin_dir/dnsplan" demo-backend --http "$address:${backend_port[0]}" --tcp "$address:${backend_port[1]}"
done
start planner "$bin_dir/dnsplan-planner" --config "$dir/planner.toml"
for z in a b c; do
  start "enactor-$z" "$bin_dir/dnsplan-enactor" --config "$dir/enactor.toml" --id "enactor-$z" --zone "$z"
done

# What authority `a` serves: its SOA serial and api.example.test's addresses, on one line.
served() {
  local port=${dns_port[$1 - 1]} soa api
  soa=$( (dig +short +time=1 +tries=1 @127.0.0.1 -p "$port" example.test SOA 2>/dev/null || true) | awk 'NR == 1 { print $3 }')
  api=$( (dig +short +time=1 +tries=1 @127.0.0.1 -p "$port" api.example.test A 2>/dev/null || true) | sort | paste -sd ' ')
  echo "serial ${soa:-none} api ${api:-none}"
}
serial=""
agree() {
  local one two
  one=$(served 1)
  two=$(served 2)
  # A plan applied (serial above 0, api answered) and the same on both.
  [[ $one == "$two" && $one != "serial none"* && $one != "serial 0 "* && $one != *"api none" ]] || return 1
  serial=$(awk '{ print $2 }' <<<"$one")
}
if ! wait_for "same SOA serial on both authorities" "$ready_secs" agree; then
  echo "authority-1: $(served 1)" >&2
  echo "authority-2: $(served 2)" >&2
  exit 1
fi
echo "ready: both authorities serve serial $serial ($(served 1 | cut -d' ' -f3-))"

if $check; then
  echo "check passed"
  exit 0
fi

etcd_pids="${pids[0]} ${pids[1]} ${pids[2]}"
cat <<EOF

dnsplan on etcd, on loopback; configs, logs (logs/) and data in $dir
  etcd members   ${client_urls[*]} (pids $etcd_pids)
  authority-1    DNS 127.0.0.1:${dns_port[0]}, control http://127.0.0.1:${control_port[0]}
  authority-2    DNS 127.0.0.1:${dns_port[1]}, control http://127.0.0.1:${control_port[1]}
  planner-1, enactor-a/b/c on etcd; demo backends on 127.0.0.11-13
  control token  DNSPLAN_TOKEN=$DNSPLAN_TOKEN

Both answer alike, with the same SOA serial:
  dig @127.0.0.1 -p ${dns_port[0]} example.test SOA +short; dig @127.0.0.1 -p ${dns_port[1]} example.test SOA +short
  dig @127.0.0.1 -p ${dns_port[0]} api.example.test A +short; dig @127.0.0.1 -p ${dns_port[1]} api.example.test A +short
Take etcd away and both keep serving their last state (kept in $dir/authority-N/served-state):
  kill $etcd_pids
Stopping everything on Ctrl-C, or after $run_secs s.
EOF

# Nothing is restarted here: a process that exits (an etcd member you killed) stays down.
sleep "$run_secs" &
timer=$!
wait "$timer" || true
echo "$run_secs s are up"
