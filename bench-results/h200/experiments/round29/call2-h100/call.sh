# Round 29 call 2 (H200, from main): the probe (naming each run; a failing run again under
# compute-sanitizer), ncu source counters of the exact decode scorer, then ks / tmpp vs main.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 90 python3 tools/gpu/gather_order_probe.py $OUT/gather_order2.json > $OUT/probe.txt 2>&1
echo probe rc $?; grep -v "^gather_order_probe: [a-z_0-9]*$" $OUT/probe.txt | tail -60
bad=$(grep -o "gather_order_probe: [a-z_0-9]* failed" $OUT/probe.txt | cut -d' ' -f2)
if [ -n "$bad" ]; then
  GATHER_PROBE_ONLY=$bad GATHER_PROBE_REPS=1 timeout 90 compute-sanitizer --tool memcheck \
    python3 tools/gpu/gather_order_probe.py > $OUT/probe-sanitizer.txt 2>&1
  head -40 $OUT/probe-sanitizer.txt
fi
python3 -m pip install -q --no-deps --force-reinstall .device/wheels/d2/$W 2>&1 | tail -1
timeout 150 ncu --clock-control none --kernel-name regex:tma_f16_decode --section SourceCounters \
  --section WarpStateStats --page source --print-source sass --csv \
  python3 tools/gpu/indexer_profile.py --precision exact decode_r64_L32768 > $OUT/ncu-exact-sass.csv 2>&1
echo ncu rc $?; xz -9 $OUT/ncu-exact-sass.csv
TESTS=0 ROUNDS=2 CASES="decode_r64_L32768 decode_r1_L131072" RESULTS=/tmp/r2 \
  timeout 240 bash tools/gpu/variants.sh d2=.device/wheels/d2/$W ks=.device/wheels/ks/$W tmpp=.device/wheels/tmpp/$W 2>&1 | tail -12
cp /tmp/r2/variants.tar.xz $OUT/; ls -la $OUT
