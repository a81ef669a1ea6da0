#!/usr/bin/env bash
# Benchmark round: every GPU benchmark with its peers, JSON into $OUT.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps --force-reinstall .device/lead/b12x-*.whl 2>&1 | tail -1
timeout 60 b12x bench extract --json $OUT/extract.json
timeout 200 b12x bench indexer --json $OUT/indexer.json
timeout 240 b12x bench allreduce --gpus 2 --json $OUT/allreduce.json
