#!/usr/bin/env bash
# Qualification round: doctor, whole test suite, memcheck, demo on 1 and 2 GPUs.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps --force-reinstall .device/lead/b12x-*.whl 2>&1 | tail -1
b12x doctor 2>&1 | tee $OUT/doctor.txt
echo "== pytest (whole suite)"
(cd tests && timeout 330 python3 -m pytest -q -p no:cacheprovider -ra . > $OUT/pytest.txt 2>&1; echo "pytest rc=$?" >> $OUT/pytest.txt)
grep -E "passed|failed|FAILED|^E |rc=" $OUT/pytest.txt | tail -25
echo "== memcheck"
timeout 90 compute-sanitizer --tool memcheck python3 tests/indexer_memcheck_case.py > $OUT/memcheck.txt 2>&1; echo "memcheck rc=$?"; tail -3 $OUT/memcheck.txt
echo "== demo --gpus 1"
timeout 90 b12x demo --gpus 1 2>&1 | tee $OUT/demo_1gpu.txt; echo "demo1 rc=${PIPESTATUS[0]}"
echo "== demo (2 GPUs)"
timeout 120 b12x demo 2>&1 | tee $OUT/demo_2gpu.txt; echo "demo2 rc=${PIPESTATUS[0]}"
