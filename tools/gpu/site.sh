# The carried Python packages on a GPU host: `source tools/gpu/site.sh` (after common.sh).
# Unpacks what was built here into .device/site, once per bundle, and puts that
# folder on PYTHONPATH in front of the host's site-packages:
#   .device/deepgemm  (tools/gpu/deepgemm_peer.py pack): DeepGEMM as `deep_gemm`
#   .device/vllm      (tools/gpu/vllm_bundle.py build): vLLM's Python tree and wheels;
#                     only with VLLM=1
# A bundle that was not carried is left out, and says so. DeepGEMM JIT-compiles its
# kernels with the host's nvcc: CUDA_HOME names the toolkit (from nvcc on PATH, else
# /usr/local/cuda) and DG_JIT_CACHE_DIR keeps what it compiled in .device/deepgemm-jit.
SITE=$PWD/.device/site
if [ -f .device/deepgemm/deep_gemm.json ]; then
  python3 tools/gpu/deepgemm_peer.py unpack --site "$SITE"
else
  echo "site.sh: no DeepGEMM peer carried (.device/deepgemm): its bench arms skip"
fi
if [ "${VLLM:-0}" = 1 ]; then
  if [ -f .device/vllm/vllm_bundle.json ]; then
    python3 tools/gpu/vllm_bundle.py install --site "$SITE"
  else
    echo "site.sh: no vLLM bundle carried (.device/vllm): build it with tools/gpu/vllm_bundle.py build"
  fi
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
if [ -z "${CUDA_HOME:-}" ]; then
  if command -v nvcc >/dev/null 2>&1; then
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  elif [ -x /usr/local/cuda/bin/nvcc ]; then
    CUDA_HOME=/usr/local/cuda
  fi
fi
export CUDA_HOME=${CUDA_HOME:-}
export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-$PWD/.device/deepgemm-jit}
echo "site.sh: PYTHONPATH=$PYTHONPATH CUDA_HOME=${CUDA_HOME:-unset} DG_JIT_CACHE_DIR=$DG_JIT_CACHE_DIR"
