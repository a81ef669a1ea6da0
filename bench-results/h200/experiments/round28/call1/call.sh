# Round 27 call: GPU tests of the segment selection, decode A/B, then call timelines.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TEST_LIMIT=150 TESTS="sg" ROUNDS=2 CASES="decode_r64_L32768 decode_r1_L131072" RESULTS=/tmp/r1 \
  BENCH_ARGS_asc="--page-order ascending" timeout 400 bash tools/gpu/variants.sh \
  d2=.device/wheels/d2/$W sg=.device/wheels/sg/$W \
  asc=.device/wheels/d2/$W po=.device/wheels/po/$W 2>&1 | tail -30
mkdir -p /tmp/r1/tl
for w in d2 sg; do
  python3 -m pip install -q --no-deps --force-reinstall .device/wheels/$w/$W 2>&1 | tail -1
  for p in fast exact; do
    (cd tools/gpu && timeout 40 python3 call_timeline.py --precision $p --calls 20 decode_r64_L32768) \
      > /tmp/r1/tl/$w-$p.txt 2>&1
  done
done
tail -n 12 /tmp/r1/tl/*.txt | cut -c1-150
tar -C /tmp/r1 -cJf $OUT/r1.tar.xz .
