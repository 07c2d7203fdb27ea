#!/usr/bin/env bash
# Store benchmark: fenced applies/s (flushed per apply), publishes/s, and cleanup with many
# stored plans, each beside a raw sled insert+flush baseline from the same run.
# Usage: bench/store.sh [PLANS_FOR_CLEANUP]   (default 100000)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p dnsplan-tests --bin store-bench
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)"
exec target/release/store-bench "$@"
