#!/usr/bin/env bash
# Round 37: select_cluster's phases in decode_r64 calls (diagnostic wheel `tr`,
# branch sel-trace), fast and exact, L2 flushed before each eager call.
#   RESULTS=... bash bench-results/h200/experiments/round37/trace_r64.sh WHEEL
source "$(dirname "$0")/../../../../tools/gpu/common.sh" "${1:?WHEEL}"
cd tools/gpu
for prec in fast exact; do
  timeout 120 python3 trace_call.py decode_r64_L32768 --precision $prec --calls 5 >"$RESULTS/trace_$prec.txt" 2>&1
  echo "== $prec rc=$?"
  python3 trace_summary.py "$RESULTS/trace_$prec.txt" | tail -34
done
