#!/usr/bin/env bash
# Status-poller benchmark: DNS and write latency at N endpoints (default 100000), alone and
# with 8 clients polling /v1/status, side by side with their ratio. The authority is the
# release binary, in a process of its own; AUTHORITY=path runs another build of it instead
# (to compare two commits on the same machine).
# Usage: bench/status.sh [ENDPOINTS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p dnsplan-chaos --bin status-bench -p dnsplan-authority --bin dnsplan-authority
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)"
exec target/release/status-bench "${AUTHORITY:-target/release/dnsplan-authority}" "$@"
