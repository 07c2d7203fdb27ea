#!/usr/bin/env bash
# Control-plane benchmark: an N-endpoint plan (default 10000) enacted by three enactors,
# embedded and through the control API; a 1% change; publish-to-served latency over DNS.
# Usage: bench/plans.sh [ENDPOINTS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p dnsplan-chaos --bin plans-bench
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)"
exec target/release/plans-bench "$@"
