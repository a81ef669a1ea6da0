# Round 34, call 1: d6 (main @ 3f690a4) against e2c (branch exact-2cta: the exact TMA decode scorer
# at the fast one's shape, two CTAs an SM), decode_r64 and decode_r1, 3 interleaved rounds; e2c's indexer GPU tests.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=/tmp/r1; mkdir -p $R
TESTS="e2c" TEST_LIMIT=200 ROUNDS=3 CASES="decode_r64_L32768 decode_r1_L131072" RESULTS=$R/v \
  timeout 480 bash tools/gpu/variants.sh d6=.device/wheels/d6/$W e2c=.device/wheels/e2c/$W
tar -C $R -cJf $OUT/call1.tar.xz .
