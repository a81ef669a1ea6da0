# Round 32, call 1: skv (select-key-values) against d3 (main), decode cases, 3 rounds; skv's GPU tests.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=/tmp/r1; mkdir -p $R
TESTS="skv" TEST_LIMIT=150 ROUNDS=3 CASES="decode_r64_L32768 decode_r1_L131072" RESULTS=$R \
  timeout 520 bash tools/gpu/variants.sh d3=.device/wheels/d3/$W skv=.device/wheels/skv/$W
cp $R/variants.tar.xz $OUT/ 2>/dev/null || tar -C $R -cJf $OUT/variants.tar.xz .
