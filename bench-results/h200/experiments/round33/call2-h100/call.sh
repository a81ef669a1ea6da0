# Round 33, call 2: fast decode_r1's producer and consumer stamps at a window of 16 (tw16 = main's behaviour) and 6 (tw6), 5 eager calls each;
# then d5 against dw6el (window + early lengths), dw6eldp (+ two producer warps), d2c (fast decode at two CTAs an SM)
# and sk (the selections' level 0 skips keys below a bound), decode_r1 and decode_r64, 3 rounds; dw6eldp's, d2c's and sk's indexer GPU tests.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=/tmp/r2; mkdir -p $R
export PYTHONPATH=tools/gpu
for T in tw16 tw6; do
  python3 -m pip install -q --no-deps --force-reinstall .device/wheels/$T/$W 2>&1 | tail -1
  timeout 60 python3 tools/gpu/trace_call.py decode_r1_L131072 --precision fast --calls 5 > $R/trace-$T.txt 2>&1; echo "trace $T rc=$?"
  python3 tools/gpu/trace_summary.py $R/trace-$T.txt > $R/trace-$T-summary.txt 2>&1
  grep -A9 "call 4: HP" $R/trace-$T-summary.txt
done
TESTS="dw6eldp d2c sk" TEST_LIMIT=150 ROUNDS=3 CASES="decode_r1_L131072 decode_r64_L32768" RESULTS=$R/v \
  timeout 480 bash tools/gpu/variants.sh d5=.device/wheels/d5/$W dw6el=.device/wheels/dw6el/$W \
    dw6eldp=.device/wheels/dw6eldp/$W d2c=.device/wheels/d2c/$W sk=.device/wheels/sk/$W
tar -C $R -cJf $OUT/call2.tar.xz .
