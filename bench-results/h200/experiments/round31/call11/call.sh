# Ran on the warm H200 after call 10, carrying .device/vllm-ops/part-02.xz (WHEEL unset: d3,
# main @ 4eeaa44, whose kernels are main's now). Its indexer.json, vllm_real.txt and
# vllm_ops.json are copied to bench-results/h200/.
bash bench-results/h200/experiments/round30/final-h200-scripts/callC30.sh
