# Round 32, call A (carries DeepGEMM, the vLLM bundle, the wheel, vllm_ops.json, part-00 and this folder).
# H200: the landed tree's final bench with DeepGEMM live (vLLM's top-k from the stored H200 figures;
# calls B and C then bring vLLM's op library), the clock probe, the indexer GPU tests.
# Any other card: stop with DIAG=0, else the clock probe (and with NCU_PREFILL=1 ncu's stall reasons of the prefill scorers).
W=.device/wheels/${WHEEL:-d4}/b12x-0.1.0-cp310-abi3-linux_x86_64.whl
R=/tmp/rA
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
export RESULTS=$R CARD NCU NCU_PREFILL=${NCU_PREFILL:-} DIAG=${DIAG:-0}
bash -c '
source tools/gpu/common.sh '"$W"'
case "$CARD" in
*H200*)
  source tools/gpu/site.sh > $RESULTS/site.txt 2>&1; tail -2 $RESULTS/site.txt
  TAIL=34 step bench_indexer 300 b12x bench indexer --no-torch --json $RESULTS/indexer.json
  TAIL=3 step test_indexer 200 bash -c "cd tests && python3 -m pytest -q -p no:cacheprovider -ra indexer"
  ;;
*)
  [ "${DIAG:-1}" = 0 ] && { echo "not an H200: stop"; exit 0; }
  TAIL=4 step clocks 60 python3 tools/gpu/clock_probe.py --json $RESULTS/clocks.json
  [ -n "${NCU_PREFILL:-}" ] && for P in exact fast; do
    TAIL=2 step ncu_$P 120 $NCU --clock-control none --kernel-name regex:b12x_indexer_tma.*prefill \
      --section SpeedOfLight --section WarpStateStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum" \
      python3 tools/gpu/indexer_profile.py --precision $P prefill_r4096_L32768
  done
  ;;
esac'
mkdir -p $R; [ -f $R/indexer.json ] && cp $R/indexer.json $OUT/indexer.json
tar -C $R -cJf $OUT/callA.tar.xz .
