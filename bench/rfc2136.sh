#!/usr/bin/env bash
# RFC 2136 benchmark: a change of N names (default 1000) enacted by three enactors onto a real
# Knot, BIND 9 and PowerDNS (Debian packages knot, bind9, pdns-server, pdns-backend-sqlite3,
# sqlite3), one after the other: the time until every write is acknowledged, and the UPDATEs
# sent by outcome.
# Usage: bench/rfc2136.sh [NAMES]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p dnsplan-chaos --bin rfc2136-bench --locked
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)"
exec target/release/rfc2136-bench "$@"
