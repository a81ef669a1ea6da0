# Round 28 call 2: round 25/26 candidates, all three cases.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TEST_LIMIT=120 TESTS="c26" ROUNDS=2 CASES="decode_r64_L32768 decode_r1_L131072 prefill_r4096_L32768" RESULTS=/tmp/r2 \
  timeout 520 bash tools/gpu/variants.sh \
  d2=.device/wheels/d2/$W c25=.device/wheels/c25/$W c26=.device/wheels/c26/$W \
  gs=.device/wheels/gs/$W wc=.device/wheels/wc/$W 2>&1 | tail -40
grep -h -E "passed|failed|FAILED" /tmp/r2/*.log 2>/dev/null | head -20
tar -C /tmp/r2 -cJf $OUT/r2.tar.xz --exclude variants.tar.xz .
