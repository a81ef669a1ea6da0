# Ran on the warm H200 after call 9, carrying .device/vllm-ops/part-01.xz:
bash bench-results/h200/experiments/round30/final-h200-scripts/callB30.sh
