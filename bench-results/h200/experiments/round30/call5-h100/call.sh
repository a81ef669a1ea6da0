# Round 30 call 5 (an H100, warm after call 4, which carried .device/deepgemm and the d3 wheel):
#   call 5a carried .device/vllm, .device/vllm-ops/vllm_ops.json and part-00.xz and ran 'ls';
#   call 5b carried part-01.xz and ran 'ls';
#   call 5c carried part-02.xz and ran the final bench's call C script, kept in
#   ../final-h200-scripts/callC30.sh (the run's copy was .device/s30/callC30.sh):
bash .device/s30/callC30.sh
