# Round 32, call 2: the grid selection at 2 (p2) and 1 (p1) logits a thread against d3 (main), decode_r1, 4 rounds; p2's GPU tests.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=/tmp/r2; mkdir -p $R
TESTS="p2" TEST_LIMIT=150 ROUNDS=4 CASES="decode_r1_L131072" RESULTS=$R \
  timeout 540 bash tools/gpu/variants.sh d3=.device/wheels/d3/$W p2=.device/wheels/p2/$W p1=.device/wheels/p1/$W
cp $R/variants.tar.xz $OUT/ 2>/dev/null || tar -C $R -cJf $OUT/variants.tar.xz .
