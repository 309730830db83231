#!/usr/bin/env bash
# Launch benchmark: propio-sandbox run -- clock (network open, allowlist warm
# and cold) against docker run --rm, the
# same image and command, interleaved. Needs a running Docker engine; pulls
# nothing. Usage: bench/run.sh [N]   (N measured launches per arm, default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
case $n in
  '' | *[!0-9]* | 0) echo "usage: $0 [N]   (N a positive number of launches per arm)" >&2; exit 2 ;;
esac
PROPIO_BENCH=1 PROPIO_BENCH_N=$n exec go test ./bench -run '^TestLaunchRatio$' -count=1 -v -timeout 30m
