#!/usr/bin/env bash
# Control-plane benchmark: an N-endpoint plan (default 10000) enacted by three enactors,
# embedded and through the control API; a 1% change; publish-to-served latency over DNS.
# Then the same on etcd, in the same run: a three-member etcd cluster on loopback (data on
# disk, or in /dev/shm with --etcd-in-memory), the enactors on etcd directly, and
# publish-to-served on each of two authorities following it. The cluster and the authorities
# are stopped at the end. --no-etcd leaves etcd out (it needs Debian's etcd-server).
# --etcd-max-txn-ops=N starts etcd with --max-txn-ops N (default 128) and has the enactors use it.
# RUST_LOG (e.g. dnsplan_enactor=debug,dnsplan_etcd=trace) prints the in-process enactors',
# authorities' and stores' logs on stderr; dnsplan_etcd=trace times every etcd call.
# --full-only=RUNS times only the full plan, embedded, RUNS times on a new store each (with
# the baseline), to see the spread of that one figure.
# --dnssec has the authority behind the control API sign the zone, so publish-to-served
# includes signing what each change touches.
# Usage: bench/plans.sh [--no-etcd] [--etcd-in-memory] [--etcd-max-txn-ops=N] [--full-only=RUNS] [--dnssec] [ENDPOINTS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p dnsplan-chaos --bin plans-bench --locked
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)"
exec target/release/plans-bench "$@"
