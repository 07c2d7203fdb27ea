#!/usr/bin/env bash
# Health-probe benchmark: N targets (default 5000) checked over HTTP every second, with no
# target hanging and with a share of them (default 10%) accepting and never answering: the
# probes/s of the answering targets and how long a target failing with a 500 takes to be found
# down, side by side with their ratio.
# Usage: bench/probes.sh [TARGETS] [HANGING_PERCENT]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p dnsplan-chaos --bin probes-bench --locked
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)"
exec target/release/probes-bench "$@"
