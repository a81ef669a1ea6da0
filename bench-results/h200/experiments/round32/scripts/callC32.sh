# Round 32 final, call C (carries part-02): the bench with stock vLLM live, then tests/vllm_real on vLLM's CUDA platform.
W=.device/wheels/${WHEEL:-d4}/b12x-0.1.0-cp310-abi3-linux_x86_64.whl
R=/tmp/rC
nvidia-smi --query-gpu=name --format=csv,noheader; ls .device/vllm-ops/
RESULTS=$R bash -c "source tools/gpu/common.sh $W; VLLM=1 source tools/gpu/site.sh > \$RESULTS/site.txt 2>&1; tail -4 \$RESULTS/site.txt; TAIL=34 step bench_indexer 330 b12x bench indexer --no-torch --json \$RESULTS/indexer.json"
cp $R/indexer.json $OUT/indexer.json
RESULTS=$R timeout 230 bash tools/gpu/vllm_real.sh 2>&1 | tail -14
tar -C $R -cJf $OUT/callC.tar.xz .
