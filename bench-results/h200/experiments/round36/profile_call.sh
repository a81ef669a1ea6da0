#!/usr/bin/env bash
# Round 36's device call: on an H200 the final run's bench step; on any other
# card, one ncu pass of stall sampling over the exact and fast TMA decode
# scorers on decode_r64 (main's kernels, wheel d6), the SASS source page as CSV.
#   bash bench-results/h200/experiments/round36/profile_call.sh
set -u
W=.device/wheels/d6/b12x-0.1.0-cp310-abi3-linux_x86_64.whl
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$NAME"
if [[ "$NAME" == *H200* ]]; then
  RESULTS=$OUT/fb exec bash tools/gpu/final_run.sh bench "$W"
fi
source tools/gpu/common.sh "$W"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >"$OUT/card.txt"
for p in exact fast; do
  k=$([ $p = exact ] && echo f16 || echo fp8)
  timeout 150 ncu --clock-control none --launch-count 1 \
    --kernel-name "regex:b12x_indexer_tma_${k}_decode_h64" \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section SourceCounters --import-source no -o "/tmp/$p" \
    python3 tools/gpu/indexer_profile.py --precision $p decode_r64_L32768 >"/tmp/log_$p.txt" 2>&1
  echo "$p ncu rc=$?"
  tail -3 "/tmp/log_$p.txt"
  ncu -i "/tmp/$p.ncu-rep" --page details >"$OUT/${p}_details.txt" 2>&1
  ncu -i "/tmp/$p.ncu-rep" --page source --csv --print-source sass >"$OUT/${p}_sass.csv" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issued Warp Per|No Eligible|DRAM Throughput" "$OUT/${p}_details.txt" | head -8
done
tar -C /tmp -cJf "$OUT/reps.tar.xz" exact.ncu-rep fast.ncu-rep log_exact.txt log_fast.txt
ls -la "$OUT"
