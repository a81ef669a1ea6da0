# Round 33, call 1: the decode issue window.
# (a) Fast decode_r1's producer and consumer stamps at a window of 16 (tw16 = main's behaviour) and 6 (tw6), 5 eager calls each.
# (b) d5 (main) against windows of 4, 6, 8 pages (dw4, dw6, dw8) and dw6 + page-table L2 prefetch (dw6pt), decode_r1 and decode_r64, 4 rounds; dw6's indexer GPU tests.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=/tmp/r1; mkdir -p $R
export PYTHONPATH=tools/gpu
for T in tw16 tw6; do
  python3 -m pip install -q --no-deps --force-reinstall .device/wheels/$T/$W 2>&1 | tail -1
  timeout 60 python3 tools/gpu/trace_call.py decode_r1_L131072 --precision fast --calls 5 > $R/trace-$T.txt 2>&1; echo "trace $T rc=$?"
  python3 tools/gpu/trace_summary.py $R/trace-$T.txt > $R/trace-$T-summary.txt 2>&1
  grep -A9 "call 4: HP" $R/trace-$T-summary.txt
done
TESTS="dw6" TEST_LIMIT=150 ROUNDS=4 CASES="decode_r1_L131072 decode_r64_L32768" RESULTS=$R/v \
  timeout 440 bash tools/gpu/variants.sh d5=.device/wheels/d5/$W dw4=.device/wheels/dw4/$W dw6=.device/wheels/dw6/$W \
    dw8=.device/wheels/dw8/$W dw6pt=.device/wheels/dw6pt/$W
tar -C $R -cJf $OUT/call1.tar.xz .
