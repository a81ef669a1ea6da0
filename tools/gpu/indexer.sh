#!/usr/bin/env bash
# The indexer round: its GPU tests, memcheck, the benchmark (FLAVOR_ARMS: extra b12x
# arms, default f16) and one ncu pass over every kernel of each benchmark case.
#   tools/gpu/indexer.sh [WHEEL]
# The bench's stock vLLM peer comes from .device/deepgemm when carried (see bench.sh).
source "$(dirname "$0")/common.sh" "$@"
# with the vLLM bundle and op library where carried: vLLM's own top-k then runs live
VLLM=${VLLM:-1} source tools/gpu/site.sh
TAIL=12 step pytest_indexer 240 bash -c \
  'cd tests && python3 -m pytest -q -p no:cacheprovider -ra indexer'
step memcheck 120 compute-sanitizer --tool memcheck python3 tests/indexer/indexer_memcheck_case.py
TAIL=40 step bench_indexer 480 b12x bench indexer --flavor-arms "${FLAVOR_ARMS:-f16}" \
  --json "$RESULTS/indexer.json"
step ncu 150 ncu --clock-control none --kernel-name regex:b12x_indexer \
  --section SpeedOfLight --section Occupancy --section LaunchStats \
  python3 tools/gpu/indexer_profile.py
grep -E "b12x_indexer|Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per" \
  "$RESULTS/ncu.txt" | head -60
