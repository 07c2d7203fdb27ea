#!/usr/bin/env bash
# What signed plans cost: signing a plan of N endpoints (default 1000000) as a planner does and
# verifying it as enactors and authorities with a keyring do, beside encoding and decoding the
# same plan (what every store and follower does anyway) in the same run.
# Usage: bench/signing.sh [ENDPOINTS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p dnsplan-chaos --bin sign-bench --locked
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)"
exec target/release/sign-bench "$@"
