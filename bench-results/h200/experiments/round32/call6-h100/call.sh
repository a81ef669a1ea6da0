# Round 32, call 6: the grid selection's phases at 64 CTAs (st2 = select-trace on gselect_p2), and d4's call timelines, decode_r1.
W=b12x-0.1.0-cp310-abi3-linux_x86_64.whl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
R=/tmp/r6; mkdir -p $R
export PYTHONPATH=tools/gpu
python3 -m pip install -q --no-deps --force-reinstall .device/wheels/st2/$W 2>&1 | tail -1
for P in fast exact; do timeout 90 python3 tools/gpu/trace_call.py decode_r1_L131072 --precision $P --calls 5 > $R/trace-$P.txt 2>&1; echo "trace $P rc=$?"; done
python3 -m pip install -q --no-deps --force-reinstall .device/wheels/d4/$W 2>&1 | tail -1
for P in fast exact; do timeout 90 python3 tools/gpu/call_timeline.py decode_r1_L131072 --precision $P --calls 40 > $R/timeline-$P.txt 2>&1; echo "timeline $P rc=$?"; tail -8 $R/timeline-$P.txt; done
tar -C $R -cJf $OUT/call6.tar.xz .
