# Round 33, call 1: decode_r1's start-up and selection entry. Candidates against d5 (main) on decode_r1 and decode_r64, 3 rounds:
# issue windows of 4, 6, 8 pages (dw4, dw6, dw8), dw6 + L2 prefetch of the inputs (dw6pt), the selections' early lengths read (el),
# two producer warps a decode CTA (dp); dw6's and dp's indexer GPU tests.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
R=/tmp/r1; mkdir -p $R
TESTS="dw6 dp" TEST_LIMIT=150 ROUNDS=3 CASES="decode_r1_L131072 decode_r64_L32768" RESULTS=$R \
  timeout 560 bash tools/gpu/variants.sh d5=.device/wheels/d5/$W dw4=.device/wheels/dw4/$W dw6=.device/wheels/dw6/$W \
    dw8=.device/wheels/dw8/$W dw6pt=.device/wheels/dw6pt/$W el=.device/wheels/el/$W dp=.device/wheels/dp/$W
tar -C $R -cJf $OUT/call1.tar.xz .
