# Round 29 first call (from main): the gather's other shapes and the sweep order,
# where the exact decode consumers's time goes, then tm (tensor-map prefetch), tmpp (+ page-table L2 prefetch) and ks (K page as two TMA boxes) vs main on decode.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 60 python3 tools/gpu/gather_order_probe.py $OUT/gather_order2.json 2>&1 | tail -40
python3 -m pip install -q --no-deps --force-reinstall .device/wheels/d2/$W 2>&1 | tail -1
timeout 150 ncu --clock-control none --kernel-name regex:tma_f16_decode --section SourceCounters \
  --section WarpStateStats --page source --print-source sass --csv \
  python3 tools/gpu/indexer_profile.py --precision exact decode_r64_L32768 > $OUT/ncu-exact-sass.csv 2>&1
echo ncu rc $?; xz -9 $OUT/ncu-exact-sass.csv
for pr in exact fast; do
  timeout 60 ncu --clock-control none --kernel-name regex:tma_.*_decode --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active \
    python3 tools/gpu/indexer_profile.py --precision $pr decode_r64_L32768 > $OUT/ncu-$pr-pipes.txt 2>&1
done
grep -h "hmma\|Duration\|Tensor\|Issue Slots" $OUT/ncu-*-pipes.txt
TESTS=0 ROUNDS=2 CASES="decode_r64_L32768 decode_r1_L131072" RESULTS=/tmp/r1 \
  timeout 300 bash tools/gpu/variants.sh d2=.device/wheels/d2/$W tm=.device/wheels/tm/$W tmpp=.device/wheels/tmpp/$W ks=.device/wheels/ks/$W 2>&1 | tail -16

cp /tmp/r1/variants.tar.xz $OUT/; ls -la $OUT
